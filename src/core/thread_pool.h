// One long-lived pool of worker threads per process (or per rank). Work is handed out with
// parallel_for; the calling thread takes part, and idle workers block on a condition variable
// (no thread created per call). Before blocking, a worker polls for the next job for a bounded
// few tens of microseconds, and the caller polls for the job's end likewise: the jobs of one
// decode step follow each other that closely, and waking a sleeping vCPU costs more.
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
  void worker_loop(int worker_index);
  // Runs chunks of the current job until none is left to start. REQUIRES: lock holds mu_ (it
  // is released while a chunk runs and held again on return).
  void run_chunks(std::unique_lock<std::mutex>& lock);
  // Polls until generation_ differs from `seen` or the spin budget is spent.
  void spin_for_job(uint64_t seen) const;
  // Polls until every chunk of the current job is done or the spin budget is spent.
  void spin_for_done() const;

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::condition_variable park_cv_;  // parked workers wait here for set_active_workers
  // All GUARDED_BY(mu_):
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_chunk_ = 0;   // next chunk index to hand out
  int64_t n_chunks_ = 0;
  int64_t n_sleeping_ = 0;  // workers and helpers blocked on work_cv_: only then is a notify needed
  int active_workers_ = 0;  // workers [0, active_workers_) take part; the others are parked
  std::atomic<int> n_helpers_{0};  // threads inside help_until(); written with mu_ held
  bool stop_ = false;
  std::exception_ptr error_;
  // Written only with mu_ held; atomic so that spinning threads may poll them without it.
  std::atomic<int64_t> chunks_done_{0};
  std::atomic<uint64_t> generation_{0};  // bumped per job so workers see new work
};

// The number of cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

}  // namespace duet
