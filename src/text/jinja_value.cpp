#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "text/tokenizer_utf8.h"

namespace duet::jinja {

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(const char* name, int pos) const {
  for (const auto& [k, v] : kwargs) {
    if (k == name) return &v;
  }
  if (pos >= 0 && size_t(pos) < args.size()) return &args[pos];
  return nullptr;
}

Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.i = i;
  return v;
}
Value Value::real(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(s);
  return v;
}
Value Value::make_list(ValueList items) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::make_tuple(ValueList items) {
  Value v = make_list(std::move(items));
  v.kind = Kind::kTuple;
  return v;
}
Value Value::make_dict(ValueDict d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::make_namespace(ValueDict d) {
  Value v = make_dict(std::move(d));
  v.kind = Kind::kNamespace;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kTuple:
      return "tuple";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
  }
  return "?";
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |v| < 1e16.
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, end);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string mant = sci.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + exp_buf;
}

namespace {

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string string_repr(const std::string& s) {
  const char quote =
      s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t cp = utf8::next(s, &i);
    char buf[16];
    if (cp == char32_t(quote) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", unsigned(cp));
      out += buf;
    } else if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || cp == 0x205F ||
               cp == 0x3000 || cp == 0xFEFF) {  // not printable in Python
      std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(cp));
      out += buf;
    } else {
      out.append(s, start, i - start);
    }
  }
  out += quote;
  return out;
}

std::string sequence_str(const Value& v) {
  const bool tuple = v.kind == Value::Kind::kTuple;
  std::string out = tuple ? "(" : "[";
  for (size_t k = 0; k < v.list->size(); ++k) {
    if (k > 0) out += ", ";
    out += repr((*v.list)[k]);
  }
  if (tuple && v.list->size() == 1) out += ",";
  out += tuple ? ")" : "]";
  return out;
}

std::string dict_str(const ValueDict& d) {
  std::string out = "{";
  for (size_t k = 0; k < d.items.size(); ++k) {
    if (k > 0) out += ", ";
    out += string_repr(d.items[k].first) + ": " + repr(d.items[k].second);
  }
  return out + "}";
}

void json_string(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t cp = utf8::next(s, &i);
    char buf[16];
    switch (cp) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        const char32_t c = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", unsigned(0xD800 + (c >> 10)),
                      unsigned(0xDC00 + (c & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(cp));
      }
      *out += buf;
    } else {
      out->append(s, start, i - start);
    }
  }
  out->push_back('"');
}

void json_value(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  const std::string item_sep =
      !o.item_separator.empty() ? o.item_separator : (o.indent >= 0 ? "," : ", ");
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out->push_back('\n');
    out->append(size_t(o.indent) * size_t(d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kNone:
      *out += "null";
      return;
    case Value::Kind::kBool:
      *out += v.b ? "true" : "false";
      return;
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      return;
    case Value::Kind::kFloat:
      *out += std::isnan(v.f)   ? "NaN"
              : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity")
                                : float_repr(v.f);
      return;
    case Value::Kind::kString:
      json_string(v.s, o.ensure_ascii, out);
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (v.list->empty()) {
        *out += "[]";
        return;
      }
      out->push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) *out += item_sep;
        newline(depth + 1);
        json_value((*v.list)[k], o, depth + 1, out);
      }
      newline(depth);
      out->push_back(']');
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) *out += item_sep;
        newline(depth + 1);
        json_string(items[k]->first, o.ensure_ascii, out);
        *out += o.key_separator;
        json_value(items[k]->second, o, depth + 1, out);
      }
      newline(depth);
      out->push_back('}');
      return;
    }
    default:
      DUET_ERROR("Object of type " << type_name(v) << " is not JSON serializable");
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return float_repr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return sequence_str(v);
    case Value::Kind::kDict:
      return dict_str(*v.dict);
    case Value::Kind::kNamespace:
      return "<Namespace " + dict_str(*v.dict) + ">";
    case Value::Kind::kFunction:
      return "<function>";
  }
  return "";
}

std::string repr(const Value& v) {
  return v.kind == Value::Kind::kString ? string_repr(v.s) : to_str(v);
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction:
      return true;
  }
  return false;
}

double as_double(const Value& v) {
  return v.kind == Value::Kind::kFloat ? v.f : v.kind == Value::Kind::kInt ? double(v.i) : v.b;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      return (a.kind == Value::Kind::kInt ? a.i : a.b) == (b.kind == Value::Kind::kInt ? b.i : b.b);
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, value] : a.dict->items) {
        const Value* other = b.dict->find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.dict == b.dict && a.fn == b.fn;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.is_sequence() && b.kind == a.kind) {
    for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
      if (!equals((*a.list)[k], (*b.list)[k])) return compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  DUET_ERROR("'<' not supported between instances of '" << type_name(a) << "' and '" << type_name(b)
                                                        << "'");
}

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(v, options, 0, &out);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json(e));
      return Value::make_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

}  // namespace duet::jinja
