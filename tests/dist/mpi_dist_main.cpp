// The MPI backend's tests: a GoogleTest program that every rank of an mpirun job runs
// (tests/cmake/dist.cmake starts it with 2, 3 and 4 ranks). Each test is collective.
//
// MpiHeartbeat.* checks that a peer that is merely busy for longer than the watchdog time is
// waited for (its heartbeat shows it alive).
//
// Each MpiWatchdog.* test is run on its own: rank 1 stops (SIGSTOP) in the middle of a
// collective, or the ranks call different collectives, and the others must report it within
// the watchdog time; the job then ends with MPI_Abort, so that ctest checks the printed message
// rather than the exit status.
#include <gtest/gtest.h>
#include <mpi.h>
#include <signal.h>
#include <sys/prctl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/collective_checks.h"
#include "dist/mpi_backend.h"
#include "dist/mpi_heartbeat.h"

namespace duet {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

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

// A thread that waits in a collective (the engine thread, for the control plane) naps with a 1 us
// timer slack, not Linux's default 50 us, which stretched each short nap to ~70 us.
TEST(MpiDist, AThreadWaitingInACollectiveNapsWithFineTimers) {
  DistContext ctx = make_mpi_context();
  long before = -1, after = -1;
  std::thread t([&] {
    // Linux's default; a thread inherits its creator's slack, and this test's main thread has
    // waited in collectives before.
    ::prctl(PR_SET_TIMERSLACK, 50000UL, 0, 0, 0);
    before = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    ctx.coord().barrier();
    after = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  });
  t.join();
  EXPECT_EQ(before, 50000);
  EXPECT_EQ(after, 1000);
}

// duet starts MPI with its TCP transport sending messages up to 4 MiB eagerly (no rendezvous
// round trip per dispatch or combine message), read back through MPI's tool interface.
TEST(MpiDist, TcpTransportSendsEagerlyUpTo4MiB) {
  DistContext ctx = make_mpi_context();
  int provided = 0;
  ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  int n = 0;
  MPI_T_cvar_get_num(&n);
  std::map<std::string, unsigned long long> found;
  for (int i = 0; i < n; ++i) {
    char name[256], desc[1024];
    int name_len = sizeof name, desc_len = sizeof desc, verbosity = 0, bind = 0, scope = 0;
    MPI_Datatype type;
    MPI_T_enum enumtype;
    if (MPI_T_cvar_get_info(i, name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len,
                            &bind, &scope) != MPI_SUCCESS) {
      continue;
    }
    const std::string key(name);
    if (key != "btl_tcp_eager_limit" && key != "btl_tcp_rndv_eager_limit" &&
        key != "btl_tcp_max_send_size") {
      continue;
    }
    MPI_T_cvar_handle handle;
    int count = 0;
    ASSERT_EQ(MPI_T_cvar_handle_alloc(i, nullptr, &handle, &count), MPI_SUCCESS);
    int size = 0;
    MPI_Type_size(type, &size);
    ASSERT_EQ(count, 1);
    ASSERT_LE(size, 8);
    unsigned long long value = 0;  // little-endian: the low bytes hold a narrower type's value
    ASSERT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS);
    MPI_T_cvar_handle_free(&handle);
    found[key] = value;
  }
  MPI_T_finalize();
  ASSERT_EQ(found.size(), 3u) << "Open MPI's TCP transport parameters not found";
  for (const MpiParam& p : mpi_tcp_defaults()) {
    const std::string key = std::string(p.name).substr(std::string("OMPI_MCA_").size());
    EXPECT_EQ(found[key], std::stoull(p.value)) << key;
  }
  EXPECT_EQ(found["btl_tcp_eager_limit"], 4194304u);
}

// Rank 1 dies (SIGKILL) after MPI has started but before duet's start-up collectives (the
// heartbeat's and the channels' duplicates of MPI_COMM_WORLD): rank 0's make_mpi_context reports
// it after kStartupWatchdogs watchdog times instead of hanging. Run alone under mpirun
// --enable-recovery (the survivor keeps running); ctest checks the printed message.
TEST(MpiStartup, RankDeadBeforeSetUpIsReported) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) raise(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    DistContext ctx = make_mpi_context(std::chrono::milliseconds(1000));
    std::printf("start-up did not fail on rank %d\n", rank);
  } catch (const Error& e) {
    std::printf("start-up failed after %.1f s on rank %d: %s\n", seconds_since(t0), rank, e.what());
  }
  std::fflush(stdout);
  std::_Exit(0);  // MPI cannot finish with a request abandoned to a dead rank
}

