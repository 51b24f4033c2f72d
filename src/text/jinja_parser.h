// Parser of the Jinja interpreter: tokens -> syntax tree, following Jinja2's grammar and operator
// precedence. Everything the interpreter cannot run is refused here, at load, by name: other
// statements (include, import, extends, block, call, filter, raw, with, ...), unknown filters,
// tests, methods and functions, argument unpacking.
#pragma once

#include <string_view>

#include "text/jinja_ast.h"

namespace duet::jinja {

// Throws duet::Error "line N: <problem>".
Body parse_template(std::string_view source);

}  // namespace duet::jinja
