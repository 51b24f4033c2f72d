// The meeting point of in-process ranks (ranks as threads of one process, for tests and for
// `--distributed-backend inproc`). A collective is a rendezvous: each rank posts a pointer to its
// contribution, waits until every rank has posted the same operation, reads what it needs
// straight from its peers' buffers, then waits until every rank has finished reading so the
// buffers may be reused.
//
// Liveness, as the MPI backend's heartbeat gives it: a wait that has lasted the watchdog time
// gives up only once a rank it waits for has been silent for the watchdog time (its thread
// ended, or stop_answering: the in-process twin of a stopped process), or once every rank has
// been stuck that long (waiting in collectives of which none finished: their sequences are out of
// step). A rank that is alive and working (a long prefill) is waited for however long it takes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace duet {

class InprocHub {
 public:
  // Independent sequences of collectives: the coordinator's (caller threads) and the
  // communicator's (communication threads) never wait for each other.
  enum Channel { kControl = 0, kData = 1, kNumChannels = 2 };

  InprocHub(int world_size, std::chrono::milliseconds watchdog);

  int world_size() const { return world_size_; }
  std::chrono::milliseconds watchdog() const { return watchdog_; }

  // Runs one collective for `rank`: posts `mine`, waits for every rank's post of the same `op`,
  // calls exchange(posts) (posts[r] is rank r's `mine`), then waits for every rank to finish
  // its exchange. Throws duet::Error if a rank does not arrive within the watchdog time (naming
  // the op and the missing ranks), if ranks disagree on the op, or once the hub was aborted.
  void collective(Channel ch, int rank, const char* op, const void* mine,
                  const std::function<void(const std::vector<const void*>& posts)>& exchange);

  // Makes every current and future collective throw `why` (a rank failed or timed out).
  // The first reason wins.
  void abort(const std::string& why);

  // From now on `rank` is silent: its peers' waits for it give up once it has been silent for
  // the watchdog time. What a SIGSTOP is to an MPI rank (its threads may go on running); the
  // launcher also calls it for a rank whose function has returned.
  void stop_answering(int rank, const std::string& why = "stopped answering");

 private:
  struct Slot {
    std::vector<const void*> posts;  // [world_size], valid between the two barriers
    std::vector<const char*> ops;    // [world_size] op names, for the mismatch check
    std::vector<uint64_t> entered;   // [world_size] barriers each rank has entered
    int count = 0;                   // ranks waiting in the current barrier
    uint64_t generation = 0;         // bumped when a barrier opens
  };

  // Waits until every rank has entered the slot's current barrier, or (stop_on_abort) the hub
  // is aborted. REQUIRES: mu_ held (through lock).
  void barrier(std::unique_lock<std::mutex>& lock, Slot& s, int rank, const char* op,
               const char* phase, bool stop_on_abort = true);
  [[noreturn]] void fail_locked(const std::string& why);  // REQUIRES: mu_ held
  // Why a wait that has lasted the watchdog time for `missing` ranks should give up, or "" to
  // go on waiting. REQUIRES: mu_ held.
  std::string verdict_locked(const std::vector<int>& missing,
                             std::chrono::steady_clock::time_point now) const;
  // A wait of `rank` begins / ends (`finished`: its collective completed, which is progress).
  // REQUIRES: mu_ held.
  void enter_wait_locked(int rank);
  void leave_wait_locked(int rank, bool finished);

  // What the peers can tell of a rank.
  struct Liveness {
    int n_waits = 0;                                    // collectives it is waiting in now
    std::chrono::steady_clock::time_point stuck_since;  // since then in waits, none finished
    bool silent = false;
    std::chrono::steady_clock::time_point silent_since;
    std::string why_silent;
  };

  const int world_size_;
  const std::chrono::milliseconds watchdog_;
  std::mutex mu_;
  std::condition_variable cv_;
  Slot slots_[kNumChannels];  // GUARDED_BY(mu_)
  std::string aborted_;       // GUARDED_BY(mu_); empty while healthy
  std::vector<Liveness> ranks_;  // GUARDED_BY(mu_); [world_size]
};

}  // namespace duet
