// Every collective of the in-process backend on 1-4 ranks, including zero-size parts, the
// asynchronous forms, and the watchdog (a missing rank, a failed rank, mismatched collectives).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist/collective_checks.h"
#include "dist/inproc_backend.h"

namespace duet {
namespace {

class InprocCollectives : public ::testing::TestWithParam<int> {};

TEST_P(InprocCollectives, AllToAllV) {
  run_ranks(GetParam(), [](DistContext& ctx) {
    test::check_all_to_all_v(ctx, false);
    test::check_all_to_all_v(ctx, true);
  });
}

TEST_P(InprocCollectives, AllToAllVAllZero) {
  run_ranks(GetParam(), test::check_all_to_all_v_zero);
}
TEST_P(InprocCollectives, AllToAllBounded) {
  run_ranks(GetParam(), test::check_all_to_all_bounded);
}
TEST_P(InprocCollectives, AllGather) {
  run_ranks(GetParam(), test::check_all_gather);
}
TEST_P(InprocCollectives, AllReduce) {
  run_ranks(GetParam(), test::check_all_reduce);
}
// Several collectives in flight at once complete in order; waiting out of order is fine.
TEST_P(InprocCollectives, SeveralInFlight) {
  run_ranks(GetParam(), test::check_in_flight);
}
TEST_P(InprocCollectives, Coordinator) {
  run_ranks(GetParam(), test::check_coordinator);
}

INSTANTIATE_TEST_SUITE_P(Ranks, InprocCollectives, ::testing::Values(1, 2, 3, 4));

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Rank 2 stops answering: the others fail with the collective and the missing rank named,
// within the watchdog time of its silence (not when rank 2 eventually comes back).
TEST(InprocWatchdog, MissingRankIsNamed) {
  const auto t0 = Clock::now();
  std::vector<std::string> errors = run_ranks_collect(
      3,
      [](DistContext& ctx) {
        if (ctx.rank() == 2) {
          stop_answering(ctx);  // a hung rank: silent, its thread still there
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return;
        }
        std::vector<float> v(4, 1.0f);
        ctx.comm().all_reduce(v.data(), 4, ElemType::kF32, ReduceOp::kSum);
      },
      std::chrono::milliseconds(300));
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("all_reduce"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank(s) 2"), std::string::npos) << errors[r];
  }
  EXPECT_EQ(errors[2], "");
  EXPECT_LT(seconds_since(t0), 2.0);
}

// A rank that is busy (computing, not silent) for 2.5 watchdog times before it joins a barrier
// and an all_reduce is waited for, as the MPI backend's heartbeat makes it: no error.
TEST(InprocWatchdog, BusyRankIsWaitedFor) {
  const auto t0 = Clock::now();
  std::vector<std::string> errors = run_ranks_collect(
      3,
      [](DistContext& ctx) {
        if (ctx.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(750));
        ctx.coord().barrier();
        if (ctx.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(750));
        std::vector<float> v(4, 1.0f);
        ctx.comm().all_reduce(v.data(), 4, ElemType::kF32, ReduceOp::kSum);
        EXPECT_EQ(v[0], 3.0f);
      },
      std::chrono::milliseconds(300));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_GE(seconds_since(t0), 1.5);
}

// A rank whose function returned is gone: a peer still waiting for it gives up after the
// watchdog time, naming it.
TEST(InprocWatchdog, EndedRankIsNamed) {
  const auto t0 = Clock::now();
  std::vector<std::string> errors = run_ranks_collect(
      2,
      [](DistContext& ctx) {
        if (ctx.rank() == 1) return;
        ctx.coord().barrier();
      },
      std::chrono::milliseconds(300));
  EXPECT_NE(errors[0].find("rank 1 ended"), std::string::npos) << errors[0];
  EXPECT_LT(seconds_since(t0), 2.0);
}

// Every rank waits, each in a collective the others never join (rank 0 in the data plane, rank 1
// in the control plane): nobody works towards them, so both give up after the watchdog time.
TEST(InprocWatchdog, OutOfStepRanksAreReported) {
  const auto t0 = Clock::now();
  std::vector<std::string> errors = run_ranks_collect(
      2,
      [](DistContext& ctx) {
        if (ctx.rank() == 0) {
          std::vector<float> v(4, 1.0f);
          ctx.comm().all_reduce(v.data(), 4, ElemType::kF32, ReduceOp::kSum);
        } else {
          ctx.coord().barrier();
        }
      },
      std::chrono::milliseconds(300));
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("in collectives that do not finish"), std::string::npos) << errors[r];
  }
  EXPECT_LT(seconds_since(t0), 3.0);
}

// A rank that throws makes the others fail at once, naming it, rather than after the timeout.
TEST(InprocWatchdog, FailedRankStopsTheOthers) {
  const auto t0 = Clock::now();
  std::vector<std::string> errors = run_ranks_collect(
      4,
      [](DistContext& ctx) {
        if (ctx.rank() == 1) DUET_ERROR("out of memory");
        ctx.coord().barrier();
      },
      std::chrono::seconds(5));
  EXPECT_EQ(errors[1], "out of memory");
  for (int r : {0, 2, 3}) EXPECT_NE(errors[r].find("rank 1 failed"), std::string::npos);
  EXPECT_LT(seconds_since(t0), 2.0);
  try {
    run_ranks(2, [](DistContext& ctx) {
      if (ctx.rank() == 1) DUET_ERROR("boom");
      ctx.coord().barrier();
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1: boom");
  }
}

TEST(InprocWatchdog, MismatchedCollectivesFail) {
  std::vector<std::string> errors = run_ranks_collect(2, [](DistContext& ctx) {
    int64_t v = 1;
    std::vector<int64_t> g(2);
    if (ctx.rank() == 0)
      ctx.comm().all_gather(&v, 8, g.data());
    else
      ctx.comm().all_reduce(&v, 1, ElemType::kI64, ReduceOp::kSum);
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("mismatch"), std::string::npos) << e;
}

TEST(InprocWatchdog, BoundedPartLargerThanItsRoomFails) {
  std::vector<std::string> errors = run_ranks_collect(2, [](DistContext& ctx) {
    const std::vector<int32_t> send = {1, 2, 3, 4};
    std::vector<int32_t> recv(2);
    std::vector<int64_t> got;
    ctx.comm()
        .start("bounded", [&](CollectiveOps& ops) {
          ops.all_to_all_bounded(send.data(), {0, 8}, {0, 8}, recv.data(), {4, 0}, &got);
        })
        .wait();
  });
  EXPECT_NE(errors[1].find("has room for 4"), std::string::npos) << errors[1];
}

// After a failed collective every later one on that rank fails too (the ranks are out of step).
TEST(InprocWatchdog, FailureIsSticky) {
  std::vector<std::string> errors = run_ranks_collect(
      2,
      [](DistContext& ctx) {
        if (ctx.rank() == 1) return;
        int64_t v = 1;
        CommHandle h1 = ctx.comm().start_all_reduce(&v, 1, ElemType::kI64, ReduceOp::kSum);
        CommHandle h2 = ctx.comm().start_all_reduce(&v, 1, ElemType::kI64, ReduceOp::kSum);
        EXPECT_THROW(h1.wait(), Error);
        h2.wait();
      },
      std::chrono::milliseconds(200));
  EXPECT_NE(errors[0].find("all_reduce"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace duet
