// The control plane of a distributed run (seed 002's Coordinator): who this rank is, and small
// collective messages between ranks — broadcast of a few bytes, a barrier, an all-gather of a
// few integers (the per-step DP synchronisation). Large tensors travel through the
// Communicator, never through here.
//
// Every call is collective: all ranks make the same calls in the same order. Instead of hanging
// when a peer is missing, a call throws duet::Error naming the call (and, where the backend can
// tell, the missing rank). When depends on the backend: the in-process one gives up once a rank
// has not arrived within the watchdog time; the MPI one once a peer has been silent (no
// heartbeat) for the watchdog time, or every rank is stuck (out of step), and waits for a peer
// that is alive and computing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace duet {

// The watchdog time of blocking collectives. A rank that dies or stops answering turns into an
// error on every other rank within this time (plus a poll step). A rank that is busy (a long
// prefill) is waited for past it: over MPI it keeps beating (every 100 ms), in-process its
// thread has not ended nor been stopped (InprocHub). So it is only how long a peer may be
// silent, on both backends: 4 s.
inline constexpr std::chrono::milliseconds kDefaultWatchdog{4000};
inline constexpr std::chrono::milliseconds kMpiWatchdog = kDefaultWatchdog;

// Where this process sits in the launch (what the launcher tells each rank).
struct RankInfo {
  int rank = 0;  // [0, world_size)
  int world_size = 1;
  int local_rank = 0;  // [0, local_world_size): rank among the ranks on this host
  int local_world_size = 1;
};

class Coordinator {
 public:
  explicit Coordinator(const RankInfo& info) : info_(info) {}
  virtual ~Coordinator() = default;
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }
  int local_world_size() const { return info_.local_world_size; }
  bool is_master() const { return info_.rank == 0; }
  bool is_local_master() const { return info_.local_rank == 0; }

  // After the call every rank's `bytes` equals rank src's `bytes` (any size on src; others'
  // input is ignored). For small messages (configuration, a request's id).
  virtual void broadcast(std::string& bytes, int src) = 0;
  // Returns once every rank has called barrier().
  virtual void barrier() = 0;
  // Each rank contributes `values` (the same count on every rank); returns every rank's values
  // in rank order, [world_size * values.size()].
  virtual std::vector<int64_t> all_gather(const std::vector<int64_t>& values) = 0;
  // Each rank contributes `bytes` (any size, each rank its own); returns every rank's bytes, in
  // rank order. For small messages, as broadcast.
  virtual std::vector<std::string> all_gather_bytes(const std::string& bytes) = 0;

 private:
  RankInfo info_;
};

}  // namespace duet
