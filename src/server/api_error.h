// Errors of the OpenAI-compatible API and the one place that turns any exception into an HTTP
// status and an OpenAI error object {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace duet {

// A request error with its HTTP status. A plain duet::Error thrown while handling a request is
// the client's fault too (400, invalid_request_error).
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message, std::string type = "invalid_request_error",
           std::string param = "", std::string code = "")
      : Error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}

  int status;
  std::string type;
  std::string param;  // the offending request field, if any
  std::string code;
};

// Client input quoted in an error message: at most `max` bytes of it (cut at a UTF-8 character
// boundary), followed by "... (N bytes)" when longer, so that an error never echoes a large body.
std::string excerpt(const std::string& s, size_t max = 64);

// 400 naming the request field.
[[noreturn]] void throw_bad_field(const std::string& param, const std::string& message);

struct ErrorReply {
  int status = 500;
  nlohmann::json body;
};

// ApiError → its status; duet::Error → 400; anything else → 500 (a server bug, logged).
ErrorReply error_reply(const std::exception& e);
ErrorReply error_reply(const ApiError& e);

}  // namespace duet
