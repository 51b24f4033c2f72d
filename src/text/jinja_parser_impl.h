// The parser's class, shared by its two halves: statements (jinja_parser.cpp) and expressions
// (jinja_parser_expr.cpp). Private to the Jinja interpreter.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace duet::jinja {

// Recursive-descent parser over the lexer's tokens; parse() returns the template's body.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse() {
    Body body;
    const std::string end = parse_body({}, &body);
    if (!end.empty()) fail("unexpected '{% " + end + " %}'");
    for (const auto& [name, line] : called_) {
      if (!macros_.count(name)) {
        DUET_ERROR("line " << line << ": unsupported function '" << name << "'");
      }
    }
    return body;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    DUET_ERROR("line " << cur().line << ": " << what);
  }
  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool at_name(std::string_view name) const {
    return cur().type == Tok::kName && cur().text == name;
  }
  void expect_op(std::string_view op) {
    if (!at_op(op)) fail("expected '" + std::string(op) + "'" + got());
    ++p_;
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(std::string("expected ") + what + got());
    ++p_;
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail("expected a name" + got());
    return t_[p_++].text;
  }
  std::string got() const {
    switch (cur().type) {
      case Tok::kEof:
        return ", got the end of the template";
      case Tok::kBlockEnd:
        return ", got '%}'";
      case Tok::kVarEnd:
        return ", got '}}'";
      default:
        return ", got '" + cur().text + "'";
    }
  }
  ExprPtr node(ExprKind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = cur().line;
    return e;
  }

  // Parses statements until a block tag whose keyword is in `ends` (consumed: "{%" and the
  // keyword) or the end of the template. Returns the keyword, or "" at the end.
  std::string parse_body(const std::set<std::string>& ends, Body* body);
  void parse_statement(Body* body);
  StmtPtr parse_if();
  StmtPtr parse_for();
  StmtPtr parse_set();
  StmtPtr parse_macro();
  void expect_end(const std::set<std::string>& ends, Body* body, const char* tag) {
    const std::string end = parse_body(ends, body);
    if (end.empty()) fail(std::string("missing '{% ") + tag + " %}'");
  }

  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_tuple_or_expression();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_filters(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr object);
  void parse_call_args(Expr* call);
  ExprPtr make_call(ExprPtr callee);

  std::vector<Token> t_;
  size_t p_ = 0;
  std::set<std::string> macros_;
  std::vector<std::pair<std::string, int>> called_;  // names called as functions, checked at end
};

}  // namespace duet::jinja
