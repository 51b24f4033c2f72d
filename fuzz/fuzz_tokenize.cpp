// Tokenizer encode and streaming decode of arbitrary bytes, with make-model's byte-level BPE
// tokenizer (as Qwen3's and DeepSeek's are): the input's first half is encoded and decoded; its
// second half, read as ids, is decoded whole and one id at a time, which must agree (the
// documented contract of IncrementalDecoder). A disagreement aborts: a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/tokenizer.h"

namespace {

const duet::Tokenizer& tokenizer() {
  static const std::unique_ptr<duet::Tokenizer> tok = duet::Tokenizer::from_json(
      duet::build_bpe_tokenizer_json(512, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}),
      "make-model tokenizer");
  return *tok;
}

void decode_both_ways(const duet::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  const std::string whole = tok.decode(ids, skip);
  duet::IncrementalDecoder dec(tok, skip);
  std::string pieces;
  for (int32_t id : ids) pieces += dec.step(id);
  pieces += dec.finish();
  if (pieces != whole) {
    std::fprintf(stderr, "streaming decode '%s' != decode '%s'\n", pieces.c_str(), whole.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const duet::Tokenizer& tok = tokenizer();
  const size_t half = size / 2;
  const std::string text(reinterpret_cast<const char*>(data), half);
  const std::vector<int32_t> ids = tok.encode(text);
  decode_both_ways(tok, ids, false);
  std::vector<int32_t> raw;
  for (size_t i = half; i + 1 < size; i += 2)
    raw.push_back(static_cast<int32_t>((data[i] | data[i + 1] << 8) % tok.vocab_size()));
  decode_both_ways(tok, raw, false);
  decode_both_ways(tok, raw, true);
  return 0;
}
