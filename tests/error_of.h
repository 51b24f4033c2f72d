// The message of the duet::Error a callable throws, for the tests of refusals.
#pragma once

#include <string>

#include "core/error.h"

namespace duet::test {

// Runs `fn` and returns the message of the duet::Error it throws ("" if none).
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace duet::test
