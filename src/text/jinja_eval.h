// Evaluator of the Jinja interpreter: renders a parsed template with Jinja2's semantics as
// Hugging Face uses it for chat templates (ImmutableSandboxedEnvironment, default Undefined,
// loop controls): per-iteration loop scopes, namespaces, macros, Python operators.
#pragma once

#include <string>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace duet::jinja {

// Renders `body` with `globals` as the template's variables. Throws duet::Error "line N: ..."
// on a runtime error, and duet::Error with the template's own message for raise_exception().
std::string render(const Body& body, const ValueDict& globals);

}  // namespace duet::jinja
