// Lexer of the Jinja interpreter: template text -> data and tag tokens, with Jinja2's whitespace
// rules as Hugging Face configures them for chat templates (trim_blocks, lstrip_blocks, `-`
// markers strip, `+` markers keep, one trailing newline dropped).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace duet::jinja {

enum class Tok {
  kData,        // text outside tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text: the value, escapes resolved
  kInt,
  kFloat,
  kOp,  // text: the operator, e.g. "==", "(", "|"
  kEof,
};

struct Token {
  Tok type;
  std::string text;
  int line;
};

// Throws duet::Error "line N: <problem>" on a malformed template.
std::vector<Token> lex(std::string_view source);

}  // namespace duet::jinja
