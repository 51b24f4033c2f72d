#include "core/error.h"

namespace duet::detail {

void throw_check_failure(const char* file, int line, const char* cond, const std::string& msg) {
  std::ostringstream os;
  os << "internal error: check failed at " << file << ":" << line << ": " << cond;
  if (!msg.empty()) os << " (" << msg << ")";
  throw Error(os.str());
}

}  // namespace duet::detail
