// Which cores a thread may run on: the CPU's version of SGLang's SM partition, a split of a
// rank's cores between its compute pool and its communication thread (`--comm-cores`).
#pragma once

#include <thread>
#include <vector>

namespace duet {

// The cores this process may run on (sched_getaffinity), in increasing order.
std::vector<int> allowed_cores();

// Restricts `t` (a running thread) to `cores`. Throws duet::Error naming the cores on failure.
void pin_thread(std::thread& t, const std::vector<int>& cores);
// The same for the calling thread.
void pin_this_thread(const std::vector<int>& cores);
// The cores the calling thread may run on.
std::vector<int> this_thread_cores();

// Names the calling thread as `perf`, `top -H` and debuggers show it (Linux keeps the first 15
// bytes). Best effort: a failure is ignored.
void name_this_thread(const char* name);

// How a rank's share of the process's cores is split: `share` is the rank's part of
// allowed_cores() (all of them, or an equal slice when `n_ranks` ranks are threads of this process
// and this is rank `rank`); the last `comm` of it go to the communication thread, the rest to
// compute. Throws duet::Error if the share has no core left for compute.
struct CoreSplit {
  std::vector<int> compute;
  std::vector<int> comm;
};
CoreSplit split_cores(const std::vector<int>& allowed, int rank, int n_ranks, int comm);

}  // namespace duet
