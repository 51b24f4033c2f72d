#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"

namespace duet {
namespace {

struct Chunk {
  int64_t begin;
  int64_t end;
};

// Runs parallel_for and returns the chunks it handed out, checking each index ran once.
std::vector<Chunk> run_and_check(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mu;
  std::vector<Chunk> chunks;
  pool.parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
        std::lock_guard<std::mutex> lock(mu);
        chunks.push_back({begin, end});
      },
      min_chunk);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " n " << n;
  }
  return chunks;
}

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  for (int n_threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(n_threads);
    EXPECT_EQ(pool.n_threads(), n_threads);
    for (int64_t n : {1, 2, 3, 7, 16, 100, 1000, 12345}) {
      for (int64_t min_chunk : {1, 4, 16, 1000}) {
        SCOPED_TRACE(testing::Message()
                     << "threads " << n_threads << " n " << n << " min_chunk " << min_chunk);
        std::vector<Chunk> chunks = run_and_check(pool, n, min_chunk);
        for (const Chunk& c : chunks) {
          EXPECT_LT(c.begin, c.end);
          // Chunks start on multiples of min_chunk, are at least min_chunk long (unless n is
          // smaller), and all but the last are whole multiples of it.
          EXPECT_EQ(c.begin % min_chunk, 0);
          EXPECT_GE(c.end - c.begin, std::min(n, min_chunk));
          if (c.end != n) {
            EXPECT_EQ((c.end - c.begin) % min_chunk, 0);
          }
        }
        if (n_threads > 1 && n >= 8 * n_threads * min_chunk) {
          EXPECT_GT(chunks.size(), 1u) << "work was not split";
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ZeroItemsNeverCallsFn) {
  ThreadPool pool(3);
  bool called = false;
  pool.parallel_for(0, [&](int64_t, int64_t) { called = true; });
  pool.parallel_for(-5, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPoolTest, PoolOfOneRunsInlineOnCaller) {
  ThreadPool pool(1);
  std::set<std::thread::id> ids;
  int calls = 0;
  pool.parallel_for(1000, [&](int64_t begin, int64_t end) {
    ids.insert(std::this_thread::get_id());
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 1000);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
}

TEST(ThreadPoolTest, FirstExceptionIsRethrownOnCaller) {
  ThreadPool pool(4);
  for (int64_t bad : {0, 37, 999}) {
    EXPECT_THROW(pool.parallel_for(1000,
                                   [&](int64_t begin, int64_t end) {
                                     if (begin <= bad && bad < end) throw std::out_of_range("bad");
                                   }),
                 std::out_of_range);
  }
  // Every chunk throwing: still exactly one exception, and the pool keeps working.
  EXPECT_THROW(pool.parallel_for(100, [](int64_t, int64_t) { throw std::runtime_error("all"); }),
               std::runtime_error);
  run_and_check(pool, 5000, 1);
}

TEST(ThreadPoolTest, ExceptionFromInlineRunPropagates) {
  ThreadPool pool(1);
  EXPECT_THROW(pool.parallel_for(10, [](int64_t, int64_t) { throw std::logic_error("x"); }),
               std::logic_error);
}

TEST(ThreadPoolTest, ManyRepeatedCallsDoNotDeadlock) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  constexpr int kCalls = 20000;
  for (int call = 0; call < kCalls; ++call) {
    int64_t n = 1 + call % 13;
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
      int64_t s = 0;
      for (int64_t i = begin; i < end; ++i) s += i;
      sum += s;
    });
  }
  int64_t expected = 0;
  for (int call = 0; call < kCalls; ++call) {
    int64_t n = 1 + call % 13;
    expected += n * (n - 1) / 2;
  }
  EXPECT_EQ(sum.load(), expected);
}

// Jobs posted back to back, each with its own function, length and chunk count: a thread that saw
// one job but takes its chunk after that job ended must not run a chunk of the next one with the
// last one's function or bounds (chunks are taken without a lock). Every job counts its own
// indices: each exactly once, none out of range.
TEST(ThreadPoolTest, BackToBackJobsNeverMix) {
  for (int n_threads : {2, 3}) {
    ThreadPool pool(n_threads);
    for (int job = 0; job < 20000; ++job) {
      const int64_t n = 2 + (job * 7) % 61;
      std::vector<int> hits(static_cast<size_t>(n), 0);
      std::atomic<int> out_of_range{0};
      pool.parallel_for(
          n,
          [&hits, &out_of_range, n](int64_t begin, int64_t end) {
            if (begin < 0 || end > n || begin >= end) {
              ++out_of_range;
              return;
            }
            for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
          },
          1 + job % 3);
      ASSERT_EQ(out_of_range.load(), 0) << "job " << job;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[static_cast<size_t>(i)], 1)
            << "job " << job << " index " << i << " of " << n;
      }
    }
  }
}

