// The id <-> token tables of a tokenizer.json (model vocab and added tokens), shared by the
// tokenizer's parts. Private to the tokenizer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace duet {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

enum class IdKind : uint8_t { kNone, kModel, kAdded, kSpecial };

struct Vocab {
  // [n_ids] per id: the token string as written in tokenizer.json and its kind (kNone: no token
  // has this id).
  std::vector<std::string> id_token;
  std::vector<IdKind> id_kind;
  StringMap<int32_t> token_ids;  // token string -> id (added tokens win)

  int32_t size() const { return int32_t(id_kind.size()); }
  bool valid(int32_t id) const {
    return id >= 0 && size_t(id) < id_kind.size() && id_kind[id] != IdKind::kNone;
  }
  int32_t find(std::string_view token) const {
    auto it = token_ids.find(token);
    return it == token_ids.end() ? -1 : it->second;
  }
};

}  // namespace duet
