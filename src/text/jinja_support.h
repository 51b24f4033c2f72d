// Python semantics shared by the Jinja builtins: argument checks, iteration, len(), and the str
// methods (strip, split, replace, case mapping) on code points. Private to the interpreter.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "text/jinja_value.h"

namespace duet::jinja::detail {

[[noreturn]] void type_error(std::string_view what, const Value& v);
const std::string& need_string(const Value& v, std::string_view what);
// An int argument (None or absent: fallback); bools count as ints, as in Python.
int64_t need_int(const Value* v, int64_t fallback, std::string_view what);
bool flag(const Value* v, bool fallback);

std::u32string to_u32(std::string_view s);
std::string from_u32(std::u32string_view s);
// upper() (mode 0), lower() (1), title() (2), capitalize() (3): ASCII text only; other text is
// refused rather than mapped wrong.
std::string ascii_case(const std::string& s, std::string_view what, int mode);
// str.strip(chars) family: which = 1 left, 2 right, 3 both; chars null or None: whitespace.
std::string py_strip(const std::string& s, const Value* chars, int which);
Value py_split(const std::string& s, const Value* sep, int64_t maxsplit);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);

// Items as Python iterates them: list items, str characters, dict keys (undefined: none).
ValueList iterate(const Value& v);
int64_t py_len(const Value& v);
// An attribute path "a.b.0" of an item, as Jinja's attribute filters read it.
Value attribute_of(const Value& item, const std::string& path);

}  // namespace duet::jinja::detail
