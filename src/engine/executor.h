// Executors run a model's operation list over micro-batch states. The plain executor runs one
// micro-batch straight through and ignores the yield markers.
#pragma once

#include <vector>

#include "model/forward.h"

namespace duet {

void run_plain(const std::vector<Operation>& ops, ForwardState& state);

// run_plain, adding each operation's wall time to `seconds` (for `bench latency --profile-ops`),
// and the parts operations time themselves (SubOpTimer) while it runs.
void run_plain_timed(const std::vector<Operation>& ops, ForwardState& state, OpSeconds& seconds);

}  // namespace duet
