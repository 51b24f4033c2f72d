// `duet bench all2all`: the latency and bandwidth of one MoE layer's dispatch + combine for both
// all-to-all algorithms, each with f32, bf16 or fp8 rows (--dtypes; "vs f32" is the f32 row's time
// over this row's, taken in the same run), and a raw all-to-all of the same bytes in the same run
// (what the transport alone gives). Ranks are in-process threads (`--distributed-backend inproc`,
// the default) or the processes of an mpirun job (`--distributed-backend mpi`: the command
// re-executes itself under `mpirun -np WORLD` unless it already runs under mpirun).
//
// Only the dispatcher's work is timed: dispatch_send + dispatch_recv, then combine_send +
// combine_recv, back to back. The experts are left out (the output rows they would fill keep
// whatever they hold), and with them the weighted sum of a token's experts on one rank, which
// they fuse into their down projection; so is preparing the output. Bytes are the layer's
// payload, each rank's share for itself included (the dispatcher keeps it in place;
// raw_all_to_all moves it through the transport, raw_cross_rank does not), so every row's GB/s
// divides the same bytes by its time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "dist/inproc_backend.h"
#include "dist/launcher.h"
#include "dist/mpi_backend.h"
#include "moe/ep_dispatcher.h"
#include "moe/wire_rows.h"

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
  std::string dtypes = "f32,bf16,fp8";
};

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One rank's iteration: seconds in each half and waiting for transfers, payload bytes sent.
struct StepTimes {
  double dispatch_s = 0, combine_s = 0, wait_s = 0;
  int64_t bytes = 0;
};

// Medians over iterations of the slowest rank's figures (each taken separately).
struct Timing {
  std::string name;
  double vs_f32 = 0;  // the same algorithm's time with the first dtype over this one's (0: none)
  double total_s = 0, dispatch_s = 0, combine_s = 0, wait_s = 0;
  double bytes = 0;  // payload bytes all ranks sent per iteration
};

// Runs `step` iters times after two warm-ups, every rank starting each iteration together.
Timing time_steps(DistContext& ctx, std::string name, int iters,
                  const std::function<StepTimes()>& step) {
  constexpr int kFigures = 4;  // total, dispatch, combine, wait
  std::vector<std::vector<double>> fig(kFigures);
  StepTimes st;
  for (int i = 0; i < iters + 2; ++i) {
    ctx.coord().barrier();
    st = step();
    const std::vector<int64_t> all = ctx.coord().all_gather(
        {static_cast<int64_t>((st.dispatch_s + st.combine_s) * 1e9),
         static_cast<int64_t>(st.dispatch_s * 1e9), static_cast<int64_t>(st.combine_s * 1e9),
         static_cast<int64_t>(st.wait_s * 1e9)});
    if (i < 2) continue;
    for (int f = 0; f < kFigures; ++f) {
      int64_t most = 0;
      for (int r = 0; r < ctx.world_size(); ++r) most = std::max(most, all[r * kFigures + f]);
      fig[f].push_back(static_cast<double>(most) * 1e-9);
    }
  }
  Timing t;
  t.name = std::move(name);
  t.total_s = median(fig[0]);
  t.dispatch_s = median(fig[1]);
  t.combine_s = median(fig[2]);
  t.wait_s = median(fig[3]);
  for (int64_t b : ctx.coord().all_gather({st.bytes})) t.bytes += static_cast<double>(b);
  return t;
}

void report(const std::vector<Timing>& rows, const Timing& raw) {
  std::printf("%-21s %9s %9s %9s %9s %9s %8s %7s %7s\n", "algorithm", "median ms", "dispatch",
              "combine", "waited", "MB/iter", "GB/s", "of raw", "vs 1st");
  for (const Timing& t : rows) {
    const double gbs = t.bytes / t.total_s / 1e9, raw_gbs = raw.bytes / raw.total_s / 1e9;
    std::printf("%-21s %9.3f %9.3f %9.3f %9.3f %9.2f %8.2f %6.0f%%", t.name.c_str(),
                t.total_s * 1e3, t.dispatch_s * 1e3, t.combine_s * 1e3, t.wait_s * 1e3,
                t.bytes / 1e6, gbs, 100 * gbs / raw_gbs);
    if (t.vs_f32 > 0) std::printf(" %6.2fx", t.vs_f32);
    std::printf("\n");
  }
}

