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

 private:
  void worker_loop(int worker_index);
  // Polls until generation_ differs from `seen` or the spin budget is spent.
  void spin_for_job(uint64_t seen) const;
  // Polls until every chunk of the current job is done or the spin budget is spent.
  void spin_for_done() const;

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // All GUARDED_BY(mu_):
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_chunk_ = 0;   // next chunk index to hand out
  int64_t n_chunks_ = 0;
  int64_t n_sleeping_ = 0;  // workers blocked on work_cv_: only then is a notify needed
  bool stop_ = false;
  std::exception_ptr error_;
  // Written only with mu_ held; atomic so that spinning threads may poll them without it.
  std::atomic<int64_t> chunks_done_{0};
  std::atomic<uint64_t> generation_{0};  // bumped per job so workers see new work
};

// The number of cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

}  // namespace duet
