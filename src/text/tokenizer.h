// BPE tokenizer read from a Hugging Face tokenizer.json, encoding and decoding as Hugging Face's
// tokenizers library does. Two families are supported:
//  - byte-level BPE (Qwen2/3, DeepSeek-V2/V3, Llama 3): NFC normalizer, Split pre-tokenizers with
//    their regexes (PCRE2), ByteLevel pre-tokenizer and decoder;
//  - SentencePiece-style BPE (Llama-2, Mistral, Mixtral): Prepend/Replace normalizers or a
//    Metaspace pre-tokenizer, byte_fallback, and the Replace/ByteFallback/Fuse/Strip or Metaspace
//    decoders;
// with added and special tokens. Any other component is refused by name at load.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace duet {

class Tokenizer {
 public:
  // Reads dir/tokenizer.json (and dir/tokenizer_config.json for bos/eos names if present), or,
  // where there is no tokenizer.json, Kimi's tiktoken tokenizer: dir/tiktoken.model with the
  // tokenizer_config.json whose auto_map names tokenization_kimi's TikTokenTokenizer (its 256
  // special tokens after the ranks, named by added_tokens_decoder; Kimi's pre-tokenizer regex).
  // Throws duet::Error naming the file and the unsupported component.
  static std::unique_ptr<Tokenizer> load(const std::string& dir);
  // Whether dir has a tokenizer for load(): a tokenizer.json or a tiktoken.model.
  static bool exists(const std::string& dir);
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json_text,
                                              const std::string& source_name);
  ~Tokenizer();

  // Text -> ids, as Hugging Face's encode(text, add_special_tokens=False): added tokens written
  // literally in the text are matched as themselves (leftmost, longest first). Never adds BOS/EOS
  // or any other template token: the engine adds BOS when the model config asks. Any bytes are
  // accepted: byte-level tokenizers encode invalid UTF-8 bytes as single-byte tokens, others read
  // them as U+FFFD. With an NFC normalizer (Qwen2/3), decode(encode(t)) is NFC(t). Thread-safe.
  std::vector<int32_t> encode(const std::string& text) const;
  // Ids -> text, as Hugging Face's decode(ids, skip_special_tokens): skip_special drops added
  // tokens marked special; the result is valid UTF-8 (invalid or cut-off byte sequences become
  // U+FFFD). Throws duet::Error on an id that is not a token. Thread-safe.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // number of ids (model vocab + added tokens)
  int32_t token_to_id(const std::string& token) const;  // -1 if absent
  const std::string& id_to_token(int32_t id) const;     // throws duet::Error if not a token

  // Ids of tokenizer_config.json's bos_token / eos_token (load() only); -1 if not named.
  int32_t bos_id() const;
  // tokenizer_config.json's add_bos_token (load() only): prompts start with BOS.
  bool add_bos_token() const;
  int32_t eos_id() const;

 private:
  friend class IncrementalDecoder;
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenization for one sequence: feed the generated ids one at a time and get the
// text each one completes. A piece never ends inside a UTF-8 character, and the concatenation of
// all pieces plus finish() is exactly tokenizer.decode(all ids, skip_special). Text is held back
// only while a later token can still change it: an incomplete character (byte-level) or a run
// of <0xXX> byte tokens (byte fallback). Not thread-safe; the tokenizer must outlive it.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special);
  ~IncrementalDecoder();
  IncrementalDecoder(IncrementalDecoder&&) noexcept;
  IncrementalDecoder& operator=(IncrementalDecoder&&) noexcept;

  // The newly completed text (often empty). Throws duet::Error on an id that is not a token.
  std::string step(int32_t id);
  // What is still held back, at the end of the sequence (an incomplete character becomes
  // U+FFFD, as in decode()). The decoder may not be stepped afterwards.
  std::string finish();

 private:
  struct State;
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::unique_ptr<State> state_;
};

// `bytes` with every invalid UTF-8 sequence replaced by U+FFFD, as Hugging Face's decode
// (from_utf8_lossy) does; for printing whole decoded texts.
std::string utf8_lossy(const std::string& bytes);

// tiktoken's BPE as a tokenizer.json text, which Tokenizer::from_json reads: ranks_text is a
// tiktoken.model (a line "<base64 token bytes> <rank>" per token, ranks 0..n-1, all 256 bytes
// among the tokens); each token's id is its rank, and the n_reserved special tokens follow them,
// named by named_specials (id -> text) or "<|reserved_token_ID|>". Pre-tokenized by `pattern`
// (Oniguruma syntax) and ByteLevel; encodes as tiktoken does: a pre-token that is a token is
// taken whole, else its bytes are joined pair by pair, the join of the lowest rank first (every
// split of a token into two tokens is a merge of the token's rank, as in Hugging Face's
// TikTokenConverter). Throws duet::Error naming `source` and the line for malformed ranks.
std::string tiktoken_tokenizer_json(const std::string& ranks_text, const std::string& source,
                                    const std::map<int64_t, std::string>& named_specials,
                                    int32_t n_reserved, const char* pattern);
// A tiktoken.model text of n_tokens ranks for a generated model: the tokens of
// build_bpe_tokenizer_json's BPE, in the order it learns them.
std::string build_tiktoken_ranks(int32_t n_tokens);

// Builds the tokenizer.json text for a generated model: byte-level BPE whose merges are learned
// deterministically from a built-in corpus, with exactly `vocab_size` ids in total, of which the
// last ones are the special tokens named in `specials` (e.g. "<|endoftext|>"), added as special.
// The pre-tokenizer is a Split with the Qwen2-style regex plus ByteLevel, as real checkpoints use.
std::string build_bpe_tokenizer_json(int32_t vocab_size, const std::vector<std::string>& specials);

}  // namespace duet
