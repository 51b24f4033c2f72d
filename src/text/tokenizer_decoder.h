// The decoder of a tokenizer.json, run as a stream: tokens go in one at a time and text comes
// out as soon as no later token can change it. Whole-sequence decoding is the same stream
// flushed at the end, so streamed pieces always concatenate to exactly the whole decode.
//
// Supported decoders (the shapes real checkpoints use):
//  - ByteLevel (Qwen2/3, DeepSeek-V2/V3, Llama 3): tokens become bytes; invalid UTF-8 is replaced
//    by U+FFFD as Rust's from_utf8_lossy does; an incomplete trailing character is held back.
//  - Sequence of per-token Replace (String pattern) / Metaspace, then ByteFallback, Fuse and
//    Strip (Llama-2, Mistral, Mixtral): a run of <0xXX> tokens is held until it ends, then becomes
//    its text if valid UTF-8 and one U+FFFD per byte otherwise (as Hugging Face's ByteFallback).
// Private to the tokenizer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer_vocab.h"

namespace duet {

// Where one stream stands between tokens.
struct DecodeState {
  std::string pending;     // byte-level: an incomplete character; else: a run of byte tokens
  int64_t n_tokens = 0;    // tokens decoded so far (special tokens skipped do not count)
  int32_t strip_left = 0;  // Strip: leading characters still to drop (set by begin())
};

class TokenDecoder {
 public:
  // Reads tokenizer.json's "decoder". Throws duet::Error naming an unsupported type or order.
  void parse(const nlohmann::json& j, const std::string& source);
  // Precomputes each id's text. REQUIRES: the vocab is complete (added tokens included).
  void prepare(const Vocab& vocab);

  DecodeState begin() const;
  // Appends to *out the text that token `id` completes. Throws duet::Error on an unknown id.
  void push(DecodeState* state, int32_t id, bool skip_special, std::string* out) const;
  // Appends whatever is held back (an incomplete character becomes U+FFFD).
  void finish(DecodeState* state, std::string* out) const;

 private:
  void emit(DecodeState* state, std::string_view text, std::string* out) const;
  void flush_bytes(DecodeState* state, std::string* out) const;
  std::string apply_token_steps(std::string token, bool first) const;

  struct TokenStep {  // a per-token string replacement (Replace, or Metaspace's ▁ -> ' ')
    std::string from, to;
    bool metaspace = false;  // on the first token, `from` is dropped instead
  };

  std::string source_;
  const Vocab* vocab_ = nullptr;
  bool byte_level_ = false;
  std::vector<TokenStep> token_steps_;
  bool byte_fallback_ = false;
  bool fused_ = false;
  std::string strip_content_;  // Strip (after Fuse): the character dropped at the start
  int32_t strip_start_ = 0;

  // [n_ids] the text each id adds (bytes for byte-level), its variant as the first token
  // (Metaspace), and the byte of a <0xXX> token (-1 otherwise).
  std::vector<std::string> piece_;
  std::vector<std::string> first_piece_;
  std::vector<int16_t> byte_;
};

}  // namespace duet
