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

// A job's chunk count fits word_'s 16 bits (chunk index and count).
constexpr int64_t kMaxChunks = 0xffff;

// How long a worker polls for the next job, and the caller for the end of its job, before
// blocking. A decode step runs a job every few tens of microseconds, and a worker woken from a
// futex (its vCPU halted) starts tens of microseconds late. Measured on the 2-vCPU VM with 400
// jobs of 40 us separated by 15 us of serial work (ideal 22 ms): 34-38 ms blocking at once,
// 28-32 ms with a 10 us budget, 23.2-23.5 ms with 50 us or more. An idle pool sleeps after it.
constexpr auto kSpin = std::chrono::microseconds(50);

// Pauses between two polls. A poller sees its job or its job's end that much later: 8-chunk jobs
// of 20 us on 2 threads (a harness, Zen 4 VM) took 10.6-10.7 us with 4 against 11.3-11.6 with 32.
constexpr int kPauses = 4;

// Polls `done` until it returns true or the spin budget is spent.
template <typename Done>
void spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < kPauses; ++i) __builtin_ia32_pause();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  active_workers_ = n_threads_ - 1;
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
  const int64_t target_chunks = std::min<int64_t>(n_threads_ * kChunksPerThread, kMaxChunks);
  int64_t chunk = (n + target_chunks - 1) / target_chunks;
  chunk = (chunk + min_chunk - 1) / min_chunk * min_chunk;  // <= n, as n > min_chunk
  const int64_t n_chunks = n / chunk;
  if (n_chunks == 1) {
    fn(0, n);
    return;
  }
  DUET_CHECK(!busy_.exchange(true, std::memory_order_acquire),
             "ThreadPool::parallel_for called while a job is running");
  struct Idle {  // the pool takes the next job however this one ends
    std::atomic<bool>& busy;
    ~Idle() { busy.store(false, std::memory_order_release); }
  } idle{busy_};

  job_.store(&fn, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  job_chunk_.store(chunk, std::memory_order_relaxed);
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = gen_of(word_.load(std::memory_order_relaxed)) + 1;
  word_.store((gen << 32) | (static_cast<uint64_t>(n_chunks) << 16));  // seq_cst: publishes
  // Spinning workers see the new generation by themselves; wake only as many sleepers as there
  // are chunks besides the caller's first one.
  if (n_sleeping_.load() > 0) {
    int64_t to_wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      to_wake = std::min<int64_t>(n_chunks - 1, n_sleeping_.load());
    }
    if (to_wake >= n_sleeping_.load()) {
      work_cv_.notify_all();
    } else {
      for (int64_t i = 0; i < to_wake; ++i) work_cv_.notify_one();
    }
  }

  run_chunks(gen);

  spin_for_done(n_chunks);
  if (chunks_done_.load(std::memory_order_acquire) != n_chunks) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_ = true;
    done_cv_.wait(lock, [&] { return chunks_done_.load() == n_chunks; });
    caller_sleeping_ = false;
  }
  if (failed_.load(std::memory_order_acquire)) {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      error = error_;
      error_ = nullptr;
      failed_ = false;
    }
    std::rethrow_exception(error);
  }
}

void ThreadPool::worker_loop(int worker_index) {
  uint64_t seen = gen_of(word_.load(std::memory_order_acquire));
  while (!stop_.load(std::memory_order_relaxed)) {
    if (worker_index >= active_workers_.load()) {
      std::unique_lock<std::mutex> lock(mu_);
      park_cv_.wait(lock, [&] { return stop_ || worker_index < active_workers_; });
      seen = gen_of(word_.load());  // a job posted while parked has gone on without it
      continue;
    }
    if (gen_of(word_.load(std::memory_order_acquire)) == seen) spin_for_job(seen);
    if (gen_of(word_.load(std::memory_order_acquire)) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleep_for_job(lock, seen, worker_index, nullptr);
      continue;  // rechecks stop_ and parking
    }
    if (worker_index >= active_workers_.load()) continue;  // parked while it polled
    seen = gen_of(word_.load(std::memory_order_acquire));
    run_chunks(seen);
  }
}