TEST(ThreadPoolTest, CreateAndDestroyRepeatedly) {
  for (int i = 0; i < 200; ++i) {
    ThreadPool pool(1 + i % 4);
    if (i % 2 == 0) run_and_check(pool, 64, 1);
  }
}

TEST(ThreadPoolTest, NestedCallOnSamePoolIsRejected) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(
                   100, [&](int64_t, int64_t) { pool.parallel_for(100, [](int64_t, int64_t) {}); }),
               Error);
  run_and_check(pool, 100, 1);
}

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Workers poll for the next job only briefly: a pool left idle must go to sleep, not burn the
// cores it is waiting on.
TEST(ThreadPoolTest, IdleWorkersSleep) {
  ThreadPool pool(3);
  run_and_check(pool, 1000, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past any spin budget
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double used = process_cpu_seconds() - before;
  EXPECT_LT(used, 0.02) << "idle pool used " << used << " s of CPU in 0.2 s";
}

// A worker asleep after its spin, and one still polling, are both handed the next job: a chunk
// that waits for a second thread to show up sees one (a lost wake-up would leave the caller
// alone with every chunk).
bool worker_joins(ThreadPool& pool) {
  std::atomic<int> arrived{0};
  std::atomic<bool> met{false};
  pool.parallel_for(8, [&](int64_t, int64_t) {
    arrived++;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    if (arrived.load() >= 2) met = true;
  });
  return met.load();
}

TEST(ThreadPoolTest, SleepingAndSpinningWorkersAreWoken) {
  ThreadPool pool(2);
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(i % 2 ? 5 : 0));
    EXPECT_TRUE(worker_joins(pool)) << "round " << i;
  }
}

// A parked worker takes no chunk, and is back once raised: with both of a 3-thread pool's workers
// parked every chunk runs on the caller; with one raised, a chunk that waits for a second thread
// meets one.
TEST(ThreadPoolTest, ParkedWorkersTakeNoChunk) {
  ThreadPool pool(3);
  pool.set_active_workers(0);
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> elsewhere{0};
    pool.parallel_for(64, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      if (std::this_thread::get_id() != caller) ++elsewhere;
    });
    ASSERT_EQ(elsewhere.load(), 0) << "round " << round;
  }
  pool.set_active_workers(1);
  EXPECT_TRUE(worker_joins(pool));
  pool.set_active_workers(2);
  run_and_check(pool, 1000, 1);
  EXPECT_THROW(pool.set_active_workers(3), Error);
  EXPECT_THROW(pool.set_active_workers(-1), Error);
}

// A helper takes the place of a parked worker: it runs chunks of the jobs posted meanwhile (every
// index still once), sleeps between them, and leaves as soon as its done() turns true, whether
// it is running a chunk, polling or asleep then.
TEST(ThreadPoolTest, AHelperComputesUntilItIsDone) {
  ThreadPool pool(2);
  pool.set_active_workers(0);
  std::atomic<bool> done{false};
  std::atomic<std::thread::id> helper_id{};
  std::atomic<int> helped{0};
  std::thread helper([&] {
    helper_id = std::this_thread::get_id();
    pool.help_until([&] { return done.load(); });
  });
  while (helper_id.load() == std::thread::id{}) std::this_thread::yield();
  for (int round = 0; round < 40; ++round) {
    if (round % 10 == 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // asleep
    run_and_check(pool, 1000, 1);
    std::atomic<int> arrived{0};
    pool.parallel_for(8, [&](int64_t, int64_t) {
      arrived++;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      if (std::this_thread::get_id() == helper_id.load()) ++helped;
    });
  }
  EXPECT_GT(helped.load(), 0) << "the helper never took a chunk";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past its polling: asleep
  done = true;
  pool.wake_helpers();
  helper.join();  // hangs (the test times out) if it slept through
  // An exception in a chunk the helper ran reaches the caller.
  std::atomic<bool> done2{false};
  std::thread helper2([&] { pool.help_until([&] { return done2.load(); }); });
  bool thrown = false;
  for (int round = 0; round < 200 && !thrown; ++round) {
    try {
      pool.parallel_for(4, [&](int64_t b, int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (b == 3) throw std::runtime_error("chunk 3");
      });
    } catch (const std::runtime_error&) {
      thrown = true;
    }
  }
  EXPECT_TRUE(thrown);
  done2 = true;
  pool.wake_helpers();
  helper2.join();
}

TEST(ThreadPoolTest, AvailableCoresIsPositive) {
  EXPECT_GE(available_cores(), 1);
}

}  // namespace
}  // namespace duet
