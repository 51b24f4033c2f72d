#include "engine/engine_metrics.h"

#include <algorithm>

namespace duet {

namespace {
// Buckets as vLLM uses them for time to first token and inter-token latency.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                         0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0,
                                         80.0,  160.0, 640.0};
const std::vector<double> kItlBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,  0.4,
                                        0.5,  0.75,  1.0,  2.5,   5.0, 7.5,  10.0, 20.0, 40.0};
const std::vector<double> kE2eBounds = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,  10.0,
                                        15.0, 20.0, 30.0, 40.0,  50.0,  60.0,  120.0, 240.0,
                                        480.0, 960.0, 1920.0};
}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double v) {
  // Cumulative buckets: every bound >= v counts the observation.
  const size_t first = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
  for (size_t i = first; i < counts.size(); ++i) ++counts[i];
  sum += v;
  ++count;
}

EngineMetrics::EngineMetrics() {
  m_.ttft = Histogram(kTtftBounds);
  m_.itl = Histogram(kItlBounds);
  m_.e2e = Histogram(kE2eBounds);
}

void EngineMetrics::set_state(int64_t n_running, int64_t n_waiting, int64_t blocks_used,
                              int64_t blocks_total) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.n_running = n_running;
  m_.n_waiting = n_waiting;
  m_.kv_blocks_used = blocks_used;
  m_.kv_blocks_total = blocks_total;
}

void EngineMetrics::add_tokens(uint64_t prompt, uint64_t generation, uint64_t preemptions) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.prompt_tokens += prompt;
  m_.generation_tokens += generation;
  m_.preemptions += preemptions;
}

void EngineMetrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.ttft.observe(s);
}

void EngineMetrics::observe_itl(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.itl.observe(s);
}

void EngineMetrics::finished(const std::string& reason, double e2e_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++m_.finished[reason];
  m_.e2e.observe(e2e_seconds);
}

EngineMetricsSnapshot EngineMetrics::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return m_;
}

void EngineMetrics::set_steps(double gap_seconds, int64_t gaps, double forward_seconds,
                              int64_t steps) {
  std::lock_guard<std::mutex> lock(mu_);
  m_.step_gap_seconds = gap_seconds;
  m_.step_gaps = static_cast<uint64_t>(gaps);
  m_.forward_seconds = forward_seconds;
  m_.forward_steps = static_cast<uint64_t>(steps);
}

}  // namespace duet
