#include "text/jinja_eval.h"

#include <climits>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "text/jinja_builtins.h"
#include "text/tokenizer_utf8.h"

namespace duet::jinja {

namespace {

// raise_exception(): the template's own message, passed through without a line prefix.
class TemplateRaise : public Error {
 public:
  using Error::Error;
};

struct Scope {
  const Scope* parent;
  std::unordered_map<std::string, Value> vars;
};

enum class Flow { kNormal, kBreak, kContinue };

Value undefined_named(std::string hint) {
  Value v;
  v.s = std::move(hint);  // for the message if it is used
  return v;
}

[[noreturn]] void undefined_error(const Value& v) {
  DUET_ERROR((v.s.empty() ? std::string("value") : v.s) << " is undefined");
}

int64_t as_int(const Value& v) {
  return v.kind == Value::Kind::kInt ? v.i : int64_t(v.b);
}

// Integer arithmetic of 64 bits: Python's integers have no bound, so a result beyond int64 is an
// error rather than a wrapped number (found by fuzz_chat_template: the overflow was undefined,
// and `2 ** 10**15` looped for hours).
int64_t int_op(char op, int64_t x, int64_t y) {
  int64_t r = 0;
  const bool overflow = op == '+'   ? __builtin_add_overflow(x, y, &r)
                        : op == '-' ? __builtin_sub_overflow(x, y, &r)
                                    : __builtin_mul_overflow(x, y, &r);
  if (overflow) DUET_ERROR("integer overflow in '" << op << "'");
  return r;
}

int64_t int_pow(int64_t base, int64_t exp) {
  int64_t r = 1;
  while (exp > 0) {
    if (exp & 1) r = int_op('*', r, base);
    exp >>= 1;
    if (exp > 0) base = int_op('*', base, base);
  }
  return r;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));  // undefined prints as ""
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const bool ints = a.is_number() && b.is_number() && a.kind != Value::Kind::kFloat &&
                    b.kind != Value::Kind::kFloat;
  if (a.is_number() && b.is_number()) {
    if (op == "+" || op == "-" || op == "*") {
      if (ints) return Value::integer(int_op(op[0], as_int(a), as_int(b)));
      const double x = as_double(a), y = as_double(b);
      return Value::real(op == "+" ? x + y : op == "-" ? x - y : x * y);
    }
    if (op == "**") {
      if (ints && as_int(b) >= 0) return Value::integer(int_pow(as_int(a), as_int(b)));
      return Value::real(std::pow(as_double(a), as_double(b)));
    }
    if (as_double(b) == 0) DUET_ERROR("division by zero");
    if (op == "/") return Value::real(as_double(a) / as_double(b));
    if (op == "//") {
      if (ints) {
        const int64_t x = as_int(a), y = as_int(b);
        if (x == INT64_MIN && y == -1) DUET_ERROR("integer overflow in '//'");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::integer(q);
      }
      return Value::real(std::floor(as_double(a) / as_double(b)));
    }
    if (op == "%") {
      if (ints) {
        const int64_t x = as_int(a), y = as_int(b);
        if (y == -1) return Value::integer(0);  // INT64_MIN % -1 would trap
        int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value::integer(r);
      }
      const double y = as_double(b);
      double r = std::fmod(as_double(a), y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::real(r);
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) return Value::string(a.s + b.s);
  if (op == "+" && a.is_sequence() && a.kind == b.kind) {
    ValueList items = *a.list;
    items.insert(items.end(), b.list->begin(), b.list->end());
    Value r = Value::make_list(std::move(items));
    r.kind = a.kind;
    return r;
  }
  if (op == "*" && (a.is_string() || a.is_sequence()) && b.kind == Value::Kind::kInt) {
    // A bound on what a template may build (as range() has): 'x' * 10**15 would run the process
    // out of memory.
    const double n = double(a.is_string() ? a.s.size() : a.list->size()) * double(b.i);
    if (n > 1e7) DUET_ERROR("repetition too large: " << n << " elements");
    if (a.is_string()) {
      std::string out;
      for (int64_t k = 0; k < b.i; ++k) out += a.s;
      return Value::string(std::move(out));
    }
    ValueList items;
    for (int64_t k = 0; k < b.i; ++k) items.insert(items.end(), a.list->begin(), a.list->end());
    Value r = Value::make_list(std::move(items));
    r.kind = a.kind;
    return r;
  }
  if (op == "%" && a.is_string()) DUET_ERROR("string formatting with % is not supported");
  DUET_ERROR("unsupported operand type(s) for " << op << ": '" << type_name(a) << "' and '"
                                                << type_name(b) << "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        DUET_ERROR("'in <string>' requires string as left operand, not " << type_name(item));
      }
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& v : *container.list) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.dict->find(item.s) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      DUET_ERROR("argument of type '" << type_name(container) << "' is not iterable");
  }
}

