#include "server/api_error.h"

#include <cstdio>

namespace duet {

void throw_bad_field(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

ErrorReply error_reply(const ApiError& e) {
  nlohmann::json err = {{"message", e.what()},
                        {"type", e.type},
                        {"param", e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param)},
                        {"code", e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code)}};
  return {e.status, {{"error", err}}};
}

ErrorReply error_reply(const std::exception& e) {
  if (const auto* api = dynamic_cast<const ApiError*>(&e)) return error_reply(*api);
  if (dynamic_cast<const Error*>(&e)) return error_reply(ApiError(400, e.what()));
  std::fprintf(stderr, "error: internal error while serving a request: %s\n", e.what());
  return error_reply(ApiError(500, std::string("internal server error: ") + e.what(),
                              "internal_server_error"));
}

std::string excerpt(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "... (" + std::to_string(s.size()) + " bytes)";
}

}  // namespace duet