// Rank 1 stops (SIGSTOP) before it starts MPI: rank 0's MPI_Init would wait for it for ever;
// make_mpi_context ends the process after kStartupWatchdogs watchdog times with a message naming
// the cause. Run alone; ctest checks the message (the job then ends: rank 0 exits with 1).
TEST(MpiStartup, RankStoppedBeforeMpiStartsIsReported) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  ASSERT_NE(rank, nullptr) << "run under mpirun";
  if (std::string(rank) == "1") raise(SIGSTOP);
  std::fprintf(stderr, "rank %s starts MPI\n", rank);
  DistContext ctx = make_mpi_context(std::chrono::milliseconds(1000));
  std::printf("MPI started on rank %s\n", rank);
}

// Two contexts at once do not see each other's messages.
TEST(MpiDist, TwoContexts) {
  DistContext a = make_mpi_context();
  DistContext b = make_mpi_context();
  test::check_all_to_all_v(a, true);
  test::check_all_reduce(b);
  test::check_coordinator(a);
}

// Rank 1 computes (sleeps) for 2.5 watchdog times before it joins a coordinator barrier and
// then a data collective; the others wait for it without an error (also past the handle's
// backstop, watchdog + 1 s).
TEST(MpiHeartbeat, BusyPeerIsWaitedFor) {
  const std::chrono::milliseconds watchdog(1000);
  const std::chrono::milliseconds busy(2500);
  DistContext ctx = make_mpi_context(watchdog);
  ctx.coord().barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (ctx.rank() == 1) std::this_thread::sleep_for(busy);
  ctx.coord().barrier();
  const double s_coord = seconds_since(t0);
  if (ctx.rank() == 1) std::this_thread::sleep_for(busy);
  float v[2] = {1, float(ctx.rank())};
  ctx.comm().all_reduce(v, 2, ElemType::kF32, ReduceOp::kSum);
  const double s_data = seconds_since(t0) - s_coord;
  const int n = ctx.world_size();
  EXPECT_EQ(v[0], float(n));
  EXPECT_EQ(v[1], float(n * (n - 1) / 2));
  std::printf("rank %d waited %.2f s at the barrier and %.2f s at the all_reduce\n", ctx.rank(),
              s_coord, s_data);
  std::fflush(stdout);
  if (ctx.rank() != 1) {
    EXPECT_GT(s_coord, 2.0 * watchdog.count() / 1000);
    EXPECT_GT(s_data, 2.0 * watchdog.count() / 1000);
  }
}

// The beats' own TCP connections alone keep every peer heard (the MPI path off), and the test
// can fail: with neither path the peers fall silent.
TEST(MpiHeartbeat, SocketBeatsAloneShowPeersAlive) {
  DistContext ctx = make_mpi_context();
  const std::chrono::milliseconds watchdog(1000);
  bool abandoned = false;
  MpiHeartbeat sockets_only(std::chrono::seconds(20), &abandoned,
                            {/*mpi=*/false, /*sockets=*/true});
  MpiHeartbeat neither(std::chrono::seconds(20), &abandoned, {/*mpi=*/false, /*sockets=*/false});
  EXPECT_EQ(sockets_only.n_socket_peers(), ctx.world_size() - 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(sockets_only.verdict(watchdog), "");
  EXPECT_NE(neither.verdict(watchdog).find("sent no heartbeat"), std::string::npos);
  ctx.coord().barrier();  // nobody stops beating before every rank has judged
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
    const double s = seconds_since(t0);
    std::printf("watchdog fired after %.2f s on rank %d: %s\n", s, ctx.rank(), e.what());
    std::fflush(stdout);
    EXPECT_LT(s, 3.0);
  }
}

// Rank 0 waits at a coordinator barrier while rank 1 waits at a data all_reduce: both are alive
// and beating, but neither collective can ever finish. Each names the out-of-step collectives
// within the watchdog time instead of waiting for the other forever.
TEST(MpiWatchdog, OutOfStepRanksAreReported) {
  DistContext ctx = make_mpi_context(std::chrono::milliseconds(1000));
  ctx.coord().barrier();
  const auto t0 = std::chrono::steady_clock::now();
  static float v[4] = {1, 2, 3, 4};  // static: the abandoned request may still point at it
  try {
    if (ctx.rank() == 0) {
      ctx.coord().barrier();
    } else {
      ctx.comm().all_reduce(v, 4, ElemType::kF32, ReduceOp::kSum);
    }
    FAIL() << "a collective returned although the ranks are out of step";
  } catch (const Error& e) {
    const double s = seconds_since(t0);
    std::printf("watchdog fired after %.2f s on rank %d: %s\n", s, ctx.rank(), e.what());
    std::fflush(stdout);
    EXPECT_LT(s, 3.0);
  }
}

}  // namespace
}  // namespace duet
