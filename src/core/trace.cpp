#include "core/trace.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace duet {

namespace {

const char* track_name(int tid) {
  switch (static_cast<TraceTrack>(tid)) {
    case TraceTrack::kStep:
      return "step (sync, plan)";
    case TraceTrack::kMicroBatchA:
      return "micro-batch A";
    case TraceTrack::kMicroBatchB:
      return "micro-batch B";
    case TraceTrack::kComm:
      return "communication thread";
  }
  return "?";
}

}  // namespace

Trace::Trace(int rank) : rank_(rank), origin_(Clock::now()) {}

void Trace::span(TraceTrack track, std::string name, Clock::time_point t0, Clock::time_point t1,
                 std::string args) {
  using std::chrono::duration_cast;
  using us = std::chrono::microseconds;
  Event e{static_cast<int>(track), std::move(name), duration_cast<us>(t0 - origin_).count(),
          duration_cast<us>(t1 - t0).count(), std::move(args)};
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

size_t Trace::n_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void Trace::write(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (int tid = 1; tid <= 4; ++tid) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank_}, {"tid", tid},
                      {"args", {{"name", track_name(tid)}}}});
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Event& e : events_) {
      nlohmann::json j = {{"ph", "X"}, {"name", e.name}, {"pid", rank_}, {"tid", e.tid},
                          {"ts", e.ts_us}, {"dur", e.dur_us}};
      if (!e.args.empty()) j["args"] = nlohmann::json::parse("{" + e.args + "}");
      events.push_back(std::move(j));
    }
  }
  std::ofstream out(path);
  out << nlohmann::json({{"traceEvents", events}, {"displayTimeUnit", "ms"}}).dump() << "\n";
  if (!out) DUET_ERROR(path << ": cannot write the trace");
}

std::string trace_path_for_rank(const std::string& path, int rank, int world) {
  if (world <= 1) return path;
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const std::string tag = ".rank" + std::to_string(rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

}  // namespace duet
