// The placeholder ring of the overlapped scheduler: a placeholder resolves to the token stored
// for it, slots wrap around, a pending slot is never read or reused, and the engine's two
// threads (alloc on one, store / resolve on the other) agree without a lock.
#include "engine/future_map.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/error.h"

namespace duet {
namespace {

TEST(FutureMapTest, PlaceholdersResolveToTheirTokens) {
  FutureMap f(8);
  const int32_t a = f.alloc(), b = f.alloc();
  EXPECT_LT(a, 0);
  EXPECT_LT(b, 0);
  EXPECT_NE(a, b);
  f.store(a, 42);
  f.store(b, 7);
  std::vector<int32_t> toks = {3, a, 5, b, a};
  f.resolve(toks.data(), static_cast<int64_t>(toks.size()));
  EXPECT_EQ(toks, (std::vector<int32_t>{3, 42, 5, 7, 42}));
  EXPECT_EQ(f.peek(a), 42);
}

TEST(FutureMapTest, ReadingAPlaceholderBeforeItsStepSampledItThrows) {
  FutureMap f(4);
  const int32_t a = f.alloc();
  EXPECT_EQ(f.peek(a), -1);
  std::vector<int32_t> toks = {1, a};
  EXPECT_THROW(f.resolve(toks.data(), 2), Error);
  f.store(a, 9);
  f.resolve(toks.data(), 2);
  EXPECT_EQ(toks[1], 9);
}

TEST(FutureMapTest, SlotsWrapAroundOnceStored) {
  FutureMap f(3);
  std::vector<int32_t> first;
  for (int i = 0; i < 3; ++i) first.push_back(f.alloc());
  for (int i = 0; i < 3; ++i) f.store(first[i], 100 + i);
  // The ring starts over: the same slots, now holding the new steps' tokens.
  for (int round = 1; round < 5; ++round) {
    for (int i = 0; i < 3; ++i) {
      const int32_t p = f.alloc();
      EXPECT_EQ(p, first[i]);
      EXPECT_EQ(f.peek(p), -1) << "a reused slot is pending until stored again";
      f.store(p, 100 * round + i);
      int32_t t = p;
      f.resolve(&t, 1);
      EXPECT_EQ(t, 100 * round + i);
    }
  }
}

TEST(FutureMapTest, ReusingAPendingSlotThrows) {
  FutureMap f(2);
  const int32_t a = f.alloc();
  f.alloc();
  EXPECT_THROW(f.alloc(), Error) << "slot of " << a << " is still pending";
}

TEST(FutureMapTest, BadPlaceholdersAreRefused) {
  FutureMap f(2);
  EXPECT_THROW(f.store(-3, 1), Error);
  int32_t t = -3;
  EXPECT_THROW(f.resolve(&t, 1), Error);
  const int32_t a = f.alloc();
  EXPECT_THROW(f.store(a, -1), Error);
  EXPECT_THROW(FutureMap(0), Error);
}

// One thread allocates (the engine), another stores and resolves (the worker), as the engine
// uses it: every placeholder resolves to the token stored for it, never to a stale one.
TEST(FutureMapTest, TwoThreadsAllocAndStore) {
  FutureMap f(16);
  constexpr int kN = 20000;
  std::vector<int32_t> ph(kN);
  std::atomic<int> allocated{0};
  std::atomic<int> resolved{0};
  std::thread worker([&] {
    for (int i = 0; i < kN; ++i) {
      while (allocated.load() <= i) std::this_thread::yield();
      f.store(ph[i], i % 1000);
      int32_t t = ph[i];
      f.resolve(&t, 1);
      ASSERT_EQ(t, i % 1000);
      resolved.store(i + 1);
    }
  });
  for (int i = 0; i < kN; ++i) {
    // At most half the ring outstanding, as the engine sizes it.
    while (i - resolved.load() >= 8) std::this_thread::yield();
    ph[i] = f.alloc();
    allocated.store(i + 1);
  }
  worker.join();
}

}  // namespace
}  // namespace duet
