// Executors run a model's operation list over micro-batch states. The plain executor runs one
// micro-batch straight through and ignores the yield markers; the overlap executors run two
// micro-batches (A and B, each its own ForwardState and dispatcher) through their lists and switch
// between them at the yields, so that one computes while the other's transfer is in flight.
//
// Stages: the operations before a list's first yield are its stage 0, those up to the next
// yield stage 1, and so on. The model's yields sit right after each send half (dispatch_send,
// combine_send), so a micro-batch's stage k + 1 begins with the receive half of what its stage k
// sent: the other micro-batch's stage runs in between, hiding the transfer.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "model/forward.h"

namespace duet {

// How a step that the group agreed to cut into two micro-batches runs them.
enum class OverlapMode {
  kNone,  // never micro-batch
  kTbo,   // --enable-two-batch-overlap: run_two_batch_overlap, one thread
  kDbo,   // --enable-dbo: run_dual_batch_overlap, two threads
};

const char* overlap_mode_name(OverlapMode mode);

// The stage offset of micro-batch B behind A for a step in `mode` (SGLang's delta_stages). 0 for
// both modes here: duet's yields sit right after each send half, so B must run between A's send
// and A's receive, which an offset would skip (SGLang's decode lists, with their attention cut in
// two, use 2).
int delta_stages(ForwardMode mode);

void run_plain(const std::vector<Operation>& ops, ForwardState& state);

// run_plain, adding each operation's wall time to `seconds` (for `bench latency --profile-ops`),
// and the parts operations time themselves (SubOpTimer) while it runs.
void run_plain_timed(const std::vector<Operation>& ops, ForwardState& state, OpSeconds& seconds);

// SGLang's two-batch overlap on the calling thread: A runs its first `delta_stages` stages alone,
// then the two alternate a stage at a time, A first (A k + delta, B k), then B finishes. A always
// leads, so B's stage of a layer runs after A's (the two-chunk split relies on it). The lists must
// have the same number of stages.
void run_two_batch_overlap(const std::vector<Operation>& ops, ForwardState& a, ForwardState& b,
                           int delta_stages);

// vLLM's dual-batch overlap: A and B each run on a thread of their own and hand the turn to each
// other at every yield (only one runs at a time). A micro-batch that yields with a receive half
// next registers it as a hook; the other thread runs that hook at its own next yield, before
// handing the turn back, so the wait for the transfer happens while the owner is parked. Runs
// A's thread on the caller; B's thread is `b_thread`'s (a long-lived worker the caller owns).
class DboWorker {
 public:
  DboWorker();
  ~DboWorker();  // joins the thread
  DboWorker(const DboWorker&) = delete;
  DboWorker& operator=(const DboWorker&) = delete;

  // Runs `job` on the worker's thread; wait() returns once it has (rethrowing what it threw).
  // REQUIRES: no job pending (start, then wait, then start again).
  void start(std::function<void()> job);
  void wait();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;    // GUARDED_BY(mu_): pending or running, empty once done
  bool done_ = true;             // GUARDED_BY(mu_)
  bool stop_ = false;            // GUARDED_BY(mu_)
  std::exception_ptr error_;     // GUARDED_BY(mu_)
  std::thread thread_;           // last: starts after the fields above exist
};

void run_dual_batch_overlap(const std::vector<Operation>& ops, ForwardState& a, ForwardState& b,
                            DboWorker& b_thread);

}  // namespace duet