// Python's list/str slicing.
Value slice(const Value& object, const Value* start_v, const Value* stop_v, const Value* step_v) {
  auto opt = [](const Value* v) -> std::optional<int64_t> {
    if (v == nullptr || v->is_none() || v->is_undefined()) return std::nullopt;
    if (v->kind != Value::Kind::kInt) DUET_ERROR("slice indices must be integers");
    return v->i;
  };
  const int64_t step = opt(step_v).value_or(1);
  if (step == 0) DUET_ERROR("slice step cannot be zero");
  std::u32string text;
  int64_t n;
  if (object.is_string()) {
    for (size_t i = 0; i < object.s.size();) text.push_back(utf8::next(object.s, &i));
    n = int64_t(text.size());
  } else if (object.is_sequence()) {
    n = int64_t(object.list->size());
  } else {
    DUET_ERROR("'" << type_name(object) << "' object is not subscriptable");
  }
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t start = clamp(opt(start_v), step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(opt(stop_v), step > 0 ? n : -1);
  ValueList items;
  std::string s;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (object.is_string()) {
      utf8::append(&s, text[size_t(k)]);
    } else {
      items.push_back((*object.list)[size_t(k)]);
    }
  }
  if (object.is_string()) return Value::string(std::move(s));
  Value r = Value::make_list(std::move(items));
  r.kind = object.kind;
  return r;
}

class Interpreter {
 public:
  explicit Interpreter(const ValueDict& globals) {
    for (const auto& [k, v] : globals.items) root_.vars[k] = v;
  }

  std::string run(const Body& body) {
    std::string out;
    try {
      exec(body, &root_, &out);
    } catch (const TemplateRaise&) {
      throw;
    } catch (const Error& e) {
      DUET_ERROR("line " << line_ << ": " << e.what());
    }
    return out;
  }

