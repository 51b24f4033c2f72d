#include "text/tokenizer_model.h"

#include <cstdio>

#include "core/error.h"
#include "text/tokenizer_byte_level.h"
#include "text/tokenizer_utf8.h"
#include "text/tokenizer_json.h"

namespace duet {

namespace {

using json = nlohmann::json;

constexpr std::string_view kMeta = "\xe2\x96\x81";  // ▁, SentencePiece's space

// "<0xAB>" -> 0xAB; -1 if `token` is not a byte-fallback token.
int fallback_byte(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

void BpeModel::set_model_token(int32_t id, const std::string& token, Vocab* vocab) {
  if (id < 0 || id >= vocab->size()) {
    DUET_ERROR("bad id " << id << " for token '" << token << "'");
  }
  vocab->id_token[id] = token;
  vocab->id_kind[id] = IdKind::kModel;
  vocab->token_ids[token] = id;
  model_ids_[token] = id;
  if (int b = fallback_byte(token); b >= 0) fallback_ids_[b] = id;
  if (byte_level_) {
    std::string raw;
    // A token outside the byte-level alphabet can never be produced by BPE on bytes.
    if (!byte_level::decode_token(token, &raw)) return;
    if (raw.size() == 1) byte_ids_[static_cast<unsigned char>(raw[0])] = id;
    if (ignore_merges_) word_ids_[raw] = id;
  } else {
    if (!token.empty() && utf8::is_valid(token)) {
      size_t i = 0;
      const char32_t cp = utf8::next(token, &i);
      if (i == token.size()) char_ids_[cp] = id;
    }
    if (ignore_merges_) word_ids_[token] = id;
  }
}

void BpeModel::parse(const json& j, bool byte_level, Vocab* vocab, const std::string& source) {
  const std::string type = j.value("type", std::string("BPE"));  // older files omit it
  if (type != "BPE") {
    DUET_ERROR(source << ": unsupported model type '" << type << "' (supported: BPE)");
  }
  byte_level_ = byte_level;
  byte_fallback_ = j.value("byte_fallback", false);
  fuse_unk_ = j.value("fuse_unk", false);
  ignore_merges_ = j.value("ignore_merges", false);
  if (j.contains("dropout") && !j.at("dropout").is_null() && j.at("dropout").get<double>() > 0) {
    DUET_ERROR(source << ": unsupported model option dropout " << j.at("dropout").dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && j.at(key).is_string() && !j.at(key).get<std::string>().empty()) {
      DUET_ERROR(source << ": unsupported model option " << key << " " << j.at(key).dump());
    }
  }
  if (!j.contains("vocab") || !j.at("vocab").is_object()) {
    DUET_ERROR(source << ": model.vocab must be an object (token -> id)");
  }
  byte_ids_.fill(-1);
  fallback_ids_.fill(-1);
  model_ids_.reserve(j.at("vocab").size());
  for (const auto& [token, id] : j.at("vocab").items()) {
    try {
      set_model_token(token_id_of(id, "model.vocab '" + token + "'"), token, vocab);
    } catch (const Error& e) {
      DUET_ERROR(source << ": " << e.what());
    }
  }
  if (j.contains("unk_token") && j.at("unk_token").is_string()) {
    auto it = model_ids_.find(j.at("unk_token").get<std::string>());
    if (it != model_ids_.end()) unk_id_ = it->second;
  }

  auto id_of = [&](const std::string& token, size_t rank) {
    auto it = model_ids_.find(token);
    if (it == model_ids_.end()) {
      DUET_ERROR(source << ": merge " << rank << " uses '" << token
                        << "', which is not in the vocab");
    }
    return it->second;
  };
  bool crossing = false;  // a merge that joins "...x" with "▁..." (x not ▁)
  static const json kNoMerges = json::array();
  const json& list = j.contains("merges") ? j.at("merges") : kNoMerges;
  merges_.reserve(list.size());
  for (size_t rank = 0; rank < list.size(); ++rank) {
    const json& m = list[rank];
    std::string left, right;
    if (m.is_string()) {  // "left right"
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        DUET_ERROR(source << ": merge " << rank << " '" << s
                          << "' is not two tokens split by a space");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {  // ["left", "right"]
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      DUET_ERROR(source << ": merge " << rank << " " << m.dump()
                        << " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    crossing |= !left.ends_with(kMeta) && right.starts_with(kMeta);
    const int32_t left_id = id_of(left, rank);
    const int32_t right_id = id_of(right, rank);
    merges_.add(left_id, right_id, int32_t(rank), id_of(left + right, rank));
  }
  split_at_meta_ = !byte_level_ && !ignore_merges_ && !crossing && model_ids_.count(kMeta) != 0;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>* ids) const {
  // As Hugging Face's BPE::merge_word: a symbol missing from the vocab becomes its byte tokens
  // when byte_fallback has them all, else unk_token (consecutive ones fused if fuse_unk), else
  // it is dropped. A pending unk is only written when a known symbol or the end follows.
  bool pending_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    int32_t id;
    if (byte_level_) {
      id = byte_ids_[static_cast<unsigned char>(word[i++])];
    } else {
      auto it = char_ids_.find(utf8::next(word, &i));
      id = it == char_ids_.end() ? -1 : it->second;
    }
    if (id >= 0) {
      if (pending_unk) ids->push_back(unk_id_), pending_unk = false;
      ids->push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = begin; k < i; ++k)
        all &= fallback_ids_[static_cast<unsigned char>(word[k])] >= 0;
      if (all) {
        for (size_t k = begin; k < i; ++k) {
          ids->push_back(fallback_ids_[static_cast<unsigned char>(word[k])]);
        }
        continue;
      }
    }
    if (unk_id_ < 0) continue;
    if (pending_unk && !fuse_unk_) ids->push_back(unk_id_);
    pending_unk = true;
  }
  if (pending_unk) ids->push_back(unk_id_);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (!split_at_meta_) {
    encode_piece(word, out);
    return;
  }
  // No merge joins a symbol ending in a character other than ▁ with one starting with ▁, so
  // BPE of the whole word is BPE of its pieces cut before each such ▁: the same ids, but linear
  // time and cacheable pieces for SentencePiece models, whose word is a whole stretch of text.
  size_t start = 0;
  for (size_t pos = word.find(kMeta, 1); pos != std::string_view::npos;
       pos = word.find(kMeta, pos + kMeta.size())) {
    if (pos >= start + kMeta.size() && word.substr(pos - kMeta.size(), kMeta.size()) == kMeta) {
      continue;  // inside a run of ▁
    }
    if (pos > start) encode_piece(word.substr(start, pos - start), out);
    start = pos;
  }
  encode_piece(word.substr(start), out);
}

void BpeModel::encode_piece(std::string_view word, std::vector<int32_t>* out) const {
  if (ignore_merges_) {  // Llama-3: a word that is itself a token is taken whole
    auto it = word_ids_.find(word);
    if (it != word_ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() > 1 && word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  initial_symbols(word, &ids);
  merges_.apply(&ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace duet
