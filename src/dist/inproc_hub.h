// The meeting point of in-process ranks (ranks as threads of one process, for tests and for
// `--distributed-backend inproc`). A collective is a rendezvous: each rank posts a pointer to its
// contribution, waits until every rank has posted the same operation, reads what it needs
// straight from its peers' buffers, then waits until every rank has finished reading so the
// buffers may be reused. Waits block on a condition variable with a watchdog deadline.
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

  const int world_size_;
  const std::chrono::milliseconds watchdog_;
  std::mutex mu_;
  std::condition_variable cv_;
  Slot slots_[kNumChannels];  // GUARDED_BY(mu_)
  std::string aborted_;       // GUARDED_BY(mu_); empty while healthy
};

}  // namespace duet
