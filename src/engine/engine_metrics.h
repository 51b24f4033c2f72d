// Serving metrics the engine loop records and the HTTP layer reports (/metrics): gauges of the
// current state, token counters and latency histograms. Written by the engine thread once per
// step, read by HTTP threads; one mutex guards it all.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace duet {

// A cumulative histogram with fixed upper bounds, as Prometheus exposes it.
struct Histogram {
  std::vector<double> bounds;    // ascending upper bounds (seconds); +Inf is implicit
  std::vector<uint64_t> counts;  // [bounds.size() + 1], counts[i]: observations <= bounds[i]
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b = {});
  void observe(double v);
};

struct EngineMetricsSnapshot {
  int64_t n_running = 0;
  int64_t n_waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  uint64_t prompt_tokens = 0;      // prompt tokens computed (recomputation not counted twice)
  uint64_t generation_tokens = 0;
  uint64_t preemptions = 0;
  std::map<std::string, uint64_t> finished;  // finish_reason -> requests
  Histogram ttft{};                 // time to first token, seconds
  Histogram itl{};                  // inter-token latency, seconds
  Histogram e2e{};                  // request latency, seconds
  // The step gap (StepStats): wall seconds between consecutive forward passes, over step_gaps
  // gaps, and the forward passes' seconds over forward_steps steps.
  double step_gap_seconds = 0;
  uint64_t step_gaps = 0;
  double forward_seconds = 0;
  uint64_t forward_steps = 0;
};

class EngineMetrics {
 public:
  EngineMetrics();

  // Engine thread: the state after a step.
  void set_state(int64_t n_running, int64_t n_waiting, int64_t blocks_used, int64_t blocks_total);
  void add_tokens(uint64_t prompt, uint64_t generation, uint64_t preemptions);
  void observe_ttft(double s);
  void observe_itl(double s);
  void finished(const std::string& reason, double e2e_seconds);
  // The step path's totals so far (StepStats's gap and forward figures).
  void set_steps(double gap_seconds, int64_t gaps, double forward_seconds, int64_t steps);

  EngineMetricsSnapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  EngineMetricsSnapshot m_;  // GUARDED_BY(mu_)
};

}  // namespace duet
