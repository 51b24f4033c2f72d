#include "dist/inproc_hub.h"

#include <cstring>
#include <sstream>

#include "core/error.h"

namespace duet {

InprocHub::InprocHub(int world_size, std::chrono::milliseconds watchdog)
    : world_size_(world_size), watchdog_(watchdog) {
  DUET_CHECK(world_size >= 1, "world_size " << world_size);
  for (Slot& s : slots_) {
    s.posts.assign(static_cast<size_t>(world_size), nullptr);
    s.ops.assign(static_cast<size_t>(world_size), nullptr);
    s.entered.assign(static_cast<size_t>(world_size), 0);
  }
}

void InprocHub::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = why;
  }
  cv_.notify_all();
}

void InprocHub::fail_locked(const std::string& why) {
  if (aborted_.empty()) aborted_ = why;
  cv_.notify_all();
  throw Error(aborted_);
}

void InprocHub::barrier(std::unique_lock<std::mutex>& lock, Slot& s, int rank, const char* op,
                        const char* phase, bool stop_on_abort) {
  const uint64_t my_entry = ++s.entered[rank];
  const uint64_t gen = s.generation;
  if (++s.count == world_size_) {
    s.count = 0;
    ++s.generation;
    cv_.notify_all();
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + watchdog_;
  const bool opened =
      cv_.wait_until(lock, deadline, [&] {
        return s.generation != gen || (stop_on_abort && !aborted_.empty());
      });
  if (s.generation != gen) return;  // opened, even if an abort raced with it
  if (!opened) {
    std::ostringstream missing;
    for (int r = 0; r < world_size_; ++r) {
      if (s.entered[r] < my_entry) missing << (missing.tellp() > 0 ? ", " : "") << r;
    }
    fail_locked(std::string(op) + " (" + phase + "): rank " + std::to_string(rank) + " waited " +
                std::to_string(watchdog_.count()) + " ms for rank(s) " + missing.str() +
                ", which died or stopped answering");
  }
  throw Error(aborted_);
}

void InprocHub::collective(
    Channel ch, int rank, const char* op, const void* mine,
    const std::function<void(const std::vector<const void*>& posts)>& exchange) {
  DUET_CHECK(rank >= 0 && rank < world_size_, "rank " << rank << " world " << world_size_);
  std::unique_lock<std::mutex> lock(mu_);
  if (!aborted_.empty()) throw Error(aborted_);
  Slot& s = slots_[ch];
  s.posts[rank] = mine;
  s.ops[rank] = op;
  barrier(lock, s, rank, op, "arrive");
  for (int r = 0; r < world_size_; ++r) {
    if (std::strcmp(s.ops[r], op) != 0) {
      fail_locked(std::string("collective mismatch: rank ") + std::to_string(rank) + " runs " + op +
                  " while rank " + std::to_string(r) + " runs " + s.ops[r]);
    }
  }
  const std::vector<const void*> posts = s.posts;
  lock.unlock();
  std::string failed;
  try {
    exchange(posts);
  } catch (const std::exception& e) {
    failed = std::string(op) + " on rank " + std::to_string(rank) + ": " + e.what();
  }
  lock.lock();
  if (failed.empty()) {
    barrier(lock, s, rank, op, "leave");
    return;
  }
  // The peers may still be reading this rank's buffers: they are freed only once every rank
  // has left the exchange (or the watchdog gave up on one).
  barrier(lock, s, rank, op, "leave", /*stop_on_abort=*/false);
  fail_locked(failed);
}

}  // namespace duet
