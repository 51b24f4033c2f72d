// Added tokens (tokenizer.json's "added_tokens"): found in the text before normalization (or
// after it, for tokens marked "normalized"), leftmost-longest, with their single_word, lstrip and
// rstrip rules, as Hugging Face's AddedVocabulary does. Private to the tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace duet {

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, single_word, lstrip, rstrip, normalized;
};

class AddedTokenMatcher {
 public:
  // `content` is what is searched for (the normalized content for normalized tokens).
  void add(const AddedToken& token, std::string content);
  bool empty() const { return tokens_.empty(); }

  // A stretch of text: an added token (id >= 0) or text to encode (id == -1).
  struct Piece {
    int32_t id;
    size_t begin, end;  // bytes of the searched text
  };
  // Cuts `text` into pieces, in order; text pieces are never empty.
  void split(std::string_view text, std::vector<Piece>* out) const;

 private:
  // Finds an added token starting at `pos`; on success sets its span (stripping included) and id.
  bool match_at(std::string_view text, size_t pos, size_t floor, Piece* piece) const;

  struct Entry {
    std::string content;
    AddedToken token;
  };
  std::vector<Entry> tokens_;
  std::array<std::vector<int32_t>, 256> by_first_byte_;  // entries by first byte, longest first
};

}  // namespace duet