 private:
  Flow exec(const Body& body, Scope* scope, std::string* out);
  Flow exec_for(const Stmt& s, Scope* scope, std::string* out);
  void assign(const Stmt& s, Value value, Scope* scope);
  Value eval(const Expr& e, const Scope* scope);
  Value eval_call(const Expr& e, const Scope* scope);
  CallArgs eval_args(const Expr& e, size_t first, const Scope* scope);
  Value lookup(const std::string& name, const Scope* scope) const {
    for (const Scope* s = scope; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return undefined_named("'" + name + "'");
  }
  Value make_macro(const Stmt& s);

  Scope root_{nullptr, {}};
  int line_ = 0;
  int depth_ = 0;
};

Flow Interpreter::exec(const Body& body, Scope* scope, std::string* out) {
  for (const StmtPtr& sp : body) {
    const Stmt& s = *sp;
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::kData:
        *out += s.text;
        break;
      case StmtKind::kOutput:
        *out += to_str(eval(*s.expr, scope));
        break;
      case StmtKind::kIf: {
        const Body* chosen = &s.else_body;
        for (const auto& [cond, branch] : s.branches) {
          line_ = cond->line;
          if (truthy(eval(*cond, scope))) {
            chosen = &branch;
            break;
          }
        }
        const Flow f = exec(*chosen, scope, out);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kFor:
        exec_for(s, scope, out);
        break;
      case StmtKind::kSet:
        assign(s, eval(*s.expr, scope), scope);
        break;
      case StmtKind::kSetBlock: {
        std::string text;
        Scope inner{scope, {}};
        exec(s.body, &inner, &text);
        assign(s, Value::string(std::move(text)), scope);
        break;
      }
      case StmtKind::kMacro:
        scope->vars[s.text] = make_macro(s);
        break;
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

Flow Interpreter::exec_for(const Stmt& s, Scope* scope, std::string* out) {
  const Value iterable = eval(*s.expr, scope);
  ValueList items;
  if (iterable.is_mapping()) {
    for (const auto& [k, unused] : iterable.dict->items) items.push_back(Value::string(k));
  } else if (iterable.is_string()) {
    items = *apply_filter("list", iterable, {}).list;
  } else if (iterable.is_sequence()) {
    items = *iterable.list;
  } else if (!iterable.is_undefined()) {
    DUET_ERROR("'" << type_name(iterable) << "' object is not iterable");
  }
  auto bind = [&](Scope* iteration, const Value& item) {
    if (s.targets.size() == 1) {
      iteration->vars[s.targets[0]] = item;
      return;
    }
    if (!item.is_sequence() || item.list->size() != s.targets.size()) {
      DUET_ERROR("cannot unpack " << type_name(item) << " into " << s.targets.size() << " names");
    }
    for (size_t k = 0; k < s.targets.size(); ++k) iteration->vars[s.targets[k]] = (*item.list)[k];
  };
  if (s.condition) {  // `for x in xs if cond`: filtered before the loop counts
    ValueList kept;
    for (const Value& item : items) {
      Scope probe{scope, {}};
      bind(&probe, item);
      if (truthy(eval(*s.condition, &probe))) kept.push_back(item);
    }
    items.swap(kept);
  }
  const int64_t n = int64_t(items.size());
  for (int64_t k = 0; k < n; ++k) {
    Scope iteration{scope, {}};
    ValueDict loop;
    loop.items = {{"index", Value::integer(k + 1)},
                  {"index0", Value::integer(k)},
                  {"revindex", Value::integer(n - k)},
                  {"revindex0", Value::integer(n - k - 1)},
                  {"first", Value::boolean(k == 0)},
                  {"last", Value::boolean(k == n - 1)},
                  {"length", Value::integer(n)},
                  {"previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined()},
                  {"nextitem", k + 1 < n ? items[size_t(k + 1)] : Value::undefined()},
                  {"depth", Value::integer(1)},
                  {"depth0", Value::integer(0)}};
    iteration.vars["loop"] = Value::make_dict(std::move(loop));
    bind(&iteration, items[size_t(k)]);
    if (exec(s.body, &iteration, out) == Flow::kBreak) break;
  }
  if (n == 0) exec(s.else_body, scope, out);
  return Flow::kNormal;
}

void Interpreter::assign(const Stmt& s, Value value, Scope* scope) {
  if (s.attribute_target) {
    Value ns = lookup(s.targets[0], scope);
    if (ns.kind != Value::Kind::kNamespace) {
      DUET_ERROR("cannot assign attribute on non-namespace object '" << s.targets[0] << "'");
    }
    ns.dict->set(s.targets[1], std::move(value));
    return;
  }
  if (s.targets.size() == 1) {
    scope->vars[s.targets[0]] = std::move(value);
    return;
  }
  if (!value.is_sequence() || value.list->size() != s.targets.size()) {
    DUET_ERROR("cannot unpack " << type_name(value) << " into " << s.targets.size() << " names");
  }
  for (size_t k = 0; k < s.targets.size(); ++k) scope->vars[s.targets[k]] = (*value.list)[k];
}

Value Interpreter::make_macro(const Stmt& s) {
  const Stmt* macro = &s;
  return Value::function([this, macro](const CallArgs& args) {
    if (args.args.size() > macro->params.size()) {
      DUET_ERROR("macro '" << macro->text << "' takes not more than " << macro->params.size()
                           << " argument(s)");
    }
    if (++depth_ > 100) DUET_ERROR("macro recursion too deep");
    Scope scope{&root_, {}};
    for (size_t k = 0; k < macro->params.size(); ++k) {
      const auto& [name, def] = macro->params[k];
      const Value* given = args.get(name.c_str(), int(k));
      scope.vars[name] = given ? *given
                         : def ? eval(*def, &scope)
                               : undefined_named("'" + name + "'");
    }
    for (const auto& [k, v] : args.kwargs) {
      bool known = false;
      for (const auto& p : macro->params) known |= p.first == k;
      if (!known)
        DUET_ERROR("macro '" << macro->text << "' takes no keyword argument '" << k << "'");
    }
    std::string out;
    exec(macro->body, &scope, &out);
    --depth_;
    return Value::string(std::move(out));
  });
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first, const Scope* scope) {
  CallArgs args;
  for (size_t k = first; k < e.children.size(); ++k)
    args.args.push_back(eval(*e.children[k], scope));
  for (const auto& [name, value] : e.kwargs) args.kwargs.emplace_back(name, eval(*value, scope));
  return args;
}

Value Interpreter::eval_call(const Expr& e, const Scope* scope) {
  const Expr& callee = *e.children[0];
  const CallArgs args = eval_args(e, 1, scope);
  if (callee.kind == ExprKind::kAttr) {
    const Value object = eval(*callee.children[0], scope);
    if (object.is_undefined()) undefined_error(object);
    return call_method(object, callee.name, args);
  }
  const Value fn = lookup(callee.name, scope);
  if (fn.kind == Value::Kind::kFunction) return (*fn.fn)(args);
  if (callee.name == "raise_exception") {
    throw TemplateRaise(args.args.empty() ? "raise_exception" : to_str(args.args[0]));
  }
  return call_global(callee.name, args);
}

Value Interpreter::eval(const Expr& e, const Scope* scope) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.value;
    case ExprKind::kName:
      return lookup(e.name, scope);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      for (const ExprPtr& c : e.children) items.push_back(eval(*c, scope));
      return e.kind == ExprKind::kList ? Value::make_list(std::move(items))
                                       : Value::make_tuple(std::move(items));
    }
    case ExprKind::kDict: {
      ValueDict d;
      for (size_t k = 0; k + 1 < e.children.size(); k += 2) {
        const Value key = eval(*e.children[k], scope);
        if (!key.is_string()) DUET_ERROR("dict keys other than strings are not supported");
        d.set(key.s, eval(*e.children[k + 1], scope));
      }
      return Value::make_dict(std::move(d));
    }
    case ExprKind::kAttr:
    case ExprKind::kItem: {
      const Value object = eval(*e.children[0], scope);
      if (object.is_undefined()) undefined_error(object);
      const Value key =
          e.kind == ExprKind::kAttr ? Value::string(e.name) : eval(*e.children[1], scope);
      Value v = get_item(object, key);
      if (v.is_undefined())
        v.s = "'" + std::string(type_name(object)) + " object' has no attribute " + repr(key);
      return v;
    }
    case ExprKind::kSlice: {
      const Value object = eval(*e.children[0], scope);
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (e.children[k + 1]) parts[k] = eval(*e.children[k + 1], scope);
      }
      return slice(object, &parts[0], &parts[1], &parts[2]);
    }
    case ExprKind::kCall:
      return eval_call(e, scope);
    case ExprKind::kFilter:
      return apply_filter(e.name, eval(*e.children[0], scope), eval_args(e, 1, scope));
    case ExprKind::kTest: {
      const bool r = apply_test(e.name, eval(*e.children[0], scope), eval_args(e, 1, scope));
      return Value::boolean(e.negate ? !r : r);
    }
    case ExprKind::kUnary: {
      const Value v = eval(*e.children[0], scope);
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (!v.is_number())
        DUET_ERROR("bad operand type for unary " << e.name << ": '" << type_name(v) << "'");
      if (e.name == "+") return v.kind == Value::Kind::kFloat ? v : Value::integer(as_int(v));
      if (v.kind == Value::Kind::kFloat) return Value::real(-v.f);
      if (as_int(v) == INT64_MIN) DUET_ERROR("integer overflow in unary -");
      return Value::integer(-as_int(v));
    }
    case ExprKind::kBinary:
      return arithmetic(e.name, eval(*e.children[0], scope), eval(*e.children[1], scope));
    case ExprKind::kAnd: {
      Value left = eval(*e.children[0], scope);
      return truthy(left) ? eval(*e.children[1], scope) : left;
    }
    case ExprKind::kOr: {
      Value left = eval(*e.children[0], scope);
      return truthy(left) ? left : eval(*e.children[1], scope);
    }
    case ExprKind::kCompare: {
      Value left = eval(*e.children[0], scope);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.children[k + 1], scope);
        const std::string& op = e.ops[k];
        bool ok;
        if (op == "==") {
          ok = equals(left, right);
        } else if (op == "!=") {
          ok = !equals(left, right);
        } else if (op == "in") {
          ok = contains(right, left);
        } else if (op == "notin") {
          ok = !contains(right, left);
        } else {
          if (left.is_undefined()) undefined_error(left);
          if (right.is_undefined()) undefined_error(right);
          const int c = compare(left, right);
          ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!ok) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::kCond:
      if (truthy(eval(*e.children[1], scope))) return eval(*e.children[0], scope);
      return e.children[2] ? eval(*e.children[2], scope) : Value::undefined();
  }
  return Value::undefined();
}

}  // namespace

std::string render(const Body& body, const ValueDict& globals) {
  return Interpreter(globals).run(body);
}

}  // namespace duet::jinja
