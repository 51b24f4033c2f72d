// The communication thread of a rank: the CPU's "communication stream". Collectives started
// with Communicator::start_* run here one after another in the order they were started (so all
// ranks issue them in the same order), while the caller keeps computing. The thread blocks on a
// condition variable when it has nothing to do; backends wait for their peers without spinning.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/trace.h"

namespace duet {

namespace detail {
// The completion state of one submitted task, shared by the thread and the handle.
struct CommTask {
  std::string name;
  std::function<void()> run;
  std::chrono::steady_clock::time_point posted;  // when submit() queued it
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;         // GUARDED_BY(mu)
  std::exception_ptr error;  // GUARDED_BY(mu)
};
// What a communication thread shares with its handles.
struct CommShared {
  // When the thread last showed that it is not stuck (steady_clock ticks): it took a task,
  // finished one, or a backend polling for its peers said so (CommThread::keepalive).
  std::atomic<std::chrono::steady_clock::rep> alive{0};
  // Handles blocked in wait() for this thread's tasks right now: while there are none, its
  // backend's polls can be sparse (CommThread::awaited, CommThread::nap).
  std::atomic<int> waiters{0};
  std::mutex nap_mu;
  std::condition_variable nap_cv;  // a nap of the thread's, cut short by a new waiter
};
}  // namespace detail

// The receipt of an asynchronous collective. wait() is the receive half.
class CommHandle {
 public:
  CommHandle() = default;  // an empty handle: wait() returns at once
  CommHandle(std::shared_ptr<detail::CommTask> task, std::shared_ptr<detail::CommShared> thread,
             std::chrono::milliseconds watchdog)
      : task_(std::move(task)), thread_(std::move(thread)), watchdog_(watchdog) {}

  // Blocks until the collective finished; rethrows its error (duet::Error naming it). Throws
  // duet::Error if the communication thread shows no sign of life for the watchdog time plus
  // a second (from this call) — a backstop behind the backends' own watchdogs, which may wait
  // longer for peers that are alive but busy. Waiting twice is allowed.
  void wait();
  // Whether wait() would return at once.
  bool done() const;
  // Waits up to `limit` for the collective to finish, error or not; true if it has. Never throws:
  // for owners of the collective's buffers that must outlive it (a destructor after wait() gave
  // up on a stuck communication thread).
  bool settle(std::chrono::milliseconds limit) const;
  bool valid() const { return task_ != nullptr; }

 private:
  std::shared_ptr<detail::CommTask> task_;
  std::shared_ptr<detail::CommShared> thread_;
  std::chrono::milliseconds watchdog_{0};
};

class CommThread {
 public:
  // `watchdog` bounds each handle's wait (see CommHandle::wait).
  CommThread(std::string name, std::chrono::milliseconds watchdog);
  // Finishes the tasks already submitted, then joins.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `run` and returns at once. After a task has failed, every later task fails with the
  // same error without running: the ranks' collective sequences are out of step by then.
  CommHandle submit(std::string name, std::function<void()> run);

  // Called by a backend on the communication thread while it polls for its peers: its own
  // watchdog is in charge of that wait, so the handles waiting on this thread do not give up
  // however long alive peers take. Does nothing on any other thread.
  static void keepalive();
  // For a backend's poll loop: whether a result of the current wait is awaited now, i.e. true
  // on any thread but a communication thread (its caller waits itself), and on a communication
  // thread while a handle is blocked in wait() for one of its tasks. A transfer that no one waits
  // for yet (posted ahead, the caller computing meanwhile) needs no tight polling, whose wake-ups
  // would take the core from that computation.
  static bool awaited();
  // Sleeps for `d` (the caller's poll interval). On a communication thread that no one awaits,
  // a handle that starts waiting ends the nap at once.
  static void nap(std::chrono::microseconds d);
  // From now on each task becomes a span of `trace`'s communication track, from post to
  // completion (null: stop). The trace must outlive the thread or the next set_trace.
  void set_trace(Trace* trace) { trace_.store(trace); }

  // What the thread has spent running tasks so far: wall seconds from taking a task to finishing
  // it (the transfers' time), and its own CPU seconds then (what communication takes from the
  // compute cores).
  struct Usage {
    double busy_seconds = 0;
    double cpu_seconds = 0;
  };
  Usage usage() const;
  // Restricts the thread to `cores` (--comm-cores).
  void pin(const std::vector<int>& cores);

 private:
  void loop();

  std::string name_;
  std::chrono::milliseconds watchdog_;
  std::shared_ptr<detail::CommShared> shared_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<detail::CommTask>> queue_;  // GUARDED_BY(mu_)
  bool stop_ = false;                                    // GUARDED_BY(mu_)
  std::exception_ptr failed_;  // first task error; only the thread touches it
  std::atomic<Trace*> trace_{nullptr};
  std::atomic<int64_t> busy_ns_{0};  // Usage, in nanoseconds, written by the thread
  std::atomic<int64_t> cpu_ns_{0};
  std::thread thread_;         // last: starts after the fields above exist
};

}  // namespace duet
