// The filters of the Jinja interpreter ({{ x | name(args) }}), with Jinja2's semantics and
// Hugging Face's tojson.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>

#include "core/error.h"
#include "text/jinja_builtins.h"
#include "text/jinja_support.h"
#include "text/tokenizer_utf8.h"

namespace duet::jinja {

using namespace detail;

namespace {

Value select_attr(const Value& operand, const CallArgs& args, bool select) {
  if (args.args.empty()) DUET_ERROR("selectattr/rejectattr need an attribute name");
  const std::string& attr = need_string(args.args[0], "selectattr attribute");
  CallArgs test_args;
  test_args.args.assign(args.args.begin() + std::min<size_t>(2, args.args.size()), args.args.end());
  ValueList out;
  for (const Value& item : iterate(operand)) {
    const Value v = attribute_of(item, attr);
    const bool ok = args.args.size() >= 2
                        ? apply_test(need_string(args.args[1], "test"), v, test_args)
                        : truthy(v);
    if (ok == select) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value sort_values(const Value& operand, const CallArgs& args) {
  ValueList items = iterate(operand);
  const bool reverse = flag(args.get("reverse", 0), false);
  const bool case_sensitive = flag(args.get("case_sensitive", 1), false);
  const Value* attribute = args.get("attribute", 2);
  auto key = [&](const Value& v) {
    Value k =
        attribute != nullptr && !attribute->is_none() ? attribute_of(v, to_str(*attribute)) : v;
    if (!case_sensitive && k.is_string()) {
      for (char& c : k.s) c = char(std::tolower(static_cast<unsigned char>(c)));
    }
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? compare(key(b), key(a)) < 0 : compare(key(a), key(b)) < 0;
  });
  return Value::make_list(std::move(items));
}

}  // namespace

Value apply_filter(std::string_view name, const Value& v, const CallArgs& args) {
  if (name == "length" || name == "count") return Value::integer(py_len(v));
  if (name == "safe") return v;
  if (name == "string") return Value::string(to_str(v));
  if (name == "tojson") {
    // Hugging Face's override: json.dumps(x, ensure_ascii=False, indent, separators, sort_keys).
    JsonOptions o;
    if (const Value* indent = args.get("indent", 0); indent != nullptr && !indent->is_none()) {
      o.indent = int(need_int(indent, 0, "tojson indent"));
    }
    o.ensure_ascii = flag(args.get("ensure_ascii", -1), false);
    o.sort_keys = flag(args.get("sort_keys", -1), false);
    if (const Value* sep = args.get("separators", -1); sep != nullptr && !sep->is_none()) {
      if (!sep->is_sequence() || sep->list->size() != 2) DUET_ERROR("tojson: bad separators");
      o.item_separator = need_string((*sep->list)[0], "separators");
      o.key_separator = need_string((*sep->list)[1], "separators");
    }
    return Value::string(to_json(v, o));
  }
  if (name == "trim")
    return Value::string(py_strip(need_string(v, "trim"), args.get("chars", 0), 3));
  if (name == "upper") return Value::string(ascii_case(need_string(v, "upper"), "upper", 0));
  if (name == "lower") return Value::string(ascii_case(need_string(v, "lower"), "lower", 1));
  if (name == "title") return Value::string(ascii_case(need_string(v, "title"), "title", 2));
  if (name == "capitalize") {
    return Value::string(ascii_case(need_string(v, "capitalize"), "capitalize", 3));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (!v.is_mapping()) type_error("items", v);
    ValueList out;
    for (const auto& [k, e] : v.dict->items)
      out.push_back(Value::make_tuple({Value::string(k), e}));
    return Value::make_list(std::move(out));
  }
  if (name == "first" || name == "last") {
    ValueList items = iterate(v);
    if (items.empty()) return Value::undefined();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(v));
  if (name == "join") {
    const Value* sep = args.get("d", 0);
    const Value* attr = args.get("attribute", 1);
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first && sep != nullptr) out += to_str(*sep);
      first = false;
      out += to_str(attr != nullptr && !attr->is_none() ? attribute_of(item, to_str(*attr)) : item);
    }
    return Value::string(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value* fallback = args.get("default_value", 0);
    const bool boolean = flag(args.get("boolean", 1), false);
    if (v.is_undefined() || (boolean && !truthy(v))) {
      return fallback != nullptr ? *fallback : Value::string("");
    }
    return v;
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string text = to_u32(v.s);
      std::reverse(text.begin(), text.end());
      return Value::string(from_u32(text));
    }
    ValueList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "sort") return sort_values(v, args);
  if (name == "dictsort") {
    if (!v.is_mapping()) type_error("dictsort", v);
    ValueList items;
    for (const auto& [k, e] : v.dict->items)
      items.push_back(Value::make_tuple({Value::string(k), e}));
    CallArgs sort_args;
    sort_args.kwargs = {{"attribute", Value::string("0")}};
    if (const Value* r = args.get("reverse", 2)) sort_args.kwargs.emplace_back("reverse", *r);
    return sort_values(Value::make_list(std::move(items)), sort_args);
  }
  if (name == "unique") {
    ValueList out;
    for (const Value& item : iterate(v)) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equals(o, item); })) {
        out.push_back(item);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::kFloat) return Value::real(std::fabs(v.f));
    const int64_t i = need_int(&v, 0, "abs");
    if (i == INT64_MIN) DUET_ERROR("abs: integer overflow");
    return Value::integer(std::llabs(i));
  }
  if (name == "int") {
    if (v.kind == Value::Kind::kFloat) {
      // Python's int() has no range; duet's integers are 64-bit.
      if (!(std::fabs(v.f) < 9.2e18)) DUET_ERROR("int: " << v.f << " is out of range");
      return Value::integer(int64_t(v.f));
    }
    if (v.is_string()) {
      try {
        return Value::integer(std::stoll(v.s));
      } catch (const std::exception&) {
        return args.get("default", 0) ? *args.get("default", 0) : Value::integer(0);
      }
    }
    return Value::integer(need_int(&v, 0, "int"));
  }
  if (name == "float") {
    if (v.is_number()) return Value::real(as_double(v));
    try {
      return Value::real(std::stod(need_string(v, "float")));
    } catch (const std::exception&) {
      return args.get("default", 0) ? *args.get("default", 0) : Value::real(0);
    }
  }
  if (name == "bool") return Value::boolean(truthy(v));
  if (name == "round") {
    const int64_t precision = need_int(args.get("precision", 0), 0, "round precision");
    const std::string method = args.get("method", 1) ? to_str(*args.get("method", 1)) : "common";
    if (!v.is_number()) type_error("round", v);
    const double scale = std::pow(10.0, double(precision));
    const double x = as_double(v) * scale;
    const double r = method == "floor"  ? std::floor(x)
                     : method == "ceil" ? std::ceil(x)
                                        : std::round(x);
    return Value::real(r / scale);
  }
  if (name == "replace") {
    return Value::string(
        py_replace(need_string(v, "replace"),
                   need_string(args.args.size() > 0 ? args.args[0] : Value(), "replace"),
                   need_string(args.args.size() > 1 ? args.args[1] : Value(), "replace"),
                   need_int(args.get("count", 2), -1, "replace count")));
  }
  if (name == "indent") {
    const Value* width_v = args.get("width", 0);
    const std::string pad = width_v != nullptr && width_v->is_string()
                                ? width_v->s
                                : std::string(size_t(need_int(width_v, 4, "indent width")), ' ');
    const bool first = flag(args.get("first", 1), false);
    const bool blank = flag(args.get("blank", 2), false);
    const std::string& s = need_string(v, "indent");
    std::string out;
    size_t start = 0, line = 0;
    for (;;) {
      size_t nl = s.find('\n', start);
      const std::string_view part(s.data() + start,
                                  (nl == std::string::npos ? s.size() : nl) - start);
      if ((line > 0 || first) && (blank || !part.empty())) out += pad;
      out += part;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      ++line;
    }
    return Value::string(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr")
    return select_attr(v, args, name == "selectattr");
  if (name == "map") {
    const Value* attr = args.get("attribute", -1);
    ValueList out;
    for (const Value& item : iterate(v)) {
      if (attr != nullptr) {
        Value x = attribute_of(item, to_str(*attr));
        if (x.is_undefined() && args.get("default", -1)) x = *args.get("default", -1);
        out.push_back(std::move(x));
      } else {
        if (args.args.empty()) DUET_ERROR("map needs a filter name or attribute=");
        CallArgs rest;
        rest.args.assign(args.args.begin() + 1, args.args.end());
        const std::string& filter = need_string(args.args[0], "map filter");
        if (!is_filter(filter)) DUET_ERROR("unsupported filter '" << filter << "'");
        out.push_back(apply_filter(filter, item, rest));
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "wordcount") {
    return Value::integer(int64_t(py_split(need_string(v, "wordcount"), nullptr, -1).list->size()));
  }
  DUET_ERROR("unsupported filter '" << name << "'");
}

}  // namespace duet::jinja
