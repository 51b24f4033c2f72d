// Syntax tree of the Jinja subset that chat templates use.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace duet::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,  // value
  kName,     // name
  kList,     // children: items
  kTuple,    // children: items
  kDict,     // children: key0, value0, key1, value1, ...
  kAttr,     // children: [object]; name: attribute  (x.name)
  kItem,     // children: [object, index]            (x[i])
  kSlice,    // children: [object, start, stop, step], each may be null  (x[a:b:c])
  kCall,     // children: [callee, positional...]; kwargs
  kFilter,   // children: [operand, positional...]; kwargs; name: filter
  kTest,     // children: [operand, positional...]; name: test; negate
  kUnary,    // children: [operand]; name: "-", "+" or "not"
  kBinary,   // children: [left, right]; name: "+", "-", "*", "/", "//", "%", "**", "~"
  kAnd,      // children: [left, right]
  kOr,       // children: [left, right]
  kCompare,  // children: [first, others...]; ops: "==", "!=", "<", "<=", ">", ">=", "in", "notin"
  kCond,     // children: [then, condition, otherwise (may be null)]
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negate = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  kData,      // text
  kOutput,    // expr
  kIf,        // branches (condition, body); else_body
  kFor,       // targets, expr (iterable), condition (may be null), body, else_body
  kSet,       // targets (one name, several to unpack, or {namespace, attribute}), expr
  kSetBlock,  // targets[0] = rendered body
  kMacro,     // text: name; params; body
  kBreak,
  kContinue,
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;
  bool attribute_target = false;  // kSet: targets = {namespace name, attribute}
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default (may be null)
};

}  // namespace duet::jinja
