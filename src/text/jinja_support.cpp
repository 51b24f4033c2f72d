#include "text/jinja_support.h"

#include <cctype>

#include "core/error.h"
#include "text/jinja_builtins.h"
#include "text/tokenizer_utf8.h"

namespace duet::jinja::detail {

[[noreturn]] void type_error(std::string_view what, const Value& v) {
  DUET_ERROR(what << " is not supported for a value of type '" << type_name(v) << "'");
}

const std::string& need_string(const Value& v, std::string_view what) {
  if (!v.is_string()) type_error(what, v);
  return v.s;
}

int64_t need_int(const Value* v, int64_t fallback, std::string_view what) {
  if (v == nullptr || v->is_none()) return fallback;
  if (v->kind == Value::Kind::kInt) return v->i;
  if (v->kind == Value::Kind::kBool) return v->b;
  type_error(what, *v);
}

bool flag(const Value* v, bool fallback) {
  return v == nullptr ? fallback : truthy(*v);
}

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) out.push_back(utf8::next(s, &i));
  return out;
}

std::string from_u32(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) utf8::append(&out, c);
  return out;
}

// Case mapping is implemented for ASCII only: other text is refused rather than mapped wrong.
std::string ascii_case(const std::string& s, std::string_view what, int mode) {
  for (unsigned char c : s) {
    if (c >= 0x80) DUET_ERROR(what << "() of non-ASCII text is not supported");
  }
  std::string out = s;
  bool prev_cased = false;
  for (size_t k = 0; k < out.size(); ++k) {
    char& c = out[k];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    bool upper = mode == 0;                       // upper()
    if (mode == 2) upper = alpha && !prev_cased;  // title()
    if (mode == 3) upper = k == 0;                // capitalize()
    if (alpha) c = upper ? char(std::toupper(c)) : char(std::tolower(c));
    prev_cased = alpha;
  }
  return out;
}

// Python's str.strip(chars) family: which = 1 left, 2 right, 3 both.
std::string py_strip(const std::string& s, const Value* chars, int which) {
  std::u32string text = to_u32(s);
  std::u32string set;
  const bool whitespace = chars == nullptr || chars->is_none();
  if (!whitespace) set = to_u32(need_string(*chars, "strip"));
  auto strip_it = [&](char32_t c) {
    return whitespace ? utf8::is_python_space(c) : set.find(c) != std::u32string::npos;
  };
  size_t begin = 0, end = text.size();
  if (which & 1) {
    while (begin < end && strip_it(text[begin])) ++begin;
  }
  if (which & 2) {
    while (end > begin && strip_it(text[end - 1])) --end;
  }
  return from_u32(std::u32string_view(text).substr(begin, end - begin));
}

Value py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  ValueList parts;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace; no empty parts
    const std::u32string text = to_u32(s);
    size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && utf8::is_python_space(text[i])) ++i;
      if (i >= text.size()) break;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        size_t end = text.size();
        while (end > i && utf8::is_python_space(text[end - 1])) --end;
        parts.push_back(Value::string(from_u32(std::u32string_view(text).substr(i, end - i))));
        break;
      }
      size_t j = i;
      while (j < text.size() && !utf8::is_python_space(text[j])) ++j;
      parts.push_back(Value::string(from_u32(std::u32string_view(text).substr(i, j - i))));
      i = j;
    }
    return Value::make_list(std::move(parts));
  }
  const std::string& d = need_string(*sep, "split");
  if (d.empty()) DUET_ERROR("split(): empty separator");
  size_t prev = 0;
  for (size_t pos = s.find(d); pos != std::string::npos; pos = s.find(d, prev)) {
    if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) break;
    parts.push_back(Value::string(s.substr(prev, pos - prev)));
    prev = pos + d.size();
  }
  parts.push_back(Value::string(s.substr(prev)));
  return Value::make_list(std::move(parts));
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) DUET_ERROR("replace() with an empty pattern is not supported");
  std::string out;
  size_t prev = 0;
  int64_t n = 0;
  for (size_t pos = s.find(from); pos != std::string::npos && (count < 0 || n < count);
       pos = s.find(from, prev), ++n) {
    out.append(s, prev, pos - prev);
    out += to;
    prev = pos + from.size();
  }
  out.append(s, prev);
  return out;
}

// Items of an iterable as Python iterates them: list items, str characters, dict keys.
ValueList iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return *v.list;
    case Value::Kind::kString: {
      ValueList out;
      for (size_t i = 0; i < v.s.size();) {
        const size_t start = i;
        utf8::next(v.s, &i);
        out.push_back(Value::string(v.s.substr(start, i - start)));
      }
      return out;
    }
    case Value::Kind::kDict: {
      ValueList out;
      for (const auto& [k, unused] : v.dict->items) out.push_back(Value::string(k));
      return out;
    }
    case Value::Kind::kUndefined:
      return {};
    default:
      type_error("iteration", v);
  }
}

int64_t py_len(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      return int64_t(utf8::length(v.s));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return int64_t(v.list->size());
    case Value::Kind::kDict:
      return int64_t(v.dict->items.size());
    case Value::Kind::kUndefined:
      return 0;
    default:
      type_error("length", v);
  }
}

// An attribute path "a.b.0" of an item, as Jinja's attribute filters read it.
Value attribute_of(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    // An index too long for int64 is past any list's end: looked up as a string, it is missing.
    const bool index = digits && v.is_sequence() && part.size() <= 18;
    v = get_item(v, index ? Value::integer(std::stoll(part)) : Value::string(part));
    start = dot + 1;
  }
  return v;
}

}  // namespace duet::jinja::detail
