// `duet bench latency --scheduler-modes ...`: one batch of requests through the serving engine
// (LlmEngine, on one rank or a data-parallel group) under each scheduler mode in turn, alternating
// over rounds in one run: plain (each step after the previous one's outputs are processed), the
// overlapped scheduler, multi-step decoding, or both. Prints per mode the decode tok/s, the step
// gap (end of one forward pass to the start of the next) against the forward pass, and the ratio to
// the first mode, medians over the rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "cli/dist_options.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/llm_engine.h"
#include "kernels/matmul.h"
#include "model/model.h"

namespace duet {

namespace {

struct SchedulerMode {
  std::string name;
  bool overlap = false;
  int64_t steps = 1;
};

// "plain", "overlap", "multistepN", "overlap+multistepN".
SchedulerMode parse_mode(const std::string& s) {
  SchedulerMode m;
  m.name = s;
  std::string rest = s;
  if (rest == "plain") return m;
  if (rest.rfind("overlap", 0) == 0) {
    m.overlap = true;
    rest = rest.substr(7);
    if (rest.empty()) return m;
    if (rest[0] != '+') DUET_ERROR("unknown scheduler mode '" << s << "'");
    rest = rest.substr(1);
  }
  const std::string ms = "multistep";
  if (rest.rfind(ms, 0) == 0 && rest.size() > ms.size()) {
    try {
      m.steps = std::stoll(rest.substr(ms.size()));
    } catch (const std::exception&) {
      DUET_ERROR("unknown scheduler mode '" << s << "'");
    }
    if (m.steps >= 1 && m.steps <= 64) return m;
  }
  DUET_ERROR("unknown scheduler mode '" << s
                                        << "' (plain, overlap, multistepN, overlap+multistepN)");
}

struct ModeRun {
  double decode_tps = 0;
  double gap_ms = 0;      // mean step gap
  double forward_ms = 0;  // mean forward pass
};

// Plenty for a benchmark's batch; the pool's pages are touched only when used.
constexpr double kKvCacheGib = 1.0;

// One batch through an engine in mode m: every request's prompt, then gen_len tokens each.
// Decode is timed from the first token read of the first request to the last token.
// On several ranks rank 0 submits and reads every request (its engine hands them out, the least
// loaded rank first, so each rank decodes o.batch) and the other ranks' engines take part until
// rank 0's stops; they return an empty ModeRun.
ModeRun run_mode(const RankModel& rm, ThreadPool& pool, const AlternatingBenchOptions& o,
                 const SchedulerMode& m, const std::vector<EngineRequest>& reqs) {
  EngineConfig c;
  c.scheduler.max_num_seqs = std::max<int64_t>(o.batch, 1);
  c.scheduler.max_num_batched_tokens = std::max<int64_t>(o.batch * o.prompt_len, o.batch);
  c.kv_cache_gib = kKvCacheGib;
  c.kv_cache_dtype = o.kv_dtype;
  c.overlap_schedule = m.overlap;
  c.num_scheduler_steps = m.steps;
  LlmEngine engine(*rm.model, pool, nullptr, c, rm.group);
  if (rm.group.coord && !rm.group.coord->is_master()) {
    const std::string error = engine.wait_stopped();
    if (!error.empty()) DUET_ERROR(error);
    return {};
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : reqs) streams.push_back(engine.submit(r));
  using Clock = std::chrono::steady_clock;
  // Every prompt is prefilled in the first step (the budget holds them all), so the first token
  // read of the first request marks the start of decode for all; its delta may carry several
  // tokens (this thread woke late), and the batch decodes in step, so decode is the tokens after
  // that many per request. The waits block: no core spins.
  auto take = [](RequestStream& s, bool until_finished, size_t* n_tokens) {
    for (;;) {
      const StreamDelta d = s.wait(std::chrono::milliseconds(1000));
      if (d.finished && !d.error.empty()) DUET_ERROR("request failed: " << d.error);
      if (n_tokens) *n_tokens += d.tokens.size();
      if (d.finished || (!until_finished && !d.tokens.empty())) return d.finished;
    }
  };
  size_t n_first = 0;
  const bool first_done = take(*streams.front(), false, &n_first);
  const Clock::time_point decode_start = Clock::now();
  // The step figures of decode only: the prefill's forward pass is behind this point.
  const EngineMetricsSnapshot s0 = engine.metrics().snapshot();
  if (!first_done) take(*streams.front(), true, nullptr);
  for (size_t i = 1; i < streams.size(); ++i) take(*streams[i], true, nullptr);
  const double decode_s = std::chrono::duration<double>(Clock::now() - decode_start).count();
  const int64_t decoded = o.gen_len - static_cast<int64_t>(n_first);
  if (decoded < o.gen_len / 2) {
    std::fprintf(stderr,
                 "note: mode %s: %zu of the first request's %lld tokens arrived at once; decode "
                 "is timed over the rest only (raise --gen-len)\n",
                 m.name.c_str(), n_first, static_cast<long long>(o.gen_len));
  }
  const EngineMetricsSnapshot s = engine.metrics().snapshot();
  ModeRun r;
  r.decode_tps = decode_s > 0 ? double(reqs.size()) * double(decoded) / decode_s : 0.0;
  const double gaps = double(s.step_gaps - s0.step_gaps);
  const double steps = double(s.forward_steps - s0.forward_steps);
  r.gap_ms = gaps > 0 ? (s.step_gap_seconds - s0.step_gap_seconds) / gaps * 1e3 : 0.0;
  r.forward_ms = steps > 0 ? (s.forward_seconds - s0.forward_seconds) / steps * 1e3 : 0.0;
  return r;
}

}  // namespace

namespace {

// One rank's part: every mode in turn, `rounds` times, after a warm-up run; rank 0 prints.
void schedule_rank(const AlternatingBenchOptions& o, const DistOptions& dist,
                   const std::vector<SchedulerMode>& modes, DistContext* ctx) {
  ThreadPool pool(rank_threads(o.threads, dist, ctx));
  split_rank_cores(dist, ctx, pool);
  RankModel rm = load_rank_model(o.model_dir, dist, ctx);
  const ModelConfig& c = rm.model->config();
  const int world = ctx ? ctx->world_size() : 1;
  const bool master = !ctx || ctx->rank() == 0;
  // o.batch per rank, all submitted on rank 0.
  std::mt19937_64 rng(o.seed);
  std::vector<EngineRequest> reqs(master ? static_cast<size_t>(o.batch * world) : 0);
  for (size_t k = 0; k < reqs.size(); ++k) {
    EngineRequest& r = reqs[k];
    for (int64_t i = 0; i < o.prompt_len; ++i)
      r.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(c.n_vocab)));
    r.max_tokens = o.gen_len;
    r.ignore_eos = true;
    r.sampling = bench_sampling(o.sampling, o.seed, k);
  }
  if (master) {
    const std::string ranks =
        world > 1 ? ", " + std::to_string(world) + " ranks (batch per rank, tok/s of all)" : "";
    std::printf(
        "model %s (%s), batch %lld, prompt %lld, gen %lld, %d threads, matmul %s%s; serving "
        "engine, %d rounds of the modes in turn (medians)\n",
        o.model_dir.c_str(), arch_name(c.arch), (long long)o.batch, (long long)o.prompt_len,
        (long long)o.gen_len, pool.n_threads(), matmul_isa(), ranks.c_str(), o.rounds);
    std::fflush(stdout);
  }
  run_mode(rm, pool, o, modes.front(), reqs);  // warm-up: pages of the weights, buffers
  std::vector<std::vector<ModeRun>> runs(modes.size());
  for (int round = 0; round < o.rounds; ++round)
    for (size_t m = 0; m < modes.size(); ++m)
      runs[m].push_back(run_mode(rm, pool, o, modes[m], reqs));
  if (!master) return;
  std::printf("%-22s %12s %10s %12s %12s %10s\n", "scheduler", "decode tok/s", "vs first",
              "step gap ms", "forward ms", "gap/step");
  double first = 0;
  for (size_t m = 0; m < modes.size(); ++m) {
    std::vector<double> tps, gap, fwd;
    for (const ModeRun& r : runs[m]) {
      tps.push_back(r.decode_tps);
      gap.push_back(r.gap_ms);
      fwd.push_back(r.forward_ms);
    }
    const double t = median(tps), g = median(gap), f = median(fwd);
    if (m == 0) first = t;
    std::printf("%-22s %12.1f %10.2f %12.4f %12.4f %9.1f%%\n", modes[m].name.c_str(), t,
                first > 0 ? t / first : 0.0, g, f, g + f > 0 ? 100.0 * g / (g + f) : 0.0);
  }
}

}  // namespace

void run_schedule_bench(const AlternatingBenchOptions& o, const DistOptions& dist) {
  std::vector<SchedulerMode> modes;
  {
    std::stringstream ss(o.settings);
    std::string item;
    while (std::getline(ss, item, ',')) modes.push_back(parse_mode(item));
  }
  if (modes.empty()) DUET_ERROR("--scheduler-modes lists no mode");
  if (o.gen_len < 2) DUET_ERROR("--scheduler-modes needs --gen-len of 2 or more");
  launch_ranks(dist, o.model_dir, [&](DistContext* ctx) { schedule_rank(o, dist, modes, ctx); });
}

}  // namespace duet
