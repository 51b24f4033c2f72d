// Filters, tests, methods and global functions of the Jinja interpreter, with Jinja2 / Python
// semantics (as Hugging Face's apply_chat_template sees them: its tojson, raise_exception and
// strftime_now included). The parser checks names against these lists at load.
#pragma once

#include <string>
#include <string_view>

#include "text/jinja_value.h"

namespace duet::jinja {

bool is_filter(std::string_view name);
bool is_test(std::string_view name);
// Methods of str, dict and list values (x.name(...)).
bool is_method(std::string_view name);
// Functions callable by name: raise_exception, range, namespace, strftime_now, dict.
bool is_global_function(std::string_view name);

// Each throws duet::Error with the problem (the caller adds the line).
Value apply_filter(std::string_view name, const Value& operand, const CallArgs& args);
bool apply_test(std::string_view name, const Value& operand, const CallArgs& args);
Value call_method(const Value& object, std::string_view name, const CallArgs& args);
Value call_global(std::string_view name, const CallArgs& args);

// obj[key] / obj.key: dict key, list or str index (negative from the end); undefined if absent.
Value get_item(const Value& object, const Value& key);

}  // namespace duet::jinja
