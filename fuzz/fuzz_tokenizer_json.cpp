// tokenizer.json: any text is either a tokenizer duet builds or refused by name; one that builds
// encodes and decodes a fixed text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto tok = duet::Tokenizer::from_json(text, "fuzz/tokenizer.json");
    const std::vector<int32_t> ids = tok->encode("Hello, wörld! 12 3\n\t<|im_end|>");
    tok->decode(ids);
  } catch (const duet::Error&) {
  }
  return 0;
}
