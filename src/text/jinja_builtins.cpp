#include "text/jinja_builtins.h"

#include <algorithm>
#include <ctime>
#include <set>

#include "core/error.h"
#include "text/jinja_support.h"
#include "text/tokenizer_utf8.h"

namespace duet::jinja {

using namespace detail;

namespace {

const std::set<std::string_view> kFilters = {
    "length",  "count",    "tojson",  "string",   "trim",       "items",      "first",
    "last",    "list",     "join",    "upper",    "lower",      "title",      "capitalize",
    "default", "d",        "reverse", "sort",     "abs",        "int",        "float",
    "round",   "replace",  "indent",  "safe",     "selectattr", "rejectattr", "map",
    "unique",  "dictsort", "bool",    "wordcount"};
const std::set<std::string_view> kTests = {
    "defined", "undefined", "none",        "string",  "number",   "integer",  "float",
    "boolean", "true",      "false",       "mapping", "iterable", "sequence", "callable",
    "odd",     "even",      "divisibleby", "eq",      "equalto",  "ne",       "lt",
    "le",      "gt",        "ge",          "in",      "lower",    "upper",    "sameas"};
const std::set<std::string_view> kMethods = {
    "startswith", "endswith", "split",      "rsplit",  "strip", "lstrip", "rstrip", "upper",
    "lower",      "title",    "capitalize", "replace", "find",  "rfind",  "count",  "join",
    "isdigit",    "isspace",  "get",        "items",   "keys",  "values"};
const std::set<std::string_view> kGlobals = {"raise_exception", "range", "namespace",
                                             "strftime_now", "dict"};

}  // namespace

bool is_filter(std::string_view name) {
  return kFilters.count(name) != 0;
}
bool is_test(std::string_view name) {
  return kTests.count(name) != 0;
}
bool is_method(std::string_view name) {
  return kMethods.count(name) != 0;
}
bool is_global_function(std::string_view name) {
  return kGlobals.count(name) != 0;
}

Value get_item(const Value& object, const Value& key) {
  switch (object.kind) {
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (!key.is_string()) return Value::undefined();
      const Value* v = object.dict->find(key.s);
      return v != nullptr ? *v : Value::undefined();
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kString: {
      if (key.kind != Value::Kind::kInt) return Value::undefined();
      if (object.is_string()) {
        const std::u32string text = to_u32(object.s);
        const int64_t n = int64_t(text.size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return Value::undefined();
        return Value::string(from_u32(std::u32string_view(text).substr(size_t(k), 1)));
      }
      const int64_t n = int64_t(object.list->size());
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value::undefined();
      return (*object.list)[size_t(k)];
    }
    default:
      return Value::undefined();
  }
}

bool apply_test(std::string_view name, const Value& v, const CallArgs& args) {
  const Value* arg = args.get("value", 0);
  auto need_arg = [&]() -> const Value& {
    if (arg == nullptr) DUET_ERROR("test '" << name << "' needs an argument");
    return *arg;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Value::Kind::kInt;
  if (name == "float") return v.kind == Value::Kind::kFloat;
  if (name == "boolean") return v.kind == Value::Kind::kBool;
  if (name == "true") return v.kind == Value::Kind::kBool && v.b;
  if (name == "false") return v.kind == Value::Kind::kBool && !v.b;
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.is_sequence() || v.is_string() || v.is_mapping();
  if (name == "sequence") return v.is_sequence() || v.is_string() || v.is_mapping();
  if (name == "callable") return v.kind == Value::Kind::kFunction;
  if (name == "odd") return need_int(&v, 0, "odd") % 2 != 0;
  if (name == "even") return need_int(&v, 0, "even") % 2 == 0;
  if (name == "divisibleby") {
    const int64_t d = need_int(&need_arg(), 1, "divisibleby");
    if (d == 0) DUET_ERROR("divisibleby 0");
    return need_int(&v, 0, "divisibleby") % d == 0;
  }
  if (name == "eq" || name == "equalto") return equals(v, need_arg());
  if (name == "ne") return !equals(v, need_arg());
  if (name == "lt") return compare(v, need_arg()) < 0;
  if (name == "le") return compare(v, need_arg()) <= 0;
  if (name == "gt") return compare(v, need_arg()) > 0;
  if (name == "ge") return compare(v, need_arg()) >= 0;
  if (name == "sameas") {
    const Value& o = need_arg();
    if (v.kind != o.kind) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind == Value::Kind::kBool) return v.b == o.b;
    return v.list == o.list && v.dict == o.dict && v.fn == o.fn && v.list != nullptr;
  }
  if (name == "in") {
    const Value& c = need_arg();
    if (c.is_string()) return c.s.find(need_string(v, "in")) != std::string::npos;
    if (c.is_mapping()) return v.is_string() && c.dict->find(v.s) != nullptr;
    for (const Value& item : iterate(c)) {
      if (equals(item, v)) return true;
    }
    return false;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    for (unsigned char c : v.s) {
      if (name == "lower" ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
    }
    return true;
  }
  DUET_ERROR("unsupported test '" << name << "'");
}

Value call_method(const Value& obj, std::string_view name, const CallArgs& args) {
  auto no_method = [&]() {
    DUET_ERROR("'" << type_name(obj) << "' object has no attribute '" << name << "'");
  };
  if (obj.is_mapping()) {
    if (name == "get") {
      const Value* key = args.get("key", 0);
      if (key == nullptr) DUET_ERROR("get() needs a key");
      const Value found = get_item(obj, *key);
      if (!found.is_undefined()) return found;
      const Value* fallback = args.get("default", 1);
      return fallback != nullptr ? *fallback : Value::none();
    }
    if (name == "items") return apply_filter("items", obj, {});
    if (name == "keys") return Value::make_list(iterate(obj));
    if (name == "values") {
      ValueList out;
      for (const auto& [k, e] : obj.dict->items) out.push_back(e);
      return Value::make_list(std::move(out));
    }
    no_method();
  }
  if (!obj.is_string()) no_method();
  const std::string& s = obj.s;
  const Value* a0 = args.args.size() > 0 ? &args.args[0] : nullptr;
  if (name == "startswith" || name == "endswith") {
    if (a0 == nullptr) DUET_ERROR(name << "() needs an argument");
    ValueList options = a0->is_sequence() ? *a0->list : ValueList{*a0};
    for (const Value& o : options) {
      const std::string& p = need_string(o, name);
      const bool hit = p.size() <= s.size() &&
                       (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                             : s.compare(s.size() - p.size(), p.size(), p) == 0);
      if (hit) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "split")
    return py_split(s, args.get("sep", 0), need_int(args.get("maxsplit", 1), -1, "maxsplit"));
  if (name == "rsplit") {
    if (need_int(args.get("maxsplit", 1), -1, "maxsplit") >= 0) {
      DUET_ERROR("rsplit() with maxsplit is not supported");
    }
    return py_split(s, args.get("sep", 0), -1);
  }
  if (name == "strip") return Value::string(py_strip(s, args.get("chars", 0), 3));
  if (name == "lstrip") return Value::string(py_strip(s, args.get("chars", 0), 1));
  if (name == "rstrip") return Value::string(py_strip(s, args.get("chars", 0), 2));
  if (name == "upper") return Value::string(ascii_case(s, "upper", 0));
  if (name == "lower") return Value::string(ascii_case(s, "lower", 1));
  if (name == "title") return Value::string(ascii_case(s, "title", 2));
  if (name == "capitalize") return Value::string(ascii_case(s, "capitalize", 3));
  if (name == "replace") {
    if (args.args.size() < 2) DUET_ERROR("replace() needs two arguments");
    return Value::string(py_replace(s, need_string(args.args[0], "replace"),
                                    need_string(args.args[1], "replace"),
                                    need_int(args.get("count", 2), -1, "replace count")));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    if (a0 == nullptr) DUET_ERROR(name << "() needs an argument");
    const std::string& sub = need_string(*a0, name);
    if (name == "count") {
      int64_t n = 0;
      if (sub.empty()) return Value::integer(int64_t(utf8::length(s)) + 1);
      for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size()))
        ++n;
      return Value::integer(n);
    }
    const size_t pos = name == "find" ? s.find(sub) : s.rfind(sub);
    return Value::integer(pos == std::string::npos ? -1 : int64_t(utf8::length(s.substr(0, pos))));
  }
  if (name == "join") {
    if (a0 == nullptr) DUET_ERROR("join() needs an argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*a0)) {
      if (!first) out += s;
      first = false;
      out += need_string(item, "join");
    }
    return Value::string(std::move(out));
  }
  if (name == "isdigit" || name == "isspace") {
    if (s.empty()) return Value::boolean(false);
    for (char32_t c : to_u32(s)) {
      const bool ok = name == "isdigit" ? (c >= '0' && c <= '9') : utf8::is_python_space(c);
      if (!ok) {
        if (name == "isdigit" && c >= 0x80)
          DUET_ERROR("isdigit() of non-ASCII text is not supported");
        return Value::boolean(false);
      }
    }
    return Value::boolean(true);
  }
  no_method();
  return Value();
}

Value call_global(std::string_view name, const CallArgs& args) {
  if (name == "raise_exception") {
    DUET_ERROR((args.args.empty() ? std::string("raise_exception") : to_str(args.args[0])));
  }
  if (name == "range") {
    if (args.args.empty() || args.args.size() > 3) DUET_ERROR("range() takes 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (args.args.size() == 1) {
      stop = need_int(&args.args[0], 0, "range");
    } else {
      start = need_int(&args.args[0], 0, "range");
      stop = need_int(&args.args[1], 0, "range");
      if (args.args.size() == 3) step = need_int(&args.args[2], 1, "range");
    }
    if (step == 0) DUET_ERROR("range() step must not be zero");
    ValueList out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      out.push_back(Value::integer(k));
      if (out.size() > 10'000'000) DUET_ERROR("range() too large");
    }
    return Value::make_list(std::move(out));
  }
  if (name == "namespace" || name == "dict") {
    ValueDict d;
    if (!args.args.empty()) {
      if (args.args.size() > 1 || !args.args[0].is_mapping()) {
        DUET_ERROR(name << "() takes keyword arguments or one dict");
      }
      d = *args.args[0].dict;
    }
    for (const auto& [k, v] : args.kwargs) d.set(k, v);
    return name == "dict" ? Value::make_dict(std::move(d)) : Value::make_namespace(std::move(d));
  }
  if (name == "strftime_now") {
    const std::string format = args.args.empty() ? "" : to_str(args.args[0]);
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
    return Value::string(std::string(buf, n));
  }
  DUET_ERROR("unsupported function '" << name << "'");
}

}  // namespace duet::jinja
