// The MPI backend's heartbeat (internal to src/dist/mpi_*): the liveness of the other ranks,
// which a collective's watchdog consults before it gives up on its peers.
//
// A waiting rank cannot tell a dead peer from a busy one — a long prefill while the others wait
// at the layer's all-to-all, a slower model load before the first collective — so a plain
// deadline would take the busy one for dead. Instead one thread per process sends this rank's
// state to every peer each kBeat, on a communicator of its own, and notes when it last heard
// from each. A busy peer keeps beating, so the others keep waiting for it; a peer that died or
// was stopped (SIGSTOP) falls silent, and a wait gives up once a peer has been silent for the
// watchdog time.
//
// The beats travel twice: over MPI, and over a TCP connection of their own between every pair
// of ranks (BeatSockets), because MPI's share the data's connection and on a slow link wait
// behind every byte of the all-to-all already queued to that peer (seconds). Each beat is
// numbered; the newest from either path counts, an older one that arrives late is ignored.
//
// The state sent is how long this rank has been stuck: waiting in collectives of which none
// finished nor moved a chunk (a transfer on a slow link takes seconds but completes chunk by
// chunk, MpiChannel) (or -1 once one of its waits failed: it will not join any more). Once no peer
// is working — every one stuck for the watchdog time or given up — nobody works towards the
// collectives they wait for (their sequences are out of step) and waiting longer would hang, so
// the wait gives up too.
//
// Only in a build with MPI (DUET_HAVE_MPI), like the rest of the backend.
#pragma once

#if DUET_HAVE_MPI
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/beat_sockets.h"
#include "dist/mpi_util.h"

namespace duet {

class MpiHeartbeat {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kBeat{100};

  struct Paths {
    bool mpi = true;      // beats over MPI
    bool sockets = true;  // beats over BeatSockets (where a pair could connect)
  };

  // Collective: duplicates MPI_COMM_WORLD and connects the beat sockets, giving up after
  // startup_deadline (throws duet::Error and sets *abandoned) if a rank never joins. Starts the
  // thread. `paths`: which ways beats travel (both but in tests).
  MpiHeartbeat(std::chrono::milliseconds startup_deadline, bool* abandoned, Paths paths);
  MpiHeartbeat(std::chrono::milliseconds startup_deadline, bool* abandoned)
      : MpiHeartbeat(startup_deadline, abandoned, Paths{}) {}

  // Peers connected by beat sockets (for tests and logs).
  int n_socket_peers() const { return sockets_ ? sockets_->n_connected() : 0; }
  ~MpiHeartbeat() { stop(); }
  MpiHeartbeat(const MpiHeartbeat&) = delete;
  MpiHeartbeat& operator=(const MpiHeartbeat&) = delete;

  // A wait of this process for a collective begins; it ends with leave_wait, `finished` when
  // its collective completed (progress) rather than failed (this rank gives up for good).
  // Thread-safe: any number of waits may be in progress at once.
  void enter_wait();
  void leave_wait(bool finished);
  // A wait in progress saw part of its collective complete (a chunk of a transfer arrived or
  // left): the waits are not stuck. Thread-safe.
  void progress();

  // For a wait that has lasted longer than `watchdog`: why to give up now (a peer silent for
  // the watchdog time, a peer that gave up, or every rank stuck), or "" while some peer is
  // alive and not stuck (it is working towards the collective). Thread-safe.
  std::string verdict(std::chrono::milliseconds watchdog);

  // Stops the thread and frees the communicator; local. Returns false if a message could not
  // finish (to a dead or stopped peer): then it stays pending and MPI_Finalize must not run.
  bool stop();

 private:
  void loop();
  // One beat: takes what arrived, then sends the current state to every peer whose previous
  // message has left. Only on the thread.
  void exchange();
  int64_t stuck_ms(Clock::time_point now) const;  // REQUIRES: mu_ held
  // A beat from `peer`: counts if newer than the last one heard. REQUIRES: mu_ held.
  void heard(int peer, const Beat& beat, Clock::time_point now);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                     // GUARDED_BY(mu_)
  int n_waiting_ = 0;                     // GUARDED_BY(mu_) waits in progress in this process
  bool gave_up_ = false;                  // GUARDED_BY(mu_) a wait failed
  Clock::time_point stuck_since_;         // GUARDED_BY(mu_) last progress, while n_waiting_ > 0
  std::vector<Clock::time_point> heard_;  // GUARDED_BY(mu_) [size] last message from each rank
  std::vector<int64_t> peer_stuck_ms_;    // GUARDED_BY(mu_) [size] the state in that message
  std::vector<int64_t> peer_seq_;         // GUARDED_BY(mu_) [size] that message's number
  // Only the thread (and stop() after joining it) touches these.
  Paths paths_;
  int64_t seq_ = 0;                               // the number of this rank's next beat
  std::unique_ptr<BeatSockets> sockets_;          // null without Paths::sockets
  std::vector<Beat> send_buf_, recv_buf_;         // [size] one MPI message per peer in flight
  std::vector<MPI_Request> send_req_, recv_req_;  // [size]
  std::vector<char> broken_;                      // [size] peers whose MPI calls failed
  bool clean_ = true;                             // stop()'s answer, once stopped
  std::thread thread_;                            // last: starts after the fields above
};

}  // namespace duet

#endif  // DUET_HAVE_MPI
