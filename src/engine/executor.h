// Executors run a model's operation list over micro-batch states. The plain executor runs one
// micro-batch straight through and ignores the yield markers.
#pragma once

#include <vector>

#include "model/forward.h"

namespace duet {

void run_plain(const std::vector<Operation>& ops, ForwardState& state);

}  // namespace duet