void ThreadPool::sleep_for_job(std::unique_lock<std::mutex>& lock, uint64_t seen,
                               int worker_index, const std::function<bool()>* done) {
  n_sleeping_.fetch_add(1);  // seq_cst, before the last look at word_ below
  work_cv_.wait(lock, [&] {
    return stop_ || gen_of(word_.load()) != seen ||
           (worker_index >= 0 && worker_index >= active_workers_) || (done && (*done)());
  });
  n_sleeping_.fetch_sub(1);
}

void ThreadPool::run_chunks(uint64_t gen) {
  while (run_one_chunk(gen)) {
  }
}

bool ThreadPool::run_one_chunk(uint64_t gen) {
  uint64_t word = word_.load(std::memory_order_acquire);
  uint64_t c;
  for (;;) {
    const uint64_t n_chunks = (word >> 16) & 0xffff;
    c = word & 0xffff;
    if (gen_of(word) != gen || c >= n_chunks) return false;
    if (word_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) break;
  }
  // Chunk c is this thread's: the job stays posted until it is done.
  const std::function<void(int64_t, int64_t)>& fn = *job_.load(std::memory_order_relaxed);
  const int64_t chunk = job_chunk_.load(std::memory_order_relaxed);
  const int64_t n_chunks = static_cast<int64_t>((word >> 16) & 0xffff);
  const int64_t begin = static_cast<int64_t>(c) * chunk;
  const int64_t end =
      static_cast<int64_t>(c) == n_chunks - 1 ? job_n_.load(std::memory_order_relaxed)
                                              : begin + chunk;
  try {
    fn(begin, end);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      failed_ = true;
    }
    // Skip the chunks nobody has started: the caller rethrows the error anyway.
    uint64_t w = word_.load(std::memory_order_acquire);
    int64_t skipped = 0;
    while (gen_of(w) == gen && (w & 0xffff) < static_cast<uint64_t>(n_chunks)) {
      const uint64_t all_taken = (w & ~uint64_t{0xffff}) | static_cast<uint64_t>(n_chunks);
      if (word_.compare_exchange_weak(w, all_taken, std::memory_order_acq_rel)) {
        skipped = n_chunks - static_cast<int64_t>(w & 0xffff);
        break;
      }
    }
    chunks_finished(1 + skipped, n_chunks);
    return false;
  }
  chunks_finished(1, n_chunks);
  return true;
}

void ThreadPool::chunks_finished(int64_t n, int64_t n_chunks) {
  // seq_cst, before the look at the caller. Once the last is counted the job may be over and the
  // next one posted: only n_chunks (this job's) is compared.
  const int64_t done = chunks_done_.fetch_add(n) + n;
  if (done == n_chunks && caller_sleeping_.load()) {
    { std::lock_guard<std::mutex> lock(mu_); }  // the caller is inside wait once this is free
    done_cv_.notify_one();
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
  return active_workers_.load();
}

void ThreadPool::help_until(const std::function<bool()>& done) {
  n_helpers_.fetch_add(1);  // seq_cst: ordered before the done() checks below
  for (;;) {
    const uint64_t seen = gen_of(word_.load(std::memory_order_acquire));
    run_chunks(seen);
    if (done()) break;
    spin_until([&] { return gen_of(word_.load(std::memory_order_acquire)) != seen || done(); });
    if (gen_of(word_.load(std::memory_order_acquire)) != seen) continue;
    std::unique_lock<std::mutex> lock(mu_);
    sleep_for_job(lock, seen, -1, &done);
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
  spin_until([&] { return gen_of(word_.load(std::memory_order_acquire)) != seen; });
}

// REQUIRES: called by the thread that posted the job.
void ThreadPool::spin_for_done(int64_t n_chunks) const {
  spin_until([&] { return chunks_done_.load(std::memory_order_acquire) == n_chunks; });
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
