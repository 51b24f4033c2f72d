// The normalizer of a tokenizer.json: NFC, Prepend, Replace, Strip and Sequence of them, applied
// as Hugging Face's tokenizers applies them to each stretch of text between added tokens.
// Private to the tokenizer.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_regex.h"

namespace duet {

class TextNormalizer {
 public:
  // Appends the steps of `j` (tokenizer.json's "normalizer"; null is none). Throws duet::Error
  // "<source>: unsupported normalizer 'T' (supported: ...)" for any other type.
  void parse(const nlohmann::json& j, const std::string& source);

  bool empty() const { return steps_.empty(); }

  // Normalizes `text` (valid UTF-8). Returns false, leaving *out alone, when the text is already
  // normalized (the common case for NFC on real text); otherwise writes the result to *out.
  bool apply(std::string_view text, std::string* out) const;

 private:
  enum class Kind { kNfc, kPrepend, kReplace, kStrip };
  struct Step {
    Kind kind;
    std::string text;                   // Prepend: prefix; Replace: literal pattern
    std::string content;                // Replace: replacement
    std::shared_ptr<TokenRegex> regex;  // Replace with a Regex pattern
    bool strip_left = false, strip_right = false;
  };
  // Applies one step to *s; returns false if nothing changed.
  static bool apply_step(const Step& step, std::string_view s, std::string* out);

  std::vector<Step> steps_;
};

}  // namespace duet
