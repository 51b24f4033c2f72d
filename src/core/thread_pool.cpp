#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/affinity.h"
#include "core/error.h"

namespace duet {

namespace {

// Chunks handed out per thread: more than one so a thread that loses its core for a while
// (two cores shared with other processes here) does not hold the whole job back.
constexpr int64_t kChunksPerThread = 4;

// worker_loop(kCaller) is the caller's share: it takes chunks of the current job until none are
// left and returns, instead of waiting for the next job as a worker does.
constexpr int kCaller = -1;

// How long a worker polls for the next job, and the caller for the end of its job, before
// blocking. A decode step runs a job every few tens of microseconds, and a worker woken from a
// futex (its vCPU halted) starts tens of microseconds late. Measured on the 2-vCPU VM with 400
// jobs of 40 us separated by 15 us of serial work (ideal 22 ms): 34-38 ms blocking at once,
// 28-32 ms with a 10 us budget, 23.2-23.5 ms with 50 us or more. An idle pool sleeps after it.
constexpr auto kSpin = std::chrono::microseconds(50);

// Polls `done` until it returns true or the spin budget is spent.
template <typename Done>
void spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 32; ++i) __builtin_ia32_pause();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)), active_workers_(n_threads_ - 1) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 0; i < n_threads_ - 1; ++i) {
    workers_.emplace_back([this, i] {
      name_this_thread("duet-pool");
      worker_loop(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  park_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// Chunks start at multiples of min_chunk and are `chunk` long (a multiple of min_chunk), except
// the last, which runs to n and so is between chunk and 2 * chunk - 1 long. A kernel that blocks
// rows by 4 can pass min_chunk = 4 and only ever sees a ragged edge at the end of the matrix.
void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                              int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  if (n_threads_ == 1 || n <= min_chunk) {
    fn(0, n);
    return;
  }
  int64_t target_chunks = n_threads_ * kChunksPerThread;
  int64_t chunk = (n + target_chunks - 1) / target_chunks;
  chunk = (chunk + min_chunk - 1) / min_chunk * min_chunk;  // <= n, as n > min_chunk
  int64_t n_chunks = n / chunk;
  if (n_chunks == 1) {
    fn(0, n);
    return;
  }

  std::unique_lock<std::mutex> lock(mu_);
  DUET_CHECK(job_ == nullptr, "ThreadPool::parallel_for called while a job is running");
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_chunk_ = 0;
  n_chunks_ = n_chunks;
  chunks_done_ = 0;
  error_ = nullptr;
  ++generation_;
  // Wake only as many workers as there are chunks besides the caller's first one; spinning
  // workers see generation_ change by themselves.
  // Only threads that may take part sleep on work_cv_ (parked workers wait on park_cv_).
  const int64_t to_wake = std::min<int64_t>(n_chunks - 1, n_sleeping_);
  const bool wake_all = to_wake > 0 && to_wake == n_sleeping_;
  lock.unlock();
  if (wake_all) {
    work_cv_.notify_all();
  } else {
    for (int64_t i = 0; i < to_wake; ++i) work_cv_.notify_one();
  }

  worker_loop(kCaller);

  spin_for_done();
  lock.lock();
  done_cv_.wait(lock, [this] { return chunks_done_ == n_chunks_; });
  job_ = nullptr;
  std::exception_ptr error = error_;
  error_ = nullptr;
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop(int worker_index) {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen_generation = generation_;
  while (true) {
    if (worker_index != kCaller) {
      if (worker_index >= active_workers_) {
        park_cv_.wait(lock, [&] { return stop_ || worker_index < active_workers_; });
        if (stop_) return;
        seen_generation = generation_;  // a job posted while parked has gone on without it
        continue;
      }
      if (!stop_ && generation_ == seen_generation) {
        lock.unlock();
        spin_for_job(seen_generation);
        lock.lock();
      }
      ++n_sleeping_;
      work_cv_.wait(lock, [&] {
        return stop_ || generation_ != seen_generation || worker_index >= active_workers_;
      });
      --n_sleeping_;
      if (stop_) return;
      if (worker_index >= active_workers_) continue;
      seen_generation = generation_;
    }
    run_chunks(lock);
    if (worker_index == kCaller) return;
  }
}

void ThreadPool::run_chunks(std::unique_lock<std::mutex>& lock) {
  // mu_ is released while a chunk runs.
  while (job_ != nullptr && next_chunk_ < n_chunks_) {
    int64_t c = next_chunk_++;
    const std::function<void(int64_t, int64_t)>& fn = *job_;
    int64_t begin = c * job_chunk_;
    int64_t end = c == n_chunks_ - 1 ? job_n_ : begin + job_chunk_;
    lock.unlock();
    std::exception_ptr error;
    try {
      fn(begin, end);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    ++chunks_done_;
    if (error) {
      if (!error_) error_ = error;
      // Skip the chunks nobody has started: the caller rethrows the error anyway.
      chunks_done_ += n_chunks_ - next_chunk_;
      next_chunk_ = n_chunks_;
    }
    if (chunks_done_ == n_chunks_) done_cv_.notify_one();
  }
}

void ThreadPool::set_active_workers(int n) {
  DUET_CHECK(n >= 0 && n < n_threads_,
             "set_active_workers(" << n << ") on a pool of " << n_threads_ << " threads");
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_workers_ = n;
  }
  work_cv_.notify_all();
  park_cv_.notify_all();
}

int ThreadPool::active_workers() {
  std::lock_guard<std::mutex> lock(mu_);
  return active_workers_;
}

void ThreadPool::help_until(const std::function<bool()>& done) {
  std::unique_lock<std::mutex> lock(mu_);
  n_helpers_.fetch_add(1);  // seq_cst: ordered before the done() checks below
  for (;;) {
    run_chunks(lock);
    if (done()) break;
    // Seen with mu_ held: a job posted after this point changes it.
    const uint64_t seen = generation_;
    lock.unlock();
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || done(); });
    lock.lock();
    if (generation_ != seen) continue;
    ++n_sleeping_;
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen || done(); });
    --n_sleeping_;
    if (stop_) break;
  }
  n_helpers_.fetch_sub(1);
}

// REQUIRES: what makes the helpers' done() true was stored seq_cst (or under mu_) before: then
// either this sees a helper's count, or that helper's check sees the new state.
void ThreadPool::wake_helpers() {
  if (n_helpers_.load() == 0) return;
  // Taking mu_ orders this after a helper's check of done() under it: none sleeps through.
  { std::lock_guard<std::mutex> lock(mu_); }
  work_cv_.notify_all();
}

void ThreadPool::spin_for_job(uint64_t seen) const {
  spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
}

// REQUIRES: called by the thread that posted the job (the only writer of n_chunks_).
void ThreadPool::spin_for_done() const {
  spin_until([&] { return chunks_done_.load(std::memory_order_acquire) == n_chunks_; });
}

void ThreadPool::pin(const std::vector<int>& cores) {
  for (std::thread& w : workers_) pin_thread(w, cores);
  pin_this_thread(cores);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace duet
