// `duet bench all2all`: the latency and bandwidth of one MoE layer's dispatch + combine for both
// all-to-all algorithms, and a raw all-to-all of the same bytes in the same run (what the
// transport alone gives). Ranks are in-process threads (`--distributed-backend inproc`, the
// default) or the processes of an mpirun job (`--distributed-backend mpi`: the command
// re-executes itself under `mpirun -np WORLD` unless it already runs under mpirun).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "core/error.h"
#include "dist/inproc_backend.h"
#include "dist/launcher.h"
#include "dist/mpi_backend.h"
#include "moe/ep_dispatcher.h"

namespace duet {

namespace {

struct All2AllOptions {
  int world = 2;
  int64_t tokens = 128;  // per rank
  int64_t hidden = 2048;
  int64_t topk = 8;
  int64_t experts = 64;
  int iters = 20;
  std::string backend = "inproc";
};

using Clock = std::chrono::steady_clock;

struct Timing {
  double median_s = 0;  // the slowest rank's time, median over iterations
  double bytes = 0;     // payload bytes all ranks sent per iteration
};

// Runs `step` iters times after two warm-ups; each iteration's time is the slowest rank's.
Timing time_steps(DistContext& ctx, int iters, const std::function<int64_t()>& step) {
  std::vector<double> times;
  int64_t bytes = 0;
  for (int i = 0; i < iters + 2; ++i) {
    ctx.coord().barrier();
    const auto t0 = Clock::now();
    bytes = step();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::vector<int64_t> all = ctx.coord().all_gather({static_cast<int64_t>(dt * 1e9)});
    if (i >= 2) times.push_back(*std::max_element(all.begin(), all.end()) * 1e-9);
  }
  std::sort(times.begin(), times.end());
  int64_t total = 0;
  for (int64_t b : ctx.coord().all_gather({bytes})) total += b;
  return {times[times.size() / 2], static_cast<double>(total)};
}

void bench_rank(DistContext& ctx, const All2AllOptions& o) {
  const ExpertPlacement place = place_experts(o.experts, ctx.world_size());
  if (o.topk < 1 || o.topk > o.experts) DUET_ERROR("--topk must be in [1, --experts]");
  std::mt19937 rng(17 + ctx.rank());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(o.tokens * o.hidden)), w, out(x.size());
  for (float& v : x) v = u(rng);
  std::vector<int32_t> ids;
  std::vector<int32_t> perm(static_cast<size_t>(o.experts));
  for (int64_t t = 0; t < o.tokens; ++t) {  // k distinct uniformly random experts per token
    for (int64_t e = 0; e < o.experts; ++e) perm[e] = static_cast<int32_t>(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t k = 0; k < o.topk; ++k) ids.push_back(perm[k]), w.push_back(1.0f / o.topk);
  }
  const RoutedTokens rt{x.data(), ids.data(), w.data(), o.tokens, o.hidden, o.topk};
  if (ctx.rank() == 0) {
    std::printf("all2all: %d ranks (%s), %lld tokens/rank, hidden %lld, top-%lld of %lld experts\n",
                ctx.world_size(), o.backend.c_str(), (long long)o.tokens, (long long)o.hidden,
                (long long)o.topk, (long long)o.experts);
    std::printf("%-16s %12s %12s %10s\n", "algorithm", "median ms", "MB/iter", "GB/s");
  }
  auto report = [&](const char* name, const Timing& t) {
    if (ctx.rank() != 0) return;
    std::printf("%-16s %12.3f %12.2f %10.2f\n", name, t.median_s * 1e3, t.bytes / 1e6,
                t.bytes / t.median_s / 1e9);
  };
  int64_t ht_bytes_per_rank = 0;
  for (All2AllBackend b : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
    EpDispatcher ep(ctx.comm(), place, {b, o.tokens});
    const Timing t = time_steps(ctx, o.iters, [&] {
      ep.dispatch_send(rt);
      ExpertBatch& batch = ep.dispatch_recv();
      batch.y = batch.x;  // the experts are not the point here
      ep.combine_send();
      std::fill(out.begin(), out.end(), 0.0f);
      ep.combine_recv(out.data());
      return ep.last_dispatch_bytes() + ep.last_combine_bytes();
    });
    if (b == All2AllBackend::kHighThroughput)
      ht_bytes_per_rank = static_cast<int64_t>(t.bytes) / ctx.world_size();
    report(all2all_backend_name(b), t);
  }
  // The transport alone: one all-to-all per iteration moving high_throughput's bytes, evenly.
  const int64_t part = ht_bytes_per_rank / ctx.world_size();
  std::vector<uint8_t> send(static_cast<size_t>(part * ctx.world_size())), recv(send.size());
  const std::vector<int64_t> each(static_cast<size_t>(ctx.world_size()), part);
  report("raw_all_to_all", time_steps(ctx, o.iters, [&] {
           ctx.comm().all_to_all_v(send.data(), each, recv.data(), each);
           return part * ctx.world_size();
         }));
}

void run_all2all(const All2AllOptions& o) {
  if (o.backend == "inproc") {
    run_ranks(o.world, [&](DistContext& ctx) { bench_rank(ctx, o); });
  } else if (o.backend == "mpi") {
    if (!launched_by_mpirun()) relaunch_under_mpirun(o.world);  // comes back as its ranks
    DistContext ctx = make_mpi_context();
    try {
      bench_rank(ctx, o);
    } catch (const Error& e) {
      mpi_abort(e.what());
    }
  } else {
    DUET_ERROR("--distributed-backend: '" << o.backend << "' is not inproc or mpi");
  }
}

}  // namespace

void add_bench_all2all(CLI::App& bench) {
  auto o = std::make_shared<All2AllOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "all2all", "Dispatch + combine latency and GB/s of both all-to-all algorithms vs raw MPI");
  cmd->add_option("--world", o->world, "Ranks (inproc backend; mpi: the mpirun -np)");
  cmd->add_option("--tokens", o->tokens, "Tokens per rank");
  cmd->add_option("--hidden", o->hidden, "Hidden size");
  cmd->add_option("--topk", o->topk, "Experts per token");
  cmd->add_option("--experts", o->experts, "Routed experts");
  cmd->add_option("--iters", o->iters, "Timed iterations (median reported)");
  cmd->add_option("--distributed-backend", o->backend, "inproc | mpi");
  cmd->callback([o] { run_all2all(*o); });
}

}  // namespace duet
