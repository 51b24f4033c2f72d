// The in-process backend: ranks are threads of one process that meet in a shared InprocHub.
// Collectives copy straight between the ranks' buffers (one copy per byte, no staging).
// run_ranks() is the launcher for tests and for `--distributed-backend inproc`.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/coordinator.h"
#include "dist/dist_context.h"
#include "dist/inproc_hub.h"

namespace duet {

// Rank `rank`'s coordinator and communicator on `hub` (which they keep alive).
DistContext make_inproc_context(std::shared_ptr<InprocHub> hub, int rank);

// Makes an in-process rank silent from now on, as stopping its process (SIGSTOP) silences an MPI
// rank: its peers' waits for it give up once it has been silent for the watchdog time. For
// tests of a hung rank. Throws duet::Error if ctx is not an in-process rank.
void stop_answering(DistContext& ctx);

// Runs fn on `world_size` ranks, each on its own thread with its own context, and returns when
// all have returned. A rank that throws aborts the hub, so the others fail at their next (or
// current) collective instead of waiting for it; a rank that returns falls silent
// (InprocHub::stop_answering), so a peer still waiting for it gives up after the watchdog time.
// Returns each rank's error message, empty for a rank that succeeded.
std::vector<std::string> run_ranks_collect(int world_size,
                                           const std::function<void(DistContext&)>& fn,
                                           std::chrono::milliseconds watchdog = kDefaultWatchdog);

// As run_ranks_collect, but throws duet::Error("rank R: ...") for the rank that failed first.
void run_ranks(int world_size, const std::function<void(DistContext&)>& fn,
               std::chrono::milliseconds watchdog = kDefaultWatchdog);

}  // namespace duet
