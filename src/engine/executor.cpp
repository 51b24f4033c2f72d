#include "engine/executor.h"

#include <chrono>

namespace duet {

void run_plain(const std::vector<Operation>& ops, ForwardState& state) {
  for (const Operation& op : ops) {
    if (!op.is_yield()) op.run(state);
  }
}

void run_plain_timed(const std::vector<Operation>& ops, ForwardState& state, OpSeconds& seconds) {
  using Clock = std::chrono::steady_clock;
  struct Scope {  // the parts' timers see `seconds` only while this call runs
    ForwardState& state;
    ~Scope() { state.op_seconds = nullptr; }
  } scope{state};
  state.op_seconds = &seconds;
  for (const Operation& op : ops) {
    if (op.is_yield()) continue;
    const Clock::time_point t0 = Clock::now();
    op.run(state);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds[op_kind_name(op.kind)] += s;
  }
}

}  // namespace duet
