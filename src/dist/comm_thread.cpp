#include "dist/comm_thread.h"

#include <algorithm>
#include <ctime>

#include "core/affinity.h"
#include "core/error.h"

namespace duet {

namespace {
using Clock = std::chrono::steady_clock;

// The shared state of the communication thread this code runs on, if any.
thread_local detail::CommShared* t_shared = nullptr;

void mark_alive(detail::CommShared& shared) {
  shared.alive.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}
}  // namespace

void CommHandle::wait() {
  if (!task_) return;
  // The backend's watchdog fires first for a missing peer; this one catches a communication
  // thread that stopped making progress outside any backend wait, plus a grace for a poll step.
  const auto limit = watchdog_ + std::chrono::seconds(1);
  const Clock::time_point start = Clock::now();
  std::unique_lock<std::mutex> lock(task_->mu);
  if (task_->done) {
    if (task_->error) std::rethrow_exception(task_->error);
    return;
  }
  // Counted as a waiter while blocked, which wakes a thread napping between sparse polls.
  struct Waiter {
    detail::CommShared& s;
    explicit Waiter(detail::CommShared& shared) : s(shared) {
      s.waiters.fetch_add(1);
      { std::lock_guard<std::mutex> nap(s.nap_mu); }  // a nap between its check and its sleep
      s.nap_cv.notify_one();                          // sees the count or gets the signal
    }
    ~Waiter() { s.waiters.fetch_sub(1); }
  } waiter(*thread_);
  for (;;) {
    const Clock::time_point alive(Clock::duration(thread_->alive.load(std::memory_order_relaxed)));
    const Clock::time_point deadline = std::max(start, alive) + limit;
    if (task_->cv.wait_until(lock, deadline, [this] { return task_->done; })) break;
    const Clock::time_point again(Clock::duration(thread_->alive.load(std::memory_order_relaxed)));
    if (again <= alive) {
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      DUET_ERROR(task_->name << ": not finished after " << waited.count()
                             << " ms (the communication thread is stuck)");
    }
  }
  if (task_->error) std::rethrow_exception(task_->error);
}

bool CommHandle::done() const {
  if (!task_) return true;
  std::lock_guard<std::mutex> lock(task_->mu);
  return task_->done;
}

bool CommHandle::settle(std::chrono::milliseconds limit) const {
  if (!task_) return true;
  std::unique_lock<std::mutex> lock(task_->mu);
  return task_->cv.wait_for(lock, limit, [this] { return task_->done; });
}

namespace {

// CPU time of the calling thread, in nanoseconds.
int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

CommThread::Usage CommThread::usage() const {
  return {busy_ns_.load() * 1e-9, cpu_ns_.load() * 1e-9};
}

CommThread::CommThread(std::string name, std::chrono::milliseconds watchdog)
    : name_(std::move(name)),
      watchdog_(watchdog),
      shared_(std::make_shared<detail::CommShared>()),
      thread_([this] {
        name_this_thread(("duet-" + name_).c_str());
        loop();
      }) {}

void CommThread::keepalive() {
  if (t_shared) mark_alive(*t_shared);
}

bool CommThread::awaited() {
  return !t_shared || t_shared->waiters.load(std::memory_order_relaxed) > 0;
}

void CommThread::nap(std::chrono::microseconds d) {
  if (!t_shared || t_shared->waiters.load() > 0) {
    std::this_thread::sleep_for(d);
    return;
  }
  std::unique_lock<std::mutex> lock(t_shared->nap_mu);
  t_shared->nap_cv.wait_for(lock, d, [] { return t_shared->waiters.load() > 0; });
}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommHandle CommThread::submit(std::string name, std::function<void()> run) {
  auto task = std::make_shared<detail::CommTask>();
  task->name = std::move(name);
  task->run = std::move(run);
  task->posted = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(task);
  }
  cv_.notify_one();
  return CommHandle(task, shared_, watchdog_);
}

void CommThread::loop() {
  t_shared = shared_.get();
  for (;;) {
    std::shared_ptr<detail::CommTask> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    mark_alive(*shared_);
    const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    const int64_t cpu0 = thread_cpu_ns();
    std::exception_ptr error = failed_;
    if (!error) {
      try {
        task->run();
      } catch (...) {
        error = std::current_exception();
        failed_ = error;
      }
    }
    mark_alive(*shared_);
    busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - started)
                    .count();
    cpu_ns_ += thread_cpu_ns() - cpu0;
    if (Trace* trace = trace_.load()) {
      trace->span(TraceTrack::kComm, task->name, task->posted, std::chrono::steady_clock::now(),
                  error ? "\"failed\": true" : "");
    }
    task->run = nullptr;  // drop captured buffers' owners before signalling
    {
      std::lock_guard<std::mutex> lock(task->mu);
      task->done = true;
      task->error = error;
    }
    task->cv.notify_all();
  }
}

void CommThread::pin(const std::vector<int>& cores) {
  pin_thread(thread_, cores);
}

}  // namespace duet
