// Runs the engine's steps: resolves the placeholders in a step's input, runs it through the step
// path's execute half, samples its rows and stores the tokens where the next step will find them.
//
// Overlapped (the overlapped scheduler, on by default in serve): a thread of its own runs the
// launched steps one after another while the engine thread processes the previous step's
// outputs and schedules the next (SGLang's CPU/GPU overlap, seed 003, with the forward pass in
// the role of the GPU stream). Not overlapped: launch() runs the step before it returns. Both are
// the same code; only the thread differs.
//
//   engine thread:  schedule N+1 | agree | launch N+1 | wait N | process N | schedule N+2 ...
//   worker:         ...  step N (resolve, forward, sample)  | step N+1 ...
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "engine/future_map.h"
#include "engine/sampler.h"
#include "engine/step_runner.h"

namespace duet {

// One launched step (or a multi-step run of n_steps decode steps of the same batch).
struct StepJob {
  StepPlan plan;     // the group's plan (plan.runs())
  ForwardInput in;   // this rank's batch; tokens may be placeholders (FutureMap)
  std::unique_ptr<KvStore> kv;  // the step's view of the KV rows (a snapshot of the tables)
  // One sampler per logits row, in out_rows order. Each must stay alive until this job's last
  // output has been taken by wait().
  std::vector<Sampler*> samplers;
  // [n_steps][out_rows] where each sampled token goes (FutureMap placeholders).
  std::vector<int32_t> placeholders;
  // Decode steps to run with this batch (multi-step): after each, every sequence's sampled
  // token becomes its input at the next position. 1 for any batch with prompt tokens.
  int64_t n_steps = 1;
};

// What one step of a job gave this rank.
struct StepOutput {
  uint64_t job = 0;   // the job's launch number (from 1)
  int64_t step = 0;   // [0, n_steps) within the job
  bool last = true;   // the job's last step
  std::vector<int32_t> tokens;      // [out_rows] sampled ids; -1 where sampling failed
  std::vector<std::string> errors;  // [out_rows] why sampling failed there, else empty
  StepStats stats;    // the step path's execute counts after this step (StepRunner)
};

class StepWorker {
 public:
  // Called on the worker before each job with its launch number (tests hold a step there to
  // watch the engine thread meanwhile, through launched()).
  using BeforeJob = std::function<void(uint64_t job, const StepWorker& worker)>;

  // steps, future and pool (the step path's, which also samples the rows) must outlive the
  // worker; n_vocab is the logits' row width.
  StepWorker(StepRunner& steps, FutureMap& future, ThreadPool& pool, int64_t n_vocab,
             bool overlapped, BeforeJob before_job = {});
  // Finishes the step in flight (if any) and stops the thread; outputs not taken are dropped.
  ~StepWorker();
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  // Queues a job (not overlapped: runs it) and returns its launch number.
  uint64_t launch(StepJob job);
  // The next output in launch order, waiting for it. Rethrows the error of a step that failed
  // (a group failure); every later call rethrows it too.
  StepOutput wait();
  // Whether wait() would return at once (an output or the error is there). Lock-free, for
  // polling (ThreadPool::help_until); the caller thread only.
  bool ready() const {
    return n_posted_.load(std::memory_order_acquire) > n_taken_ ||
           failed_.load(std::memory_order_acquire);
  }
  // Outputs of launched jobs not yet taken by wait().
  int64_t pending() const { return static_cast<int64_t>(n_expected_ - n_taken_); }
  bool overlapped() const { return overlapped_; }
  // Jobs launched so far (any thread).
  uint64_t launched() const { return n_launched_.load(); }

 private:
  void loop();
  // Runs every step of `job`, posting each step's output.
  void run_job(StepJob& job, uint64_t id);
  void post(StepOutput out);

  // Rows of logits per sampling task: below about this many logits a row or two is sampled on
  // the worker alone (a greedy row of 32000 takes ~4 µs, a pool task's hand-over a few).
  static constexpr int64_t kMinLogitsPerTask = int64_t{1} << 16;

  StepRunner& steps_;
  FutureMap& future_;
  ThreadPool& pool_;
  const int64_t n_vocab_;
  const bool overlapped_;
  const BeforeJob before_job_;
  std::atomic<uint64_t> n_launched_{0};  // written by the caller thread
  // Outputs posted, and whether a step failed: ready()'s view of outputs_ and error_. Written
  // with mu_ held.
  std::atomic<uint64_t> n_posted_{0};
  std::atomic<bool> failed_{false};
  uint64_t n_expected_ = 0;  // caller thread only: outputs the launched jobs will post
  uint64_t n_taken_ = 0;     // caller thread only

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, StepJob>> jobs_;  // GUARDED_BY(mu_)
  std::deque<StepOutput> outputs_;                 // GUARDED_BY(mu_)
  std::exception_ptr error_;                       // GUARDED_BY(mu_)
  bool stop_ = false;                              // GUARDED_BY(mu_)
  std::thread thread_;  // last: starts after everything above exists (overlapped only)
};

}  // namespace duet
