// The OpenAI request bodies: completions (first byte even) and chat completions (odd), every field.
// A body is either accepted or refused with duet::Error (the server's 400); nothing else may
// happen.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "server/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    duet::parse_api_request(body, chat);
  } catch (const duet::Error&) {
  }
  return 0;
}
