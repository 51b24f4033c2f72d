#include "text/jinja_parser.h"

#include "text/jinja_builtins.h"
#include "text/jinja_parser_impl.h"

namespace duet::jinja {

std::string Parser::parse_body(const std::set<std::string>& ends, Body* body) {
  for (;;) {
    switch (cur().type) {
      case Tok::kEof:
        return "";
      case Tok::kData: {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kData;
        s->line = cur().line;
        s->text = t_[p_++].text;
        body->push_back(std::move(s));
        break;
      }
      case Tok::kVarBegin: {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = cur().line;
        s->expr = parse_tuple_or_expression();
        expect(Tok::kVarEnd, "'}}'");
        body->push_back(std::move(s));
        break;
      }
      case Tok::kBlockBegin: {
        if (peek().type == Tok::kName && ends.count(peek().text)) {
          p_ += 2;
          return t_[p_ - 1].text;
        }
        parse_statement(body);
        break;
      }
      default:
        fail("unexpected token" + got());
    }
  }
}

void Parser::parse_statement(Body* body) {
  ++p_;  // {%
  const std::string keyword = expect_name();
  if (keyword == "if") {
    body->push_back(parse_if());
  } else if (keyword == "for") {
    body->push_back(parse_for());
  } else if (keyword == "set") {
    body->push_back(parse_set());
  } else if (keyword == "macro") {
    body->push_back(parse_macro());
  } else if (keyword == "break" || keyword == "continue") {
    auto s = std::make_unique<Stmt>();
    s->kind = keyword == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    s->line = cur().line;
    expect(Tok::kBlockEnd, "'%}'");
    body->push_back(std::move(s));
  } else if (keyword == "generation") {
    // Hugging Face's {% generation %} only marks assistant text for masks: render its body.
    expect(Tok::kBlockEnd, "'%}'");
    expect_end({"endgeneration"}, body, "endgeneration");
    expect(Tok::kBlockEnd, "'%}'");
  } else {
    --p_;
    fail("unsupported Jinja statement '" + keyword + "'");
  }
}

StmtPtr Parser::parse_if() {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kIf;
  s->line = cur().line;
  for (;;) {
    ExprPtr cond = parse_tuple_or_expression();
    expect(Tok::kBlockEnd, "'%}'");
    Body body;
    std::string end = parse_body({"elif", "else", "endif"}, &body);
    if (end.empty()) fail("missing '{% endif %}'");
    s->branches.emplace_back(std::move(cond), std::move(body));
    if (end == "elif") continue;
    if (end == "else") {
      expect(Tok::kBlockEnd, "'%}'");
      expect_end({"endif"}, &s->else_body, "endif");
    }
    expect(Tok::kBlockEnd, "'%}'");
    return s;
  }
}

StmtPtr Parser::parse_for() {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kFor;
  s->line = cur().line;
  const bool paren = at_op("(");
  if (paren) ++p_;
  s->targets.push_back(expect_name());
  while (at_op(",")) {
    ++p_;
    s->targets.push_back(expect_name());
  }
  if (paren) expect_op(")");
  if (!at_name("in")) fail("expected 'in'" + got());
  ++p_;
  s->expr = parse_expression(/*with_condexpr=*/false);
  if (at_name("if")) {
    ++p_;
    s->condition = parse_expression(false);
  }
  if (at_name("recursive")) fail("unsupported Jinja construct 'recursive' loop");
  expect(Tok::kBlockEnd, "'%}'");
  const std::string end = parse_body({"else", "endfor"}, &s->body);
  if (end.empty()) fail("missing '{% endfor %}'");
  if (end == "else") {
    expect(Tok::kBlockEnd, "'%}'");
    expect_end({"endfor"}, &s->else_body, "endfor");
  }
  expect(Tok::kBlockEnd, "'%}'");
  return s;
}

StmtPtr Parser::parse_set() {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kSet;
  s->line = cur().line;
  s->targets.push_back(expect_name());
  if (at_op(".")) {
    ++p_;
    s->targets.push_back(expect_name());
    s->attribute_target = true;
  } else {
    while (at_op(",")) {
      ++p_;
      s->targets.push_back(expect_name());
    }
  }
  if (at_op("=")) {
    ++p_;
    s->expr = parse_tuple_or_expression();
    expect(Tok::kBlockEnd, "'%}'");
    return s;
  }
  if (s->targets.size() != 1) fail("expected '='" + got());
  expect(Tok::kBlockEnd, "'%}'");
  s->kind = StmtKind::kSetBlock;
  expect_end({"endset"}, &s->body, "endset");
  expect(Tok::kBlockEnd, "'%}'");
  return s;
}

StmtPtr Parser::parse_macro() {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kMacro;
  s->line = cur().line;
  s->text = expect_name();
  macros_.insert(s->text);
  expect_op("(");
  while (!at_op(")")) {
    std::string name = expect_name();
    ExprPtr def;
    if (at_op("=")) {
      ++p_;
      def = parse_expression();
    }
    s->params.emplace_back(std::move(name), std::move(def));
    if (!at_op(",")) break;
    ++p_;
  }
  expect_op(")");
  expect(Tok::kBlockEnd, "'%}'");
  expect_end({"endmacro"}, &s->body, "endmacro");
  if (cur().type == Tok::kName) ++p_;  // {% endmacro name %}
  expect(Tok::kBlockEnd, "'%}'");
  return s;
}

Body parse_template(std::string_view source) {
  return Parser(lex(source)).parse();
}

}  // namespace duet::jinja
