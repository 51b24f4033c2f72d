// tiktoken.model (Kimi's tokenizer): any text is either a tokenizer duet builds or refused by name
// and line; one that builds encodes and decodes a fixed text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/tokenizer_regex.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const std::string json = duet::tiktoken_tokenizer_json(text, "fuzz/tiktoken.model",
                                                           {}, 4, duet::kKimiPattern);
    auto tok = duet::Tokenizer::from_json(json, "fuzz/tiktoken.model");
    const std::vector<int32_t> ids = tok->encode("Hello, wörld! 中文English 12345\n\t<|im_end|>");
    tok->decode(ids);
  } catch (const duet::Error&) {
  }
  return 0;
}
