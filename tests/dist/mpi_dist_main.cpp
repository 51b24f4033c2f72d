// The MPI backend's tests: a GoogleTest program that every rank of an mpirun job runs
// (tests/cmake/dist.cmake starts it with 2, 3 and 4 ranks). Each test is collective.
//
// MpiWatchdog.* is run on its own: rank 1 stops (SIGSTOP) in the middle of a collective and
// rank 0 must report it within the watchdog time; the job then ends with MPI_Abort, so that
// ctest checks the printed message rather than the exit status.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "dist/collective_checks.h"
#include "dist/mpi_backend.h"

namespace duet {
namespace {

TEST(MpiDist, RankInfo) {
  DistContext ctx = make_mpi_context();
  Coordinator& c = ctx.coord();
  EXPECT_GE(c.world_size(), 1);
  EXPECT_LT(c.rank(), c.world_size());
  EXPECT_LT(c.local_rank(), c.local_world_size());
  // All ranks of this test run on one host.
  EXPECT_EQ(c.local_rank(), c.rank());
  EXPECT_EQ(c.local_world_size(), c.world_size());
  EXPECT_EQ(ctx.comm().rank(), c.rank());
  EXPECT_EQ(ctx.comm().world_size(), c.world_size());
}

TEST(MpiDist, EveryCollective) {
  DistContext ctx = make_mpi_context();
  test::check_every_collective(ctx);
}

// Two contexts at once do not see each other's messages.
TEST(MpiDist, TwoContexts) {
  DistContext a = make_mpi_context();
  DistContext b = make_mpi_context();
  test::check_all_to_all_v(a, true);
  test::check_all_reduce(b);
  test::check_coordinator(a);
}

TEST(MpiWatchdog, StoppedRankIsReported) {
  DistContext ctx = make_mpi_context(std::chrono::milliseconds(1000));
  ctx.coord().barrier();
  if (ctx.rank() == 1) raise(SIGSTOP);  // stops answering; mpirun kills it when the job aborts
  const auto t0 = std::chrono::steady_clock::now();
  static float v[4] = {1, 2, 3, 4};  // static: the abandoned request may still point at it
  try {
    ctx.comm().all_reduce(v, 4, ElemType::kF32, ReduceOp::kSum);
    FAIL() << "all_reduce returned although rank 1 is stopped";
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("watchdog fired after %.2f s on rank %d: %s\n", s, ctx.rank(), e.what());
    std::fflush(stdout);
    EXPECT_LT(s, 3.0);
  }
}

}  // namespace
}  // namespace duet
