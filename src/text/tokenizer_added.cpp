#include "text/tokenizer_added.h"

#include <algorithm>

#include "text/tokenizer_utf8.h"

namespace duet {

namespace {

// Start of the UTF-8 character that ends at `end` (exclusive).
size_t char_start_before(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Whether the character at or before a boundary is a word character (alphanumeric or '_'), as
// single_word checks it. Non-ASCII characters count as word characters.
bool is_word_char(std::string_view s, size_t begin) {
  const auto c = static_cast<unsigned char>(s[begin]);
  return c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         c == '_';
}

bool whitespace_at(std::string_view s, size_t i) {
  if (utf8::stable_end(s.substr(i, 4)) == 0) return false;  // a cut-off character
  return utf8::is_whitespace(utf8::next(s, &i));
}

}  // namespace

void AddedTokenMatcher::add(const AddedToken& token, std::string content) {
  if (content.empty()) return;
  const auto first = static_cast<unsigned char>(content[0]);
  tokens_.push_back({std::move(content), token});
  auto& candidates = by_first_byte_[first];
  candidates.push_back(int32_t(tokens_.size() - 1));
  std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].content.size() > tokens_[b].content.size();
  });
}

bool AddedTokenMatcher::match_at(std::string_view text, size_t pos, size_t floor,
                                 Piece* piece) const {
  for (int32_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    const Entry& e = tokens_[index];
    if (text.compare(pos, e.content.size(), e.content) != 0) continue;
    size_t begin = pos, end = pos + e.content.size();
    if (e.token.single_word && ((begin > 0 && is_word_char(text, char_start_before(text, begin))) ||
                                (end < text.size() && is_word_char(text, end)))) {
      continue;
    }
    if (e.token.lstrip) {
      while (begin > floor) {
        const size_t prev = char_start_before(text, begin);
        if (prev < floor || !whitespace_at(text, prev)) break;
        begin = prev;
      }
    }
    if (e.token.rstrip) {
      while (end < text.size() && whitespace_at(text, end)) {
        size_t i = end;
        utf8::next(text, &i);
        end = i;
      }
    }
    *piece = {e.token.id, begin, end};
    return true;
  }
  return false;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>* out) const {
  size_t done = 0;  // start of the text not yet cut
  for (size_t pos = 0; pos < text.size(); ++pos) {
    if (by_first_byte_[static_cast<unsigned char>(text[pos])].empty()) continue;
    Piece piece;
    if (!match_at(text, pos, done, &piece)) continue;
    if (piece.begin > done) out->push_back({-1, done, piece.begin});
    out->push_back(piece);
    done = piece.end;
    pos = piece.end - 1;
  }
  if (done < text.size()) out->push_back({-1, done, text.size()});
}

}  // namespace duet
