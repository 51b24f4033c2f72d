// The pre-tokenizer of a tokenizer.json: Split (regex or literal, every behavior), ByteLevel,
// Metaspace and Sequence of them; it cuts normalized text into the words that BPE encodes one
// by one. Private to the tokenizer.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_regex.h"

namespace duet {

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Cuts piece p at its matches as Hugging Face's Split does for `behavior` and `invert`; appends
// the non-empty pieces to *out.
void split_piece(std::string_view p, const std::vector<TextSpan>& matches, SplitBehavior behavior,
                 bool invert, std::vector<std::string_view>* out);

class PreTokenizer {
 public:
  // Appends the steps of `j` (tokenizer.json's "pre_tokenizer"; null is none). Throws
  // duet::Error naming an unsupported type, or a ByteLevel that is not the last step.
  void parse(const nlohmann::json& j, const std::string& source);

  // True when the last step is ByteLevel: words are then raw bytes for byte-level BPE.
  bool byte_level() const { return !steps_.empty() && steps_.back().kind == Kind::kByteLevel; }

  // Cuts `text` (valid UTF-8) into words, appended to *words. `at_input_start`: the text starts
  // the whole input (Metaspace's prepend_scheme "first"). Words point into `text` or into strings
  // added to *arena (a deque, so they stay put).
  void split(std::string_view text, bool at_input_start, std::deque<std::string>* arena,
             std::vector<std::string_view>* words) const;

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    Kind kind;
    std::shared_ptr<TokenRegex> regex;  // Split; ByteLevel with use_regex (GPT-2's pattern)
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel: prepend ' ' to a piece not starting with one
    std::string replacement;        // Metaspace (usually U+2581)
    Prepend prepend = Prepend::kAlways;
    bool metaspace_split = true;
  };
  void parse_step(const nlohmann::json& j, const std::string& type, const std::string& source);
  void metaspace(const Step& step, std::string_view p, bool first, std::deque<std::string>* arena,
                 std::vector<std::string_view>* out) const;

  std::vector<Step> steps_;
};

}  // namespace duet
