// `duet bench overlap`: one workload under several overlap modes (--modes: off, TBO, DBO, SBO, and
// combinations with bf16 rows), alternating mode by mode in each round of one run (every rank of an expert-parallel group), so their ratios are taken side
// by side. For each mode and round it prints, from rank 0's side: the run's time (prefill +
// decode steps), the time spent waiting for communication (the steps' agreement and the
// transfers not hidden), the compute time (the rest), the transfers' time on the communication
// thread (post to completion), the share of it hidden behind computation, that thread's CPU
// seconds, and the ratio of the run's time to overlap off in the same round.
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/dist_options.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"

namespace duet {

namespace {

struct OverlapBenchOptions {
  std::string model_dir;
  int64_t batch = 64;
  int64_t prompt_len = 16;
  int64_t gen_len = 16;
  int rounds = 2;
  int threads = 0;
  std::string modes = "off,tbo,dbo,sbo";
  DistOptions dist;
};

// One mode of the comparison: "off", "tbo" or "dbo" (default off), with "+sbo" (the SBO flags as
// given, or SBO's defaults), "+bf16" (bf16 rows), "+auto" or "+thresholds" (--dbo-split for
// this mode), and "+serial" (the shared experts before the dispatch, beside no transfer), e.g.
// "tbo+sbo+bf16", "sbo", "bf16", "dbo+thresholds", "serial" (nothing overlaps at all).
struct BenchMode {
  std::string name;
  DistOptions dist;  // the run's flags with this mode's overlap settings
};

std::vector<BenchMode> parse_modes(const OverlapBenchOptions& o) {
  std::vector<BenchMode> modes;
  std::stringstream list(o.modes);
  std::string name;
  while (std::getline(list, name, ',')) {
    BenchMode m{name, o.dist};
    std::stringstream parts(name);
    std::string part;
    int overlaps = 0;
    bool serial = false;
    std::string own = "auto";  // +own / +own2 / +noown: --sbo-own-experts-last combine / both / off
    while (std::getline(parts, part, '+')) {
      if (part == "off" || part == "tbo" || part == "dbo") {
        ++overlaps;
        m.dist.enable_two_batch_overlap = part == "tbo";
        m.dist.enable_dbo = part == "dbo";
      } else if (part == "sbo") {
        m.dist.enable_single_batch_overlap = true;
      } else if (part.size() > 3 && part.size() <= 6 && part.compare(0, 3, "sbo") == 0 &&
                 part.find_first_not_of("0123456789", 3) == std::string::npos) {
        m.dist.enable_single_batch_overlap = true;  // sboN: N chunks, whatever the step's size
        m.dist.sbo_combine_chunks = std::stoi(part.substr(3));
      } else if (part == "bf16" || part == "fp8") {
        m.dist.all2all_dtype = part;
      } else if (const size_t slash = part.find('/'); slash != std::string::npos) {
        m.dist.all2all_dtype = part.substr(0, slash);  // e.g. fp8/bf16: dispatch/combine
        m.dist.all2all_combine_dtype = part.substr(slash + 1);
        parse_all2all_dtype(m.dist.all2all_dtype);
        parse_all2all_dtype(m.dist.all2all_combine_dtype);
      } else if (part == "auto" || part == "thresholds") {
        m.dist.dbo_split = part;
      } else if (part == "serial") {
        serial = true;
      } else if (part == "own" || part == "own2" || part == "noown") {
        own = part == "own" ? "combine" : part == "own2" ? "both" : "off";
      } else {
        overlaps = 2;
      }
    }
    if (overlaps > 1) {
      DUET_ERROR("--modes: '" << name << "' is not off, tbo or dbo (default off) with +sbo (or "
                              << "+sboN: N chunks), +bf16, +fp8 or +D/C (e.g. +fp8/bf16), "
                              << "+auto or +thresholds, +own, +own2 or +noown, and/or +serial");
    }
    if (!m.dist.enable_single_batch_overlap) {  // the SBO flags apply to +sbo modes only
      m.dist.sbo_combine_chunks = 0;
      m.dist.sbo_shared_experts = "auto";
      m.dist.sbo_own_experts_last = "auto";
    }
    if (serial) m.dist.sbo_shared_experts = "serial";
    if (own != "auto") m.dist.sbo_own_experts_last = own;
    modes.push_back(std::move(m));
  }
  if (modes.empty()) DUET_ERROR("--modes: no mode given");
  return modes;
}

std::vector<GenerateRequest> requests(const OverlapBenchOptions& o, int64_t n_vocab, int rank) {
  std::mt19937_64 rng(1234 + static_cast<uint64_t>(rank) * 7919);
  std::vector<GenerateRequest> reqs(static_cast<size_t>(o.batch));
  for (GenerateRequest& r : reqs) {
    for (int64_t i = 0; i < o.prompt_len; ++i)
      r.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab)));
    r.max_tokens = o.gen_len;
  }
  return reqs;
}

