// The communication thread's contract with the backends that poll on it: whether a result is
// awaited, and naps that a handle starting to wait cuts short.
#include "dist/comm_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;

TEST(CommThread, AnyOtherThreadAwaitsItsOwnWaits) {
  EXPECT_TRUE(CommThread::awaited());
  const Clock::time_point t0 = Clock::now();
  CommThread::nap(std::chrono::microseconds(2000));
  EXPECT_GE(Clock::now() - t0, std::chrono::microseconds(2000));
}

// A task sees no waiter until a handle waits for it, then sees one.
TEST(CommThread, ATaskIsAwaitedOnlyWhileAHandleWaitsForIt) {
  CommThread comm("test-comm", std::chrono::seconds(30));
  std::atomic<bool> release{false};
  std::atomic<int> before{-1}, during{-1};
  CommHandle h = comm.submit("task", [&] {
    before = CommThread::awaited();
    while (!CommThread::awaited()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    during = 1;
    while (!release) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(before.load(), 0);
  EXPECT_EQ(during.load(), -1);  // nobody waits yet
  std::thread releaser([&] {
    while (during.load() != 1) std::this_thread::sleep_for(std::chrono::microseconds(100));
    release = true;
  });
  h.wait();  // the task sees this wait, then the releaser lets it end
  releaser.join();
  EXPECT_EQ(during.load(), 1);
  // After the wait the thread is unawaited again.
  std::atomic<int> after{-1};
  comm.submit("next", [&] { after = CommThread::awaited(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(after.load(), 0);
}

// An unawaited nap on the thread lasts until a handle starts waiting, not its full length.
TEST(CommThread, AWaitingHandleEndsTheThreadsNap) {
  CommThread comm("test-comm", std::chrono::seconds(60));
  std::atomic<bool> napping{false};
  Clock::duration slept{};
  CommHandle h = comm.submit("nap", [&] {
    napping = true;
    const Clock::time_point t0 = Clock::now();
    CommThread::nap(std::chrono::microseconds(20'000'000));  // 20 s unless cut short
    slept = Clock::now() - t0;
  });
  while (!napping) std::this_thread::sleep_for(std::chrono::microseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  h.wait();
  EXPECT_LT(slept, std::chrono::seconds(10));
  EXPECT_GE(slept, std::chrono::milliseconds(20));
}

// A handle whose task is done returns at once and counts as no waiter.
TEST(CommThread, WaitingForAFinishedTaskLeavesNoWaiter) {
  CommThread comm("test-comm", std::chrono::seconds(30));
  CommHandle h = comm.submit("quick", [] {});
  h.wait();
  h.wait();
  std::atomic<int> seen{-1};
  CommHandle probe = comm.submit("probe", [&] { seen = CommThread::awaited(); });
  while (!probe.done()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  EXPECT_EQ(seen.load(), 0);
}

}  // namespace
}  // namespace duet
