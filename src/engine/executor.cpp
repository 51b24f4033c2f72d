#include "engine/executor.h"

namespace duet {

void run_plain(const std::vector<Operation>& ops, ForwardState& state) {
  for (const Operation& op : ops) {
    if (!op.is_yield()) op.run(state);
  }
}

}  // namespace duet
