// Executors run a model's operation list over micro-batch states. The plain executor runs one
// micro-batch straight through and ignores the yield markers.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/forward.h"

namespace duet {

void run_plain(const std::vector<Operation>& ops, ForwardState& state);

// Wall seconds spent in each kind of operation, summed over layers and calls: the key is the
// operation's name without its layer prefix ("L3.attn" counts as "attn").
using OpSeconds = std::map<std::string, double>;

// run_plain, adding each operation's wall time to `seconds` (for `bench latency --profile-ops`).
void run_plain_timed(const std::vector<Operation>& ops, ForwardState& state, OpSeconds& seconds);

}  // namespace duet
