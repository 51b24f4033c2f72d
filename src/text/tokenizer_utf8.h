// UTF-8 helpers shared by the tokenizer, its decoders, the Jinja interpreter and the server's
// streamed chunks (implemented in utf8.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace duet::utf8 {

// Decodes the UTF-8 character at s[*i] and moves *i past it; an ill-formed or cut-off sequence
// decodes as U+FFFD and *i moves past its maximal ill-formed prefix (as utf8_lossy replaces it).
// REQUIRES: *i < s.size().
char32_t next(std::string_view s, size_t* i);

// Appends code point cp as UTF-8.
void append(std::string* out, char32_t cp);

// Number of characters in valid UTF-8 text.
size_t length(std::string_view s);

// Unicode White_Space (what Rust's char::is_whitespace and Python's str.split() treat as space,
// less Python's \x1c-\x1f).
bool is_whitespace(char32_t cp);
// Python's str.isspace() for one character: White_Space plus U+001C..U+001F.
bool is_python_space(char32_t cp);

// The end of the longest prefix of `bytes` whose lossy decoding (utf8_lossy) no later byte can
// change: everything except a trailing, still valid but incomplete character (at most 3 bytes).
size_t stable_end(std::string_view bytes);

// True if `bytes` is entirely valid UTF-8.
bool is_valid(std::string_view bytes);

inline constexpr const char* kReplacementChar = "\xef\xbf\xbd";  // U+FFFD

}  // namespace duet::utf8
