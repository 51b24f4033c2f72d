// A rank that dies or stops answering in the middle of an expert-parallel generation over MPI
// ends the run on every other rank within seconds, never a hang. Each test runs in its own
// mpirun job (tests/cmake/dist.cmake), which ends with the failure, so ctest checks the printed
// lines and the times in them rather than the exit status:
//  - KilledRank: rank 1 kills itself (SIGKILL) at decode step 2. Under a plain mpirun, mpirun
//    notices and tears the job down (tests/dist/mpirun_after_kill.sh prints how long after the
//    kill); under `mpirun --enable-recovery` the others keep running and their watchdog must
//    report it.
//  - StoppedRank: rank 1 stops (SIGSTOP) at decode step 2, which mpirun does not notice: the
//    others' watchdog (the default one) names the waiting collective and the silent rank.
// A survivor prints "rank R: generate failed after S s: <error>", S counted from the start of
// the generation (so at least the time from the failure), then the job ends in MPI_Abort.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "dist/mpi_backend.h"
#include "dist/mpi_ep_util.h"
#include "engine/generator.h"
#include "moe/borrowed_dispatcher.h"

namespace duet {
namespace {

constexpr int kVictim = 1;
constexpr int kFailStep = 2;  // the decode step in which the victim fails

// Every rank generates one request (enough tokens to outlast the failure); the victim raises
// `sig` before its first dispatch of decode step kFailStep, the others must get an Error.
void run_until_victim_fails(int sig, const char* sig_name, std::chrono::milliseconds watchdog) {
  DistContext ctx = make_mpi_context(watchdog);
  ASSERT_GT(ctx.world_size(), kVictim);
  const std::string dir = test::shared_tiny_model_dir(ctx.coord(), "qwen3_moe");
  test::RankShare share = test::load_rank_share(dir, ctx);
  ThreadPool pool(1);
  EpDispatcher ep(ctx.comm(), share.place, {});
  const int me = ctx.rank();
  const int at = me == kVictim ? kFailStep * test::n_moe_layers(*share.model) + 1 : 0;
  test::HookedDispatcher d(ep, at, [sig, sig_name, me] {
    const auto unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    std::printf("rank %d: raising %s in decode step %d at unix time %lld ms\n", me, sig_name,
                kFailStep, static_cast<long long>(unix_ms));
    std::fflush(stdout);
    raise(sig);
  });
  Generator gen(*share.model, pool, KvCacheDtype::kAuto, test::borrowing_group(ctx.coord(), d));
  GenerateRequest req = test::ep_requests(1)[0];
  req.max_tokens = 2 * kFailStep + 4;
  ctx.coord().barrier();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    gen.generate({req});
    FAIL() << "rank " << me << ": generate returned although rank " << kVictim << " failed";
  } catch (const Error& e) {
    const double s = test::seconds_since(t0);
    std::printf("rank %d: generate failed after %.2f s: %s\n", me, s, e.what());
    std::fflush(stdout);
    EXPECT_LT(s, 10.0);
  }
}

TEST(MpiEpFailure, KilledRank) {
  run_until_victim_fails(SIGKILL, "SIGKILL", kMpiWatchdog);  // what make_mpi_context uses
}

TEST(MpiEpFailure, StoppedRank) {
  run_until_victim_fails(SIGSTOP, "SIGSTOP", kMpiWatchdog);  // what make_mpi_context uses
}

}  // namespace
}  // namespace duet
