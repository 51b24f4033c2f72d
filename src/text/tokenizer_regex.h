// Pre-tokenizer regexes: PCRE2 with UTF and Unicode properties (so \p{L}, \p{N}, \s and
// (?i:'s|...) behave as in the Hugging Face tokenizers), JIT-compiled when the library has JIT.
// Private to the tokenizer and its builder.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace duet {

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex true).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Qwen2/Qwen3's Split regex: like GPT-2's, but case-insensitive contractions, one digit per
// pre-token, and newlines kept apart from other whitespace.
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";

// Kimi K2's pre-tokenizer regex (tiktoken's pat_str in its tokenization_kimi.py): runs of Han
// characters are pre-tokens of their own, and the letter branches take every letter but Han
// (Oniguruma's class intersection, `[...&&[^\p{Han}]]`, rewritten by oniguruma_classes below).
inline constexpr const char* kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// `pattern` as Hugging Face's tokenizers (Oniguruma) and tiktoken (Rust's regex) read it, with
// the bracket classes that PCRE2 would read otherwise made explicit: an intersection
// `[A&&B&&...]` (each operand items or one nested class) becomes `(?:(?=[B])...[A])`, and
// `[^A&&B]` one character outside the intersection. Other classes are left as written.
// Throws duet::Error "<source_name>: bad regex '<pattern>': ..." for a nested class outside an
// intersection (PCRE2 reads its `[` as a literal) or an unterminated class.
std::string oniguruma_classes(const std::string& pattern, const std::string& source_name);

// Byte range [begin, end) of a match inside the searched text.
struct TextSpan {
  size_t begin;
  size_t end;
};

class TokenRegex {
 public:
  // Compiles `pattern` (a literal string when `literal`). Throws duet::Error
  // "<source_name>: bad regex '<pattern>': <reason> at offset N".
  TokenRegex(const std::string& pattern, bool literal, const std::string& source_name);
  ~TokenRegex();
  TokenRegex(const TokenRegex&) = delete;
  TokenRegex& operator=(const TokenRegex&) = delete;

  // Appends the non-empty matches in `text`, left to right, to *out. Lookarounds see the whole
  // of `text` (and nothing outside it). REQUIRES: text is valid UTF-8. Thread-safe.
  void find_all(std::string_view text, std::vector<TextSpan>* out) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
};

// Number of leading bytes of `text` that form valid UTF-8 (whole characters only).
size_t valid_utf8_prefix(std::string_view text);

}  // namespace duet
