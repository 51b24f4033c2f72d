#include "dist/inproc_hub.h"

#include <cstring>

#include "core/error.h"
#include "dist/comm_thread.h"

namespace duet {

namespace {

using Clock = std::chrono::steady_clock;

// How often a wait past the watchdog time asks again whether to give up.
constexpr std::chrono::milliseconds kVerdictPoll{50};

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

InprocHub::InprocHub(int world_size, std::chrono::milliseconds watchdog)
    : world_size_(world_size), watchdog_(watchdog) {
  DUET_CHECK(world_size >= 1, "world_size " << world_size);
  for (Slot& s : slots_) {
    s.posts.assign(static_cast<size_t>(world_size), nullptr);
    s.ops.assign(static_cast<size_t>(world_size), nullptr);
    s.entered.assign(static_cast<size_t>(world_size), 0);
  }
  ranks_.resize(static_cast<size_t>(world_size));
}

void InprocHub::stop_answering(int rank, const std::string& why) {
  DUET_CHECK(rank >= 0 && rank < world_size_, "rank " << rank << " world " << world_size_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Liveness& l = ranks_[static_cast<size_t>(rank)];
    if (!l.silent) {
      l.silent = true;
      l.silent_since = Clock::now();
      l.why_silent = why;
    }
  }
  cv_.notify_all();
}

void InprocHub::enter_wait_locked(int rank) {
  Liveness& l = ranks_[static_cast<size_t>(rank)];
  if (l.n_waits++ == 0) l.stuck_since = Clock::now();
}

void InprocHub::leave_wait_locked(int rank, bool finished) {
  Liveness& l = ranks_[static_cast<size_t>(rank)];
  --l.n_waits;
  if (finished) l.stuck_since = Clock::now();
}

std::string InprocHub::verdict_locked(const std::vector<int>& missing,
                                      Clock::time_point now) const {
  bool falling_silent = false;  // a missing rank is silent, not yet for the watchdog time
  for (int r : missing) {
    const Liveness& l = ranks_[static_cast<size_t>(r)];
    falling_silent |= l.silent && now - l.silent_since < watchdog_;
    if (l.silent && now - l.silent_since >= watchdog_) {
      const auto ago = std::chrono::duration_cast<std::chrono::milliseconds>(now - l.silent_since);
      return "rank " + std::to_string(r) + " " + l.why_silent + " " + std::to_string(ago.count()) +
             " ms ago";
    }
  }
  if (falling_silent) return "";  // name it once it has been silent for the watchdog time
  for (const Liveness& l : ranks_) {
    const bool stuck = l.silent || (l.n_waits > 0 && now - l.stuck_since >= watchdog_);
    if (!stuck) return "";  // someone works towards the collectives the others wait for
  }
  return "every rank has waited over " + std::to_string(watchdog_.count()) +
         " ms in collectives that do not finish";
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
  const Clock::time_point t0 = Clock::now();
  for (;;) {
    const Clock::time_point now = Clock::now();
    const Clock::time_point until =
        now - t0 < watchdog_ ? t0 + watchdog_ : now + kVerdictPoll;
    cv_.wait_until(lock, until, [&] {
      return s.generation != gen || (stop_on_abort && !aborted_.empty());
    });
    if (s.generation != gen) return;  // opened, even if an abort raced with it
    if (stop_on_abort && !aborted_.empty()) break;
    CommThread::keepalive();  // this wait's own liveness check is in charge
    const Clock::time_point later = Clock::now();
    if (later - t0 < watchdog_) continue;
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (s.entered[r] < my_entry) missing.push_back(r);
    }
    const std::string why = verdict_locked(missing, later);
    if (why.empty()) continue;
    fail_locked(std::string(op) + " (" + phase + "): rank " + std::to_string(rank) + " waited " +
                std::to_string(
                    std::chrono::duration_cast<std::chrono::milliseconds>(later - t0).count()) +
                " ms for rank(s) " + rank_list(missing) + "; " + why);
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
  // This rank waits from here to the end of the collective; it ends finished only on success.
  struct Waiting {
    InprocHub& hub;
    int rank;
    bool finished = false;
    ~Waiting() { hub.leave_wait_locked(rank, finished); }  // runs with mu_ held: see below
  };
  enter_wait_locked(rank);
  Waiting waiting{*this, rank};
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
    waiting.finished = true;
    return;
  }
  // The peers may still be reading this rank's buffers: they are freed only once every rank
  // has left the exchange (or the watchdog gave up on one).
  barrier(lock, s, rank, op, "leave", /*stop_on_abort=*/false);
  fail_locked(failed);
}

}  // namespace duet
