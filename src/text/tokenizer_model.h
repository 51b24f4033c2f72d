// The BPE model of a tokenizer.json: vocab, merges, unk_token, byte_fallback, fuse_unk and
// ignore_merges, as Hugging Face's BPE applies them to one word. Two modes:
//  - byte-level (the pre-tokenizer ends with ByteLevel): words are raw bytes and each byte is a
//    symbol; the byte-level alphabet is undone at load, so encoding never maps text into it;
//  - characters (SentencePiece style, e.g. Llama-2 / Mixtral): each UTF-8 character is a symbol,
//    and a character missing from the vocab becomes its <0xXX> byte tokens (byte_fallback) or
//    unk_token.
// Private to the tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer_bpe.h"
#include "text/tokenizer_vocab.h"

namespace duet {

class BpeModel {
 public:
  // Reads tokenizer.json's "model" into *vocab (sized beforehand) and the merge table. Throws
  // duet::Error naming the file and an unsupported type or option.
  void parse(const nlohmann::json& j, bool byte_level, Vocab* vocab, const std::string& source);

  bool byte_level() const { return byte_level_; }
  bool byte_fallback() const { return byte_fallback_; }

  // Appends the ids of one word (raw bytes in byte-level mode, UTF-8 text otherwise).
  // Thread-safe.
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

 private:
  void encode_piece(std::string_view word, std::vector<int32_t>* out) const;
  // Initial symbols of `word` before any merge (unk and byte fallback applied).
  void initial_symbols(std::string_view word, std::vector<int32_t>* ids) const;
  void set_model_token(int32_t id, const std::string& token, Vocab* vocab);

  bool byte_level_ = true;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool split_at_meta_ = false;  // characters mode: see encode_word()
  int32_t unk_id_ = -1;
  std::array<int32_t, 256> byte_ids_;               // byte-level: id of each single byte, or -1
  std::array<int32_t, 256> fallback_ids_;           // id of token "<0xXX>" per byte, or -1
  std::unordered_map<char32_t, int32_t> char_ids_;  // characters mode: single-character tokens
  StringMap<int32_t> model_ids_;  // token string -> id, model vocab only (merges refer to it)
  StringMap<int32_t> word_ids_;   // ignore_merges: whole word (bytes or text) -> id
  BpeMerges merges_;

  static constexpr size_t kMaxCacheEntries = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 64;
  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;  // GUARDED_BY(cache_mutex_): word -> ids
};

}  // namespace duet
