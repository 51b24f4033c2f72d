// Errors: one exception type for every expected failure (I/O, config, weights, requests),
// thrown at the boundary where the failure is found and caught where it is reported (the CLI,
// later the HTTP layer). Invariants use DUET_CHECK, which is always on and names the values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace duet {

// An expected failure with a one-line, user-facing message (no trailing newline).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond,
                                      const std::string& msg);
}  // namespace detail

}  // namespace duet

// Builds a message with stream syntax: DUET_ERROR("expected " << n << " dims") -> duet::Error.
#define DUET_ERROR(stream_expr)            \
  do {                                     \
    std::ostringstream duet_err_os_;       \
    duet_err_os_ << stream_expr;           \
    throw ::duet::Error(duet_err_os_.str()); \
  } while (0)

// Always-on invariant check: DUET_CHECK(a == b, "a " << a << " b " << b).
#define DUET_CHECK(cond, stream_expr)                                                   \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::ostringstream duet_chk_os_;                                                  \
      duet_chk_os_ << stream_expr;                                                      \
      ::duet::detail::throw_check_failure(__FILE__, __LINE__, #cond, duet_chk_os_.str()); \
    }                                                                                   \
  } while (0)
