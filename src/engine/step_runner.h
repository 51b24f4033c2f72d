// The one step path (DESIGN §3) for any group of ranks, a single rank being a group of one:
//
//   front end (Generator, LlmEngine)      StepRunner::run                    front end
//   schedule: pick the batch, reserve  →  agree with every rank (plan_step)  →  process outputs:
//   its KV rows, build ForwardInput       tell the dispatchers the shape        sample, stop
//                                         run the batch, or the dummy batch     checks, streams
//
// Every rank calls run() once per step, with its batch or an empty one; all ranks then take the
// same plan (forward mode, padding, micro-batches or not), and a rank with nothing to do runs a
// one-token dummy batch so the experts' all-to-alls always have every rank. run() returns the
// plan and this rank's logits; what the front end does with them is its own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/thread_pool.h"
#include "dist/coordinator.h"
#include "engine/kv_cache.h"
#include "engine/micro_batch_split.h"
#include "engine/model_runner.h"
#include "engine/step_agreement.h"
#include "model/forward.h"
#include "model/model.h"

namespace duet {

// Where a step path sits: its group's coordinator (null: a group of one), the factory of its
// micro-batch slots' dispatchers (empty: the single-rank LocalDispatcher), and how it overlaps.
// Every rank of a group uses the same overlap settings.
struct StepGroup {
  Coordinator* coord = nullptr;
  DispatcherFactory dispatchers;
  // kTbo / kDbo: steps the group agrees to cut (micro_batch's thresholds) run as two micro-batches
  // with that executor. micro_batch.enabled follows it.
  OverlapMode overlap = OverlapMode::kNone;
  MicroBatchPolicy micro_batch;
  double tbo_distribution_threshold = kDefaultTboDistributionThreshold;  // the splitter's
  // Single-batch overlap (--sbo-shared-experts): where each MoE layer's shared experts run, while
  // the dispatch or while the combine travels. Unset: the executor's order (DBO: the combine,
  // as seed 000 schedules it; plain and TBO: the dispatch).
  std::optional<SharedExpertsAt> shared_experts_at;
  // --trace-file: the steps' agreement and plan and every operation become spans of this trace
  // (null: none). Must outlive the step runner.
  Trace* trace = nullptr;
};

// What the step path did, for benchmarks and tests.
struct StepStats {
  int64_t steps = 0;         // steps the group ran (not idle)
  int64_t dummy_steps = 0;   // of which this rank ran the dummy batch
  double agree_seconds = 0;  // in the agreement's all-gather
  int64_t micro_batch_steps = 0;  // steps run as two micro-batches (dummy pairs included)
  // The step gap (issue 18's measure of what the engine does between forward passes): wall time
  // from the end of one forward pass to the start of the next, over `gaps` consecutive pairs of
  // steps (the first step after idle() has none), and the forward passes' own time.
  double gap_seconds = 0;
  int64_t gaps = 0;
  double forward_seconds = 0;
};

class StepRunner {
 public:
  // model, pool and group.coord (if set) must outlive the runner.
  StepRunner(const Model& model, ThreadPool& pool, const StepGroup& group = {});

  struct Launch {
    StepPlan plan;                               // the group's agreed plan
    const std::vector<float>* logits = nullptr;  // this rank's [in.out_rows, n_vocab], or null
                                                 // (idle or dummy step); valid until next run()
  };

  // Collective: one step of the group. `in` is this rank's batch (empty: nothing to run here),
  // its KV rows reserved in `kv`; has_prefill says whether it processes prompt tokens. Sets
  // in.mode to the group's mode. Throws duet::Error if the group fails (a rank is missing).
  Launch run(ForwardInput& in, KvStore& kv, bool has_prefill);

  // run() in its two halves, for a front end that agrees on step N+1 on one thread while step N
  // computes on another (the overlapped scheduler). agree_step() is collective on the group's
  // coordinator only; execute() on its data plane only (the communicator and its thread), so the
  // two may run on different threads at once, each half in one order on every rank.
  // agree_step(): the group's plan for this rank's batch `in` (empty: nothing to run here); a
  // plan that does not run marks the runner idle().
  // n_steps: the decode steps this batch could run in one go (multi-step; see StepOffer).
  StepPlan agree_step(const ForwardInput& in, bool has_prefill, int64_t n_steps = 1);
  // Runs `plan` (plan.runs()): this rank's batch, or the dummy batch when plan.dummy.
  Launch execute(const StepPlan& plan, ForwardInput& in, KvStore& kv);

  // The front end has no more work for now (a batch is done, the server is idle): the time
  // until the next step is not a step gap.
  // Thread-safe: may be called by the thread of agree_step() while another runs execute().
  void idle() { idle_.store(true, std::memory_order_relaxed); }

  Coordinator& coord() { return *coord_; }
  bool solo() const { return coord_->world_size() == 1; }
  ModelRunner& runner() { return runner_; }
  // The counts so far. Not while execute() runs on another thread (that thread's own copy
  // is execute_stats()).
  StepStats stats() const {
    StepStats s = stats_;
    s.agree_seconds = agree_seconds_;
    return s;
  }
  // The counts execute() keeps (agree_seconds is agree_step()'s and reads 0 here): for the
  // thread that runs execute().
  const StepStats& execute_stats() const { return stats_; }
  // The measured split choice's table (--dbo-split auto), for logs; "" without it. On the thread
  // of agree_step().
  std::string split_times() const { return split_times_ ? split_times_->describe() : ""; }

 private:
  // The one-token dummy batch, or a pair of them when the group micro-batches.
  void run_dummy(ForwardMode mode, bool pair);

  std::unique_ptr<Coordinator> solo_;  // the coordinator of a group of one
  Coordinator* coord_;
  OverlapMode overlap_;
  MicroBatchPolicy policy_;
  double distribution_threshold_;
  ModelRunner runner_;
  // The dummy batches: token 0 at position 0 of a sequence of their own (one per micro-batch), in
  // a cache of their own, so that they never take a row of the front end's KV store.
  KvCache dummy_kv_;
  ForwardInput dummy_in_[2];
  Trace* trace_;
  StepStats stats_;      // execute()'s thread
  double agree_seconds_ = 0;  // agree_step()'s thread
  std::chrono::steady_clock::time_point last_forward_end_;  // execute()'s thread
  std::atomic<bool> idle_{false};  // set by idle(): execute() forgets last_forward_end_
  // The measured split choice: the group's table (agree_step()'s thread), and this rank's forward
  // times of its last running plans (execute() adds, agree_step() offers the one kLag back).
  std::optional<SplitTimes> split_times_;
  struct PlanTime {
    int64_t index = -1;
    int64_t ns = 0;
    int64_t steps = 0;
  };
  std::mutex plan_times_mu_;
  PlanTime plan_times_[SplitTimes::kLag + 2];  // GUARDED_BY(plan_times_mu_), by index modulo
  void add_plan_time(int64_t index, int64_t ns);
  int64_t plan_time(int64_t index);  // ns per step, or -1
};

}  // namespace duet
