// One long-lived pool of worker threads per process (or per rank). Work is handed out with
// parallel_for; the calling thread takes part, and idle workers block on a condition variable
// (no thread created per call). Before blocking, a worker polls for the next job for a bounded
// few tens of microseconds, and the caller polls for the job's end likewise: the jobs of one
// decode step follow each other that closely, and waking a sleeping vCPU costs more. While a job
// runs no lock is taken: a thread takes a chunk with one compare-and-swap and counts it done with
// one atomic add (a decode step posts some 40 jobs; 8-chunk jobs of 20 us on 2 threads, in a
// harness on the Zen 4 VM, took 11.4-13.0 us with a mutex taken at every chunk, 10.5-10.7
// without). Each thread has a share of every job's chunks, runs it in order and then takes what
// is left of the others' from their ends.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace duet {

class ThreadPool {
 public:
  // n_threads counts the caller: ThreadPool(1) runs everything on the caller.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }
  // Restricts the workers and the calling thread (which runs its share of every job) to `cores`.
  void pin(const std::vector<int>& cores);

  // Splits [0, n) into contiguous chunks and runs fn(begin, end) on them, on the caller and the
  // workers; returns when every chunk is done. Chunks are at least `min_chunk` long. Not
  // reentrant: fn must not call parallel_for on the same pool. Exceptions thrown by fn are
  // rethrown on the caller (the first one).
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                    int64_t min_chunk = 1);

  // Parks all but `n` of the pool's own worker threads (0 <= n < n_threads()): they sleep until
  // raised again, while the caller of parallel_for and any helper (help_until) go on taking part.
  // The overlapped scheduler parks one so that its engine thread, helping, keeps the count of
  // compute threads at the count of cores.
  void set_active_workers(int n);
  int active_workers();

  // The calling thread takes chunks of the pool's jobs, as a worker does (polling for the next,
  // then sleeping), until done() returns true. done() is checked between chunks, while polling
  // and, with mu_ held, before sleeping: it must be cheap and safe on any thread, and whoever
  // makes it true must call wake_helpers() after. Never call it from a chunk or from the thread
  // inside parallel_for on this pool.
  void help_until(const std::function<bool()>& done);
  // Wakes the helpers so that they check their done() again.
  void wake_helpers();

 private:
  // word_ holds the current job's generation (bits 32-63); each thread's share of the job's
  // chunks is a Range of the same generation. One compare-and-swap takes a chunk of exactly the
  // job a thread saw, so a thread late for a job never runs a chunk of the next one.
  static uint64_t gen_of(uint64_t word) { return word >> 32; }

  void worker_loop(int worker_index);
  // Takes and runs chunks of job `gen` until none is left to start: share `slot`'s from its front
  // (the caller's is 0, worker i's i + 1; a helper, -1, has none), then the others' from their
  // backs.
  void run_chunks(uint64_t gen, int slot);
  // Takes one chunk of share `slot` of job `gen`, its first or its last, and runs it; false once
  // the share is empty (or the job is over).
  bool run_one_chunk(uint64_t gen, int slot, bool from_back);
  // Counts `n` chunks of the job (of n_chunks) done, waking the caller if it sleeps on the last.
  void chunks_finished(int64_t n, int64_t n_chunks);
  // Blocks until generation differs from `seen`, stop_, parking, or done() (when given).
  // REQUIRES: lock holds mu_.
  void sleep_for_job(std::unique_lock<std::mutex>& lock, uint64_t seen, int worker_index,
                     const std::function<bool()>* done);
  // Polls until the generation differs from `seen` or the spin budget is spent.
  void spin_for_job(uint64_t seen) const;
  // Polls until every chunk of the current job is done or the spin budget is spent.
  void spin_for_done(int64_t n_chunks) const;

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;  // guards sleeping and waking, error_, parking; never held while a chunk runs
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::condition_variable park_cv_;  // parked workers wait here for set_active_workers

  // The current job, written by the posting thread before it publishes word_ (release), read by
  // a thread only once it holds one of the job's chunks: the job cannot end, nor the next one be
  // posted, before that chunk is done.
  std::atomic<const std::function<void(int64_t, int64_t)>*> job_{nullptr};
  std::atomic<int64_t> job_n_{0};
  std::atomic<int64_t> job_chunk_{0};
  std::atomic<int64_t> job_chunks_{0};
  std::atomic<uint64_t> word_{0};
  // Chunks [lo, hi) of a thread's share: generation (bits 32-63), lo (16-31), hi (0-15). Each in
  // a cache line of its own: its owner and a thief meet there only at the end of a job.
  struct alignas(64) Range {
    std::atomic<uint64_t> word{0};
  };
  std::vector<Range> ranges_;            // [n_threads_]
  std::atomic<int64_t> chunks_done_{0};  // of the current job
  std::atomic<bool> busy_{false};        // a parallel_for is posting or waiting (not reentrant)

  // Sleepers and the threads that wake them meet through these (seq_cst) and mu_: a sleeper
  // counts itself under mu_ before its last look at the state; a waker changes the state, then
  // takes mu_ before notifying if it sees a sleeper.
  std::atomic<int> n_sleeping_{0};            // workers and helpers blocked on work_cv_
  std::atomic<bool> caller_sleeping_{false};  // the poster blocked on done_cv_
  std::atomic<int> active_workers_{0};        // workers [0, active_workers_) take part
  std::atomic<int> n_helpers_{0};             // threads inside help_until()
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};  // error_ holds an exception of the current job
  std::exception_ptr error_;         // GUARDED_BY(mu_)
};

// The number of cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

}  // namespace duet
