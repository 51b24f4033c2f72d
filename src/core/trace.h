// A timeline of one rank, written as a Chrome trace (JSON "traceEvents", opened by Perfetto or
// chrome://tracing): complete events on named tracks — the step's agreement and plan, the
// operations of each micro-batch, and the communication thread's transfers from post to
// completion — so that a user sees what overlapped (`--trace-file`). Thread-safe; recording is a
// lock and an append, and nothing records unless a Trace was handed out.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace duet {

// The tracks of a rank's timeline.
enum class TraceTrack : int {
  kStep = 1,         // the step's agreement, plan and scheduling
  kMicroBatchA = 2,  // operations of micro-batch A (or of the only one)
  kMicroBatchB = 3,  // operations of micro-batch B
  kComm = 4,         // the communication thread's transfers, post to completion
};

class Trace {
 public:
  using Clock = std::chrono::steady_clock;

  // `rank` becomes the trace's process id; its tracks are named after TraceTrack.
  explicit Trace(int rank);

  // A complete event: `name` on `track` from t0 to t1; `args` is a JSON object's members
  // ("\"bytes\": 123") or empty.
  void span(TraceTrack track, std::string name, Clock::time_point t0, Clock::time_point t1,
            std::string args = "");

  // Writes the events as Chrome trace JSON. Throws duet::Error naming the file on failure.
  void write(const std::string& path) const;
  size_t n_events() const;

 private:
  struct Event {
    int tid;
    std::string name;
    int64_t ts_us, dur_us;
    std::string args;
  };
  const int rank_;
  const Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;  // GUARDED_BY(mu_)
};

// The file of `rank`'s trace when `world` ranks each write one: `path` itself on a single rank,
// else the rank number before the extension (trace.json → trace.rank1.json).
std::string trace_path_for_rank(const std::string& path, int rank, int world);

}  // namespace duet
