#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/affinity.h"
#include "core/error.h"

namespace duet {

namespace {

// Chunks per thread. Each thread runs its own share of a job's chunks in order, one stream of
// weights, and then takes the others' unstarted chunks from their ends, so a thread that loses
// its core for a while (two cores shared with other processes here), or reads more slowly, holds
// the job back by at most a small chunk. Alternating step by step against 4 chunks per thread
// handed out in turn (a thread's next chunk mostly not next to its last, a stream started cold,
// and the last chunk a quarter of a thread's share): one-sequence decode with int4 weights 0.94-
// 0.96 of the time per step, int8 0.96-1.00, bf16 0.99-1.01; 32 sequences int4 0.97 (Zen 4 VM).
constexpr int64_t kChunksPerThread = 16;

// A job's chunk count fits the 16 bits of a share's bounds (Range).
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

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)), ranges_(static_cast<size_t>(n_threads_)) {
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
  job_chunks_.store(n_chunks, std::memory_order_relaxed);
  // 32 bits, as gen_of reads it back (a server posts billions of jobs in a few weeks).
  const uint64_t gen = (gen_of(word_.load(std::memory_order_relaxed)) + 1) & 0xffffffffu;
  // Each thread's share of the chunks, in order: [lo, hi) of slot s (the caller's is 0, worker
  // i's i + 1); a thread takes its own from the front and, when they are gone, the others' from
  // the back.
  for (int s = 0; s < n_threads_; ++s) {
    const uint64_t lo = static_cast<uint64_t>(s * n_chunks / n_threads_);
    const uint64_t hi = static_cast<uint64_t>((s + 1) * n_chunks / n_threads_);
    ranges_[static_cast<size_t>(s)].word.store((gen << 32) | (lo << 16) | hi,
                                               std::memory_order_relaxed);
  }
  word_.store(gen << 32);  // seq_cst: publishes the job
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

  run_chunks(gen, 0);

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
    run_chunks(seen, worker_index + 1);
  }
}

void ThreadPool::sleep_for_job(std::unique_lock<std::mutex>& lock, uint64_t seen, int worker_index,
                               const std::function<bool()>* done) {
  n_sleeping_.fetch_add(1);  // seq_cst, before the last look at word_ below
  work_cv_.wait(lock, [&] {
    return stop_ || gen_of(word_.load()) != seen ||
           (worker_index >= 0 && worker_index >= active_workers_) || (done && (*done)());
  });
  n_sleeping_.fetch_sub(1);
}

void ThreadPool::run_chunks(uint64_t gen, int slot) {
  if (slot >= 0) {
    while (run_one_chunk(gen, slot, false)) {
    }
  }
  for (int k = 1; k <= n_threads_; ++k) {
    const int victim = (std::max(slot, 0) + k) % n_threads_;
    if (victim == slot) continue;
    while (run_one_chunk(gen, victim, true)) {
    }
  }
}

bool ThreadPool::run_one_chunk(uint64_t gen, int slot, bool from_back) {
  std::atomic<uint64_t>& range = ranges_[static_cast<size_t>(slot)].word;
  uint64_t word = range.load(std::memory_order_acquire);
  uint64_t c;
  for (;;) {
    const uint64_t lo = (word >> 16) & 0xffff, hi = word & 0xffff;
    if (gen_of(word) != gen || lo >= hi) return false;
    c = from_back ? hi - 1 : lo;
    const uint64_t taken = from_back ? word - 1 : word + (uint64_t{1} << 16);
    if (range.compare_exchange_weak(word, taken, std::memory_order_acq_rel)) break;
  }
  // Chunk c is this thread's: the job stays posted until it is done.
  const std::function<void(int64_t, int64_t)>& fn = *job_.load(std::memory_order_relaxed);
  const int64_t chunk = job_chunk_.load(std::memory_order_relaxed);
  const int64_t n_chunks = job_chunks_.load(std::memory_order_relaxed);
  const int64_t begin = static_cast<int64_t>(c) * chunk;
  const int64_t end = static_cast<int64_t>(c) == n_chunks - 1
                          ? job_n_.load(std::memory_order_relaxed)
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
    int64_t skipped = 0;
    for (int s = 0; s < n_threads_; ++s) {
      std::atomic<uint64_t>& r = ranges_[static_cast<size_t>(s)].word;
      uint64_t w = r.load(std::memory_order_acquire);
      while (gen_of(w) == gen && ((w >> 16) & 0xffff) < (w & 0xffff)) {
        const uint64_t emptied = (w & ~uint64_t{0xffffffff}) | ((w & 0xffff) << 16) | (w & 0xffff);
        if (r.compare_exchange_weak(w, emptied, std::memory_order_acq_rel)) {
          skipped += static_cast<int64_t>((w & 0xffff) - ((w >> 16) & 0xffff));
          break;
        }
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
    run_chunks(seen, -1);
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
