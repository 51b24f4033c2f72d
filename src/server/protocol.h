// The OpenAI request and response bodies of /v1/completions and /v1/chat/completions: parsing
// with type and range checks (every problem is an ApiError naming the field) and the JSON of
// responses and stream chunks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"

namespace duet {

// A parsed request, before tokenisation.
struct ApiRequest {
  bool chat = false;
  std::string model;                    // empty: not given
  std::string prompt_text;              // completions: a text prompt ...
  std::vector<int32_t> prompt_ids;      // ... or token ids (prompt_is_ids)
  bool prompt_is_ids = false;
  nlohmann::json messages;              // chat: [{role, content: string}]
  std::optional<int64_t> max_tokens;    // not given: 16 for completions, the rest of the
                                        // context for chat
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;
};

// Parses a request body. Throws ApiError (400) for malformed JSON, wrong types, out-of-range or
// unsupported values and unknown fields.
ApiRequest parse_api_request(const std::string& body, bool chat);

// What every response and chunk of one request shares.
struct ResponseMeta {
  bool chat = false;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

nlohmann::json usage_json(const Usage& u);
// The whole non-streamed response.
nlohmann::json response_json(const ResponseMeta& m, const std::string& text,
                             const std::string& finish_reason, const Usage& u);
// One streamed chunk: a text delta, and finish_reason once done (empty: null). For chat, the
// first chunk carries the assistant role (first_chat_chunk). include_usage adds "usage": null.
nlohmann::json chunk_json(const ResponseMeta& m, const std::string& text,
                          const std::string& finish_reason, bool first_chat_chunk,
                          bool include_usage);
// chunk_json(...) as the server-sent event it goes out in ("data: " + its dump() + "\n\n"), byte
// for byte, written straight into a string: a stream sends one per token, and building the JSON
// tree cost some 60 allocations each. Text that is not valid UTF-8 takes chunk_json's path.
std::string chunk_event(const ResponseMeta& m, const std::string& text,
                        const std::string& finish_reason, bool first_chat_chunk,
                        bool include_usage);
// The final usage-only chunk (stream_options.include_usage): empty choices.
nlohmann::json usage_chunk_json(const ResponseMeta& m, const Usage& u);

}  // namespace duet
