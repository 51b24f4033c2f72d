// Expressions, with Jinja2's precedence (lowest first): conditional, or, and, not, comparisons
// (chained), + -, ~, * / // %, **, unary + -, then postfix (attribute, subscript, slice, call),
// filters and tests.
#include "text/jinja_builtins.h"
#include "text/jinja_parser_impl.h"

namespace duet::jinja {

ExprPtr Parser::parse_tuple_or_expression() {
  ExprPtr first = parse_expression();
  if (!at_op(",")) return first;
  ExprPtr tuple = node(ExprKind::kTuple);
  tuple->children.push_back(std::move(first));
  while (at_op(",")) {
    ++p_;
    if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || at_op(")")) break;
    tuple->children.push_back(parse_expression());
  }
  return tuple;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  ExprPtr e = parse_or();
  if (!with_condexpr) return e;
  while (at_name("if")) {
    ++p_;
    ExprPtr cond = node(ExprKind::kCond);
    ExprPtr test = parse_or();
    ExprPtr otherwise;
    if (at_name("else")) {
      ++p_;
      otherwise = parse_expression();
    }
    cond->children.push_back(std::move(e));
    cond->children.push_back(std::move(test));
    cond->children.push_back(std::move(otherwise));
    e = std::move(cond);
  }
  return e;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (at_name("or")) {
    ExprPtr e = node(ExprKind::kOr);
    ++p_;
    e->children.push_back(std::move(left));
    e->children.push_back(parse_and());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (at_name("and")) {
    ExprPtr e = node(ExprKind::kAnd);
    ++p_;
    e->children.push_back(std::move(left));
    e->children.push_back(parse_not());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (!at_name("not")) return parse_compare();
  ExprPtr e = node(ExprKind::kUnary);
  ++p_;
  e->name = "not";
  e->children.push_back(parse_not());
  return e;
}

ExprPtr Parser::parse_compare() {
  ExprPtr first = parse_math1();
  ExprPtr cmp;
  for (;;) {
    std::string op;
    if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      op = cur().text;
      ++p_;
    } else if (at_name("in")) {
      op = "in";
      ++p_;
    } else if (at_name("not") && peek().type == Tok::kName && peek().text == "in") {
      op = "notin";
      p_ += 2;
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(ExprKind::kCompare);
      cmp->children.push_back(std::move(first));
    }
    cmp->ops.push_back(op);
    cmp->children.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (at_op("+") || at_op("-")) {
    ExprPtr e = node(ExprKind::kBinary);
    e->name = t_[p_++].text;
    e->children.push_back(std::move(left));
    e->children.push_back(parse_concat());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (at_op("~")) {
    ExprPtr e = node(ExprKind::kBinary);
    e->name = t_[p_++].text;
    e->children.push_back(std::move(left));
    e->children.push_back(parse_math2());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
    ExprPtr e = node(ExprKind::kBinary);
    e->name = t_[p_++].text;
    e->children.push_back(std::move(left));
    e->children.push_back(parse_pow());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary();
  while (at_op("**")) {
    ExprPtr e = node(ExprKind::kBinary);
    e->name = t_[p_++].text;
    e->children.push_back(std::move(left));
    e->children.push_back(parse_unary());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr e;
  if (at_op("-") || at_op("+")) {
    e = node(ExprKind::kUnary);
    e->name = t_[p_++].text;
    e->children.push_back(parse_unary(false));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  return with_filter ? parse_filters(std::move(e)) : std::move(e);
}

ExprPtr Parser::parse_primary() {
  const Token& tok = cur();
  ExprPtr e;
  switch (tok.type) {
    case Tok::kName: {
      e = node(ExprKind::kLiteral);
      const std::string& n = tok.text;
      if (n == "true" || n == "True") {
        e->value = Value::boolean(true);
      } else if (n == "false" || n == "False") {
        e->value = Value::boolean(false);
      } else if (n == "none" || n == "None") {
        e->value = Value::none();
      } else {
        e->kind = ExprKind::kName;
        e->name = n;
      }
      ++p_;
      return e;
    }
    case Tok::kString: {
      e = node(ExprKind::kLiteral);
      std::string s;
      while (cur().type == Tok::kString) s += t_[p_++].text;  // adjacent literals join
      e->value = Value::string(std::move(s));
      return e;
    }
    case Tok::kInt:
      e = node(ExprKind::kLiteral);
      try {
        e->value = Value::integer(std::stoll(tok.text));
      } catch (const std::exception&) {
        fail("integer out of range: " + tok.text);
      }
      ++p_;
      return e;
    case Tok::kFloat:
      e = node(ExprKind::kLiteral);
      try {
        e->value = Value::real(std::stod(tok.text));
      } catch (const std::exception&) {
        fail("float out of range: " + tok.text);
      }
      ++p_;
      return e;
    case Tok::kOp:
      if (tok.text == "(") {
        ++p_;
        if (at_op(")")) {
          ++p_;
          e = node(ExprKind::kTuple);
          return e;
        }
        e = parse_tuple_or_expression();
        expect_op(")");
        return e;
      }
      if (tok.text == "[") {
        e = node(ExprKind::kList);
        ++p_;
        while (!at_op("]")) {
          e->children.push_back(parse_expression());
          if (!at_op(",")) break;
          ++p_;
        }
        expect_op("]");
        return e;
      }
      if (tok.text == "{") {
        e = node(ExprKind::kDict);
        ++p_;
        while (!at_op("}")) {
          e->children.push_back(parse_expression());
          expect_op(":");
          e->children.push_back(parse_expression());
          if (!at_op(",")) break;
          ++p_;
        }
        expect_op("}");
        return e;
      }
      break;
    default:
      break;
  }
  fail("unexpected token" + got());
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  for (;;) {
    if (at_op(".")) {
      ++p_;
      if (cur().type == Tok::kInt) {  // x.0 is x[0]
        ExprPtr item = node(ExprKind::kItem);
        ExprPtr index = node(ExprKind::kLiteral);
        try {  // found by fuzz_chat_template: std::stoll's out_of_range escaped
          index->value = Value::integer(std::stoll(cur().text));
        } catch (const std::exception&) {
          fail("integer out of range: " + cur().text);
        }
        ++p_;
        item->children.push_back(std::move(e));
        item->children.push_back(std::move(index));
        e = std::move(item);
        continue;
      }
      ExprPtr attr = node(ExprKind::kAttr);
      attr->name = expect_name();
      attr->children.push_back(std::move(e));
      e = std::move(attr);
    } else if (at_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (at_op("(")) {
      e = make_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr object) {
  const int line = cur().line;
  ++p_;  // [
  ExprPtr parts[3];
  int n_colons = 0;
  for (;;) {
    if (at_op("]")) break;
    if (at_op(":")) {
      if (++n_colons > 2) fail("bad slice");
      ++p_;
      continue;
    }
    if (parts[n_colons]) fail("expected ']'" + got());
    parts[n_colons] = parse_expression();
  }
  expect_op("]");
  ExprPtr e = std::make_unique<Expr>();
  e->line = line;
  e->children.push_back(std::move(object));
  if (n_colons == 0) {
    if (!parts[0]) fail("empty subscript");
    e->kind = ExprKind::kItem;
    e->children.push_back(std::move(parts[0]));
  } else {
    e->kind = ExprKind::kSlice;
    for (auto& part : parts) e->children.push_back(std::move(part));
  }
  return e;
}

void Parser::parse_call_args(Expr* call) {
  expect_op("(");
  while (!at_op(")")) {
    if (at_op("*") || at_op("**")) fail("unsupported Jinja construct: argument unpacking");
    if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
      std::string key = t_[p_].text;
      p_ += 2;
      call->kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!call->kwargs.empty()) fail("positional argument after keyword argument");
      call->children.push_back(parse_expression());
    }
    if (!at_op(",")) break;
    ++p_;
  }
  expect_op(")");
}

ExprPtr Parser::make_call(ExprPtr callee) {
  ExprPtr call = node(ExprKind::kCall);
  if (callee->kind == ExprKind::kName) {
    if (!is_global_function(callee->name)) called_.emplace_back(callee->name, callee->line);
  } else if (callee->kind == ExprKind::kAttr) {
    if (!is_method(callee->name)) fail("unsupported method '" + callee->name + "'");
  } else {
    fail("unsupported Jinja construct: calling the result of an expression");
  }
  call->children.push_back(std::move(callee));
  parse_call_args(call.get());
  return call;
}

ExprPtr Parser::parse_filters(ExprPtr e) {
  for (;;) {
    if (at_op("|")) {
      ++p_;
      ExprPtr f = node(ExprKind::kFilter);
      f->name = expect_name();
      if (!is_filter(f->name)) {
        --p_;
        fail("unsupported filter '" + f->name + "'");
      }
      f->children.push_back(std::move(e));
      if (at_op("(")) parse_call_args(f.get());
      e = std::move(f);
    } else if (at_name("is")) {
      ++p_;
      ExprPtr t = node(ExprKind::kTest);
      if (at_name("not")) {
        t->negate = true;
        ++p_;
      }
      t->name = expect_name();
      if (!is_test(t->name)) {
        --p_;
        fail("unsupported test '" + t->name + "'");
      }
      t->children.push_back(std::move(e));
      if (at_op("(")) {
        parse_call_args(t.get());
      } else if ((cur().type == Tok::kName || cur().type == Tok::kString ||
                  cur().type == Tok::kInt || cur().type == Tok::kFloat || at_op("[") ||
                  at_op("{")) &&
                 !at_name("else") && !at_name("or") && !at_name("and") && !at_name("if") &&
                 !at_name("in") && !at_name("not") && !at_name("is")) {
        t->children.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
      }
      e = std::move(t);
    } else if (at_op("(")) {
      e = make_call(std::move(e));
    } else {
      return e;
    }
  }
}

}  // namespace duet::jinja
