// The core split of --comm-cores: each rank's share of the process's cores, the communication
// thread's cores apart from the compute pool's, and pinning that takes effect on the threads.
#include "core/affinity.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/comm_thread.h"

namespace duet {
namespace {

TEST(SplitCores, EachRankGetsItsSliceAndTheCommCoresComeLast) {
  const std::vector<int> cores = {0, 1, 2, 3, 4, 5, 6, 7};
  CoreSplit s = split_cores(cores, 0, 1, 1);
  EXPECT_EQ(s.compute, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(s.comm, (std::vector<int>{7}));
  s = split_cores(cores, 1, 2, 2);  // rank 1 of 2 ranks in this process: cores 4..7
  EXPECT_EQ(s.compute, (std::vector<int>{4, 5}));
  EXPECT_EQ(s.comm, (std::vector<int>{6, 7}));
  s = split_cores(cores, 0, 1, 0);
  EXPECT_EQ(s.compute, cores);
  EXPECT_TRUE(s.comm.empty());
  try {
    split_cores({0, 1}, 1, 2, 1);  // rank 1's share is core 1 alone
    FAIL() << "no core left for compute";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least one left for compute"), std::string::npos)
        << e.what();
  }
}

// Pinned to the first allowed core, the pool's threads and the communication thread run only
// there; pinned back, they may run anywhere again.
TEST(Affinity, PoolAndCommThreadRunWhereTheyArePinned) {
  const std::vector<int> all = allowed_cores();
  ASSERT_FALSE(all.empty());
  const std::vector<int> first = {all.front()};
  ThreadPool pool(2);
  pool.pin(first);
  std::mutex mu;
  std::set<std::vector<int>> seen;
  pool.parallel_for(64, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(this_thread_cores());
  });
  EXPECT_EQ(seen, (std::set<std::vector<int>>{first}));
  pool.pin(all);
  EXPECT_EQ(this_thread_cores(), all);

  CommThread comm("test-comm", std::chrono::seconds(5));
  comm.pin({all.back()});
  std::vector<int> on_comm;
  comm.submit("where", [&] { on_comm = this_thread_cores(); }).wait();
  EXPECT_EQ(on_comm, std::vector<int>{all.back()});
}

std::string this_thread_name() {
  char buf[16] = {};
  pthread_getname_np(pthread_self(), buf, sizeof(buf));
  return buf;
}

TEST(Affinity, ThreadsAreNamedForPerfAndTop) {
  std::string named;
  std::thread t([&] {
    name_this_thread("duet-a-name-longer-than-fifteen");
    named = this_thread_name();
  });
  t.join();
  EXPECT_EQ(named, "duet-a-name-lon");  // Linux keeps 15 bytes

  // The pool's workers and the communication thread carry the names perf shows.
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::string> names;
  const std::string caller = this_thread_name();
  for (int round = 0; round < 1000 && names.size() < 2; ++round) {
    pool.parallel_for(8, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::lock_guard<std::mutex> lock(mu);
      names.insert(this_thread_name());
    });
  }
  EXPECT_EQ(names, (std::set<std::string>{caller, "duet-pool"}));
  CommThread comm("comm", std::chrono::seconds(5));
  std::string on_comm;
  comm.submit("name", [&] { on_comm = this_thread_name(); }).wait();
  EXPECT_EQ(on_comm, "duet-comm");
}

}  // namespace
}  // namespace duet
