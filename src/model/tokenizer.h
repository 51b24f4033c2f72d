// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (model.type "BPE", ByteLevel
// pre-tokenizer and decoder, optional Split pre-tokenizer with a PCRE2 regex, added tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace duet {

class Tokenizer {
 public:
  // Reads dir/tokenizer.json (and dir/tokenizer_config.json for bos/eos names if present).
  // Throws duet::Error naming the file and the unsupported component.
  static std::unique_ptr<Tokenizer> load(const std::string& dir);
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json_text,
                                              const std::string& source_name);
  ~Tokenizer();

  // Text -> ids. Special/added tokens written literally in the text are matched as themselves
  // (longest first, left to right). Never adds BOS/EOS or any other template token: the engine
  // adds BOS when the model config asks. Any bytes are accepted; invalid UTF-8 bytes become
  // single-byte tokens. With an NFC normalizer (Qwen2/3), decode(encode(t)) is NFC(t). Thread-safe.
  std::vector<int32_t> encode(const std::string& text) const;
  // Ids -> text (byte-level decode); skip_special drops added tokens marked special. Returns the
  // raw bytes, which may end in the middle of a UTF-8 character when `ids` does (no U+FFFD
  // replacement). Throws duet::Error on an id that is not a token.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // number of ids (model vocab + added tokens)
  int32_t token_to_id(const std::string& token) const;  // -1 if absent
  const std::string& id_to_token(int32_t id) const;     // throws duet::Error if not a token

  // Ids of tokenizer_config.json's bos_token / eos_token (load() only); -1 if not named.
  int32_t bos_id() const;
  int32_t eos_id() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `bytes` with every invalid UTF-8 sequence replaced by U+FFFD, as Hugging Face's decode
// (from_utf8_lossy) does; for printing whole decoded texts.
std::string utf8_lossy(const std::string& bytes);

// Builds the tokenizer.json text for a generated model: byte-level BPE whose merges are learned
// deterministically from a built-in corpus, with exactly `vocab_size` ids in total, of which the
// last ones are the special tokens named in `specials` (e.g. "<|endoftext|>"), added as special.
// The pre-tokenizer is a Split with the Qwen2-style regex plus ByteLevel, as real checkpoints use.
std::string build_bpe_tokenizer_json(int32_t vocab_size, const std::vector<std::string>& specials);

}  // namespace duet