void bench_rank(DistContext& ctx, const All2AllOptions& o) {
  const ExpertPlacement place = place_experts(o.experts, ctx.world_size());
  if (o.topk < 1 || o.topk > o.experts) DUET_ERROR("--topk must be in [1, --experts]");
  const int n = ctx.world_size();
  std::mt19937 rng(17 + ctx.rank());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(o.tokens * o.hidden)), w, out(x.size(), 0.0f);
  for (float& v : x) v = u(rng);
  std::vector<int32_t> ids;
  std::vector<int32_t> perm(static_cast<size_t>(o.experts));
  for (int64_t t = 0; t < o.tokens; ++t) {  // k distinct uniformly random experts per token
    for (int64_t e = 0; e < o.experts; ++e) perm[e] = static_cast<int32_t>(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t k = 0; k < o.topk; ++k) ids.push_back(perm[k]), w.push_back(1.0f / o.topk);
  }
  const RoutedTokens rt{x.data(), ids.data(), w.data(), o.tokens, o.hidden, o.topk, out.data()};
  std::vector<Timing> rows;
  std::vector<RowDtype> dtypes;
  std::stringstream list(o.dtypes);
  for (std::string d; std::getline(list, d, ',');) dtypes.push_back(parse_all2all_dtype(d));
  if (dtypes.empty()) DUET_ERROR("--dtypes: none given");
  for (All2AllBackend b : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
    const size_t first = rows.size();
    for (RowDtype dt : dtypes) {
      EpDispatcherOptions eo{b, o.tokens};
      eo.row_dtype = dt;
      EpDispatcher ep(ctx.comm(), place, eo);
      const std::string name = std::string(all2all_backend_name(b)) + " " + all2all_dtype_name(dt);
      rows.push_back(time_steps(ctx, name, o.iters, [&] {
        ep.plan_step(o.tokens);  // as the engines do before each step
        StepTimes st;
        const double wait0 = ep.wait_seconds();
        const Clock::time_point t0 = Clock::now();
        ep.dispatch_send(rt);
        ep.dispatch_recv();
        st.dispatch_s = since(t0);
        const Clock::time_point t1 = Clock::now();
        ep.combine_send();
        ep.combine_recv();  // adds the untouched output rows: out stays finite
        st.combine_s = since(t1);
        st.wait_s = ep.wait_seconds() - wait0;
        st.bytes = ep.last_dispatch_bytes() + ep.last_combine_bytes();
        return st;
      }));
      if (dtypes.size() > 1) rows.back().vs_f32 = rows[first].total_s / rows.back().total_s;
    }
  }
  const size_t raw_row = rows.size();
  // The transport alone: one all-to-all per iteration moving high_throughput's bytes, evenly;
  // then the same parts without the one to itself, which high_throughput keeps in place.
  const int64_t part = static_cast<int64_t>(rows[0].bytes) / n / n;
  std::vector<uint8_t> send(static_cast<size_t>(part * n)), recv(send.size());
  for (const bool self : {true, false}) {
    std::vector<int64_t> each(static_cast<size_t>(n), part);
    if (!self) each[ctx.rank()] = 0;
    rows.push_back(time_steps(ctx, self ? "raw_all_to_all" : "raw_cross_rank", o.iters, [&] {
      const Clock::time_point t0 = Clock::now();
      ctx.comm().all_to_all_v(send.data(), each, recv.data(), each);
      StepTimes st;
      st.dispatch_s = st.wait_s = since(t0);
      st.bytes = part * n;  // as payload, like the dispatcher's own share
      return st;
    }));
  }
  if (ctx.rank() != 0) return;
  std::printf("all2all: %d ranks (%s), %lld tokens/rank, hidden %lld, top-%lld of %lld experts\n",
              n, o.backend.c_str(), (long long)o.tokens, (long long)o.hidden, (long long)o.topk,
              (long long)o.experts);
  report(rows, rows[raw_row]);
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
  cmd->add_option("--dtypes", o->dtypes,
                  "Row types to time, each algorithm with each "
                  "(default f32,bf16,fp8; the first is the 'vs' baseline)");
  cmd->callback([o] { run_all2all(*o); });
}

}  // namespace duet