void run_overlap_rank(const OverlapBenchOptions& o, DistContext* ctx) {
  if (!ctx) DUET_ERROR("bench overlap needs several ranks: --data-parallel-size N (N > 1)");
  ThreadPool pool(rank_threads(o.threads, o.dist, ctx));
  split_rank_cores(o.dist, ctx, pool);
  RankModel rm = load_rank_model(o.model_dir, o.dist, ctx);
  const std::vector<GenerateRequest> reqs = requests(o, rm.model->config().n_vocab, ctx->rank());
  const std::vector<BenchMode> modes = parse_modes(o);
  std::vector<std::unique_ptr<Generator>> gens;
  for (const BenchMode& mode : modes) {
    StepGroup g = rank_step_group(mode.dist, ctx, rm.placement);
    g.trace = rm.group.trace;
    gens.push_back(std::make_unique<Generator>(*rm.model, pool, KvCacheDtype::kAuto, g));
    gens.back()->generate(reqs);  // warm-up
  }
  if (ctx->rank() == 0) {
    std::printf("bench overlap: %s, %d ranks (%s, %s), per rank: batch %lld, prompt %lld, gen "
                "%lld; thresholds decode %lld prefill %lld\n",
                o.model_dir.c_str(), ctx->world_size(), o.dist.backend.c_str(),
                o.dist.all2all.c_str(), (long long)o.batch, (long long)o.prompt_len,
                (long long)o.gen_len, (long long)o.dist.dbo_decode_token_threshold,
                (long long)o.dist.dbo_prefill_token_threshold);
    std::printf("%-5s %-12s %9s %9s %9s %9s %9s %8s %8s %7s %8s\n", "round", "mode", "run ms",
                "compute", "comm wait", "transfers", "hidden", "comm cpu", "split", "tok/s",
                "vs 1st");
  }
  for (int round = 1; round <= o.rounds; ++round) {
    double off_seconds = 0;
    for (size_t m = 0; m < gens.size(); ++m) {
      const CommThread::Usage u0 = ctx->comm().usage();
      GenerateStats st;
      gens[m]->generate(reqs, &st);
      const CommThread::Usage u1 = ctx->comm().usage();
      const double run = st.prefill_seconds + st.decode_seconds;
      const double wait = st.prefill_comm_seconds + st.decode_comm_seconds;
      const double transfers = u1.busy_seconds - u0.busy_seconds;
      const double transfer_wait = std::max(0.0, wait - st.sync_seconds);
      if (m == 0) off_seconds = run;
      if (ctx->rank() != 0) continue;
      const double tokens = double(st.prompt_tokens + st.generated_tokens);
      std::printf("%-5d %-12s %9.1f %9.1f %9.1f %9.1f %8.0f%% %8.3f %4lld/%-3lld %7.1f %8.2f\n",
                  round, modes[m].name.c_str(), run * 1e3, (run - wait) * 1e3, wait * 1e3,
                  transfers * 1e3,
                  transfers > 0 ? 100.0 * std::max(0.0, 1.0 - transfer_wait / transfers) : 0.0,
                  u1.cpu_seconds - u0.cpu_seconds, (long long)st.micro_batch_steps,
                  (long long)st.steps, tokens / run, off_seconds / run);
    }
  }
  // What --dbo-split auto learnt, per mode that used it (rank 0's table; every rank's is the same).
  for (size_t m = 0; m < gens.size() && ctx->rank() == 0; ++m) {
    const std::string t = gens[m]->split_times();
    if (!t.empty())
      std::printf("%s, step time per token by kind of step:\n%s", modes[m].name.c_str(), t.c_str());
  }
  finish_trace(rm, o.dist, ctx);
}

}  // namespace

void add_bench_overlap(CLI::App& bench) {
  auto o = std::make_shared<OverlapBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "overlap", "Overlap modes (off, TBO, DBO, SBO, bf16 rows) on one workload, alternating in "
                 "each round");
  cmd->add_option("model_dir", o->model_dir, "Hugging Face model directory")->required();
  cmd->add_option("--batch", o->batch, "Sequences per rank")->check(CLI::PositiveNumber);
  cmd->add_option("--prompt-len", o->prompt_len, "Prompt tokens per sequence")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gen-len", o->gen_len, "Generated tokens per sequence")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rounds", o->rounds, "Rounds of the modes (default 2)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
      "--modes", o->modes,
      "Comma-separated modes, the first the baseline of 'vs': off | tbo | dbo, each optionally "
      "+sbo (+sboN: N chunks, forced), +bf16, +fp8 or +D/C (dispatch/combine rows, e.g. "
      "+fp8/bf16), +auto or +thresholds (--dbo-split), +own, +own2 or +noown "
      "(--sbo-own-experts-last combine / both / off) and +serial (the shared experts before the "
      "dispatch: 'serial' overlaps nothing) (default off,tbo,dbo,sbo)");
  cmd->add_option("--threads", o->threads, "Compute threads per rank");
  add_dist_options(cmd, o->dist);
  cmd->callback([o] {
    if (o->dist.enable_two_batch_overlap || o->dist.enable_dbo ||
        o->dist.enable_single_batch_overlap || o->dist.all2all_dtype != "f32" ||
        !o->dist.all2all_combine_dtype.empty())
      DUET_ERROR(
          "bench overlap runs every mode itself (--modes): leave out "
          "--enable-two-batch-overlap, --enable-dbo, --enable-single-batch-overlap and "
          "--all2all-dtype / --all2all-combine-dtype");
    parse_modes(*o);  // a bad --modes fails before any rank starts
    launch_ranks(o->dist, o->model_dir, [&](DistContext* ctx) { run_overlap_rank(*o, ctx); });
  });
}

}  // namespace duet
