// `duet bench latency`: prefill and decode speed of one batch, with decode's bytes read per step
// against the memory bandwidth measured in the same run, and prefill's GFLOP/s against the FMA
// peak measured in the same run.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "cli/dist_options.h"
#include "cli/kv_cache_option.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/kv_dtype.h"
#include "kernels/bandwidth.h"
#include "kernels/matmul.h"
#include "kernels/peak_flops.h"
#include "model/model.h"

namespace duet {

namespace {

struct LatencyOptions {
  std::string model_dir;
  int64_t batch = 1;
  int64_t prompt_len = 128;
  int64_t gen_len = 64;
  int threads = 0;
  uint64_t seed = 0;
  std::string kv_cache_dtype = "auto";
  KvCacheDtype kv_dtype = KvCacheDtype::kAuto;  // parsed from kv_cache_dtype
  bool profile_ops = false;
  std::string scheduler_modes;  // set: the serving engine under each mode (bench_schedule.cpp)
  std::string quantizations;    // set: the model under each quantization (bench_quantization.cpp)
  int rounds = 0;               // 0: 3 for --scheduler-modes and --quantizations, else 1
  bool bandwidth_each_step = false;  // --bandwidth-each-step
  DistOptions dist;
  SamplingParams sampling;  // --temperature, --top-p, --top-k
};

std::vector<GenerateRequest> make_requests(const LatencyOptions& o, int64_t n_vocab, int rank = 0) {
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(rank) * 7919);
  std::vector<GenerateRequest> reqs(static_cast<size_t>(o.batch));
  for (size_t k = 0; k < reqs.size(); ++k) {
    GenerateRequest& r = reqs[k];
    for (int64_t i = 0; i < o.prompt_len; ++i)
      r.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab)));
    r.max_tokens = o.gen_len;  // no stop ids: every sequence runs to gen_len
    r.sampling = bench_sampling(o.sampling, o.seed + static_cast<uint64_t>(rank) * 7919, k);
  }
  return reqs;
}

// The step gap: wall time from the end of one forward pass to the start of the next (sampling,
// stop checks, building the next input, the ranks' agreement), per gap and against a step.
void print_step_gap(const GenerateStats& st) {
  const double gap = st.step_gaps ? st.step_gap_seconds / st.step_gaps : 0.0;
  const double fwd = st.steps ? st.forward_seconds / st.steps : 0.0;
  std::printf("step gap: %.3f ms between forward passes (%.1f%% of a step; forward %.2f ms)\n",
              gap * 1e3, gap + fwd > 0 ? 100.0 * gap / (gap + fwd) : 0.0, fwd * 1e3);
}

// Decode time per kind of operation (summed over layers), per step and as a share of decode;
// the parts an operation times itself ("attn.qkv") indented under it.
void print_op_seconds(const GenerateStats& st, int64_t steps) {
  std::printf("decode time by operation (all layers; ms/step, share of decode):\n");
  for (const auto& [name, s] : st.decode_op_seconds) {
    const bool part = name.find('.') != std::string::npos;
    std::printf("  %s%-*s %8.2f  %5.1f %%\n", part ? "  " : "", part ? 14 : 16, name.c_str(),
                steps ? s / steps * 1e3 : 0.0,
                st.decode_seconds > 0 ? 100.0 * s / st.decode_seconds : 0.0);
  }
}

// Expert parallelism: every rank decodes its own batch of o.batch sequences (DP attention) and
// the experts are spread over the ranks. Rank 0 prints each rank's speed and the share of its
// decode step time spent waiting on communication.
void run_latency_ep(const LatencyOptions& o, DistContext& ctx) {
  ThreadPool pool(rank_threads(o.threads, o.dist, &ctx));
  split_rank_cores(o.dist, &ctx, pool);
  RankModel rm = load_rank_model(o.model_dir, o.dist, &ctx);
  const ModelConfig& c = rm.model->config();
  Generator gen(*rm.model, pool, o.kv_dtype, rm.group);
  const std::vector<GenerateRequest> reqs = make_requests(o, c.n_vocab, ctx.rank());
  gen.generate(reqs);  // warm-up
  gen.profile_ops(o.profile_ops);
  GenerateStats st;
  gen.generate(reqs, &st);
  const auto micro = [](double v) { return static_cast<int64_t>(v * 1e6); };
  const std::vector<int64_t> all = ctx.coord().all_gather(
      {st.prompt_tokens, micro(st.prefill_seconds), st.decode_steps, micro(st.decode_seconds),
       micro(st.decode_comm_seconds), pool.n_threads()});
  finish_trace(rm, o.dist, &ctx);
  if (ctx.rank() != 0) return;
  std::printf(
      "model %s (%s), expert parallel over %d ranks (%s, %s), per rank: batch %lld, "
      "prompt %lld, gen %lld, matmul %s, KV cache %s\n",
      o.model_dir.c_str(), arch_name(c.arch), ctx.world_size(), o.dist.backend.c_str(),
      o.dist.all2all.c_str(), (long long)o.batch, (long long)o.prompt_len, (long long)o.gen_len,
      matmul_isa(), kv_dtype_name(resolve_kv_dtype(o.kv_dtype, *rm.model)));
  double total_tps = 0;
  for (int r = 0; r < ctx.world_size(); ++r) {
    const int64_t* v = &all[static_cast<size_t>(r) * 6];
    const double prefill_s = v[1] / 1e6, decode_s = v[3] / 1e6, comm_s = v[4] / 1e6;
    const double tps = decode_s > 0 ? double(v[2]) * o.batch / decode_s : 0.0;
    total_tps += tps;
    std::printf(
        "rank %d: %lld threads, prefill %8.1f tok/s, decode %8.1f tok/s (%.2f ms/step), "
        "communication wait %.1f%% of decode time\n",
        r, (long long)v[5], prefill_s > 0 ? v[0] / prefill_s : 0.0, tps,
        v[2] ? decode_s / v[2] * 1e3 : 0.0, decode_s > 0 ? 100.0 * comm_s / decode_s : 0.0);
  }
  std::printf("decode: %.1f tok/s over all ranks, %.1f tok/s per rank\n", total_tps,
              total_tps / ctx.world_size());
  std::printf("rank 0, ");
  print_step_gap(st);
  if (o.profile_ops) {
    std::printf("rank 0, ");  // the receive halves' times include waiting for the other ranks
    print_op_seconds(st, st.decode_steps);
  }
}

void run_latency_single(const LatencyOptions& o) {
  ThreadPool pool(o.threads > 0 ? o.threads : available_cores());
  RankModel rm = load_rank_model(o.model_dir, o.dist, nullptr);
  const std::unique_ptr<Model>& model = rm.model;
  const ModelConfig& c = model->config();
  Generator gen(*model, pool, o.kv_dtype, rm.group);
  const std::vector<GenerateRequest> reqs = make_requests(o, c.n_vocab);

  // Rounds of the batch, each between two measurements of the read bandwidth and the FMA peak.
  // The limits printed first are the best measurement of the run (a neighbour's burst on a
  // shared machine makes one read low); each round's decode is also set against the mean of the
  // two bandwidth measurements around it, since this machine's bandwidth drifts by up to half
  // from minute to minute and only a limit measured beside the decode compares with it.
  const int rounds = o.rounds > 0 ? o.rounds : 1;
  std::vector<double> bws{measure_read_bandwidth(pool)};
  double peak = measure_peak_flops(pool);
  // Weights and KV rows a decode step of `r` read, on average.
  const auto bytes_per_step_of = [&](const GenerateStats& r) {
    return r.decode_steps > 0
               ? model->dense_bytes_per_step() +
                     double(r.decode_expert_bytes + r.decode_kv_bytes) / r.decode_steps
               : 0.0;
  };
  GenerateStats warm_up;
  gen.generate(reqs, &warm_up);  // pages of the mapped weights, buffers
  gen.profile_ops(o.profile_ops);
  // --bandwidth-each-step: after every decode step, a timed read of as many bytes as the
  // warm-up's steps read on average, or twice the last-level cache where that is more, so that
  // the next step finds none of its weights there; a round's limit is those reads' bandwidth,
  // taken in the same milliseconds as its steps.
  const size_t llc_bytes = last_level_cache_bytes();
  std::optional<StepReads> step_reads;
  const size_t warm_step_bytes = static_cast<size_t>(bytes_per_step_of(warm_up));
  if (o.bandwidth_each_step) step_reads.emplace(pool, std::max(warm_step_bytes, 2 * llc_bytes));
  std::vector<double> step_read_bws;  // per round
  std::vector<GenerateStats> runs(static_cast<size_t>(rounds));
  for (GenerateStats& run : runs) {
    if (step_reads) {
      step_reads->reset();
      gen.after_decode_step([&] { step_reads->read(); });
    }
    gen.generate(reqs, &run);
    if (step_reads) {
      gen.after_decode_step(nullptr);
      step_read_bws.push_back(
          step_reads->seconds() > 0 ? step_reads->bytes() / step_reads->seconds() : 0.0);
    }
    bws.push_back(measure_read_bandwidth(pool));
    peak = std::max(peak, measure_peak_flops(pool));
  }
  const double bw = *std::max_element(bws.begin(), bws.end());
  // The figures below are those of the round with the median decode time.
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return runs[a].decode_seconds < runs[b].decode_seconds; });
  const GenerateStats& st = runs[order[order.size() / 2]];

  // Prefill: FLOPs of the matmuls (2 per weight per token) plus attention scores and sums. The
  // output projection runs for the last token of each prompt only.
  int64_t n_moe = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) n_moe += c.is_moe_layer(il);
  const double elem = model->bytes_per_expert() > 0
                          ? double(model->bytes_per_expert()) / (3.0 * c.n_embd * c.n_ff_exp)
                          : 2.0;
  const double active_params = (model->dense_bytes_per_step() +
                                double(n_moe * c.n_expert_used) * model->bytes_per_expert()) /
                               elem;
  const double output_params = double(c.n_vocab) * c.n_embd;
  const double v_dim = is_deepseek(c.arch) ? c.v_head_dim : c.head_dim;
  const double attn_flops_per_token =
      2.0 * c.n_layer * c.n_head * (c.qk_head_dim() + v_dim) * (o.prompt_len + 1) / 2.0;
  const double prefill_flops =
      st.prompt_tokens * (2.0 * (active_params - output_params) + attn_flops_per_token) +
      double(o.batch) * 2.0 * output_params;
  const double prefill_tps = st.prompt_tokens / st.prefill_seconds;
  const double prefill_gflops = prefill_flops / st.prefill_seconds / 1e9;
  const double peak_gflops = peak / 1e9;

  // Decode: every step reads the dense weights, the experts routed to, and the KV rows.
  const int64_t steps = st.decode_steps;
  const double decode_tokens = double(steps) * o.batch;
  const double bytes_per_step = bytes_per_step_of(st);
  const double step_s = steps > 0 ? st.decode_seconds / steps : 0.0;
  const double achieved = steps > 0 ? bytes_per_step / step_s : 0.0;
  const double limit_tps = bytes_per_step > 0 ? bw / bytes_per_step * o.batch : 0.0;

  std::printf(
      "model %s (%s), batch %lld, prompt %lld, gen %lld, %d threads, matmul %s, KV cache %s\n",
      o.model_dir.c_str(), arch_name(c.arch), (long long)o.batch, (long long)o.prompt_len,
      (long long)o.gen_len, pool.n_threads(), matmul_isa(), kv_dtype_name(gen.kv_cache().dtype()));
  std::printf(
      "weights: one-token products prefetch %lld bytes ahead into L1 (DUET_ONE_TOKEN_PREFETCH) "
      "and %lld into L2 (DUET_ONE_TOKEN_PREFETCH_L2)\n",
      (long long)matmul_one_token_prefetch(), (long long)matmul_one_token_prefetch_l2());
  if (std::strcmp(matmul_bf16_isa(), matmul_isa()) != 0) {
    std::printf(
        "kernels: bf16 weights and attention on %s (f32 FMAs, faster than %s's bf16 pairs "
        "on this CPU; DUET_MATMUL_ISA=%s puts them on the pairs)\n",
        matmul_bf16_isa(), matmul_isa(), matmul_isa());
  }
  if (model->quantization().quantization != Quantization::kNone) {
    std::printf("weights: quantization %s, kernel %s\n", describe(model->quantization()).c_str(),
                matmul_int_kernel());
  }
  if (const std::string s = describe_stored_int4(model->quantization()); !s.empty())
    std::printf("weights: %s\n", s.c_str());
  if (model->panel_bytes() > 0) {
    std::printf(
        "weights: attention, dense MLP and output matrices also as panels (%.1f MB packed "
        "at load; --no-repack reads them as stored)\n",
        double(model->panel_bytes()) / 1e6);
  } else if (model->quantization().quantization == Quantization::kNone) {
    std::printf("weights: as stored\n");  // (quantized: the line above says what they are)
  }
  std::printf("weights: %s\n", o.dist.mmap ? "read in the files' mapping (--mmap)"
                                           : "copied into huge pages at load (--mmap: read in "
                                             "the files' mapping)");
  std::printf("prefill: %8.1f tok/s  %7.1f GFLOP/s  (%.3f s for %lld tokens)\n", prefill_tps,
              prefill_gflops, st.prefill_seconds, (long long)st.prompt_tokens);
  std::printf("prefill measured FMA peak %.1f GFLOP/s; ratio %.2f\n", peak_gflops,
              peak_gflops > 0 ? prefill_gflops / peak_gflops : 0.0);
  std::printf("decode:  %8.1f tok/s  (%.2f ms/step, %lld steps x %lld seqs)\n",
              decode_tokens / st.decode_seconds, step_s * 1e3, (long long)steps,
              (long long)o.batch);
  std::printf("decode bytes/step: %.1f MB (dense %.1f, experts %.1f, KV %.1f)\n",
              bytes_per_step / 1e6, model->dense_bytes_per_step() / 1e6,
              steps ? double(st.decode_expert_bytes) / steps / 1e6 : 0.0,
              steps ? double(st.decode_kv_bytes) / steps / 1e6 : 0.0);
  std::printf("decode achieved %.1f GB/s; measured read bandwidth %.1f GB/s; ratio %.2f\n",
              achieved / 1e9, bw / 1e9, achieved / bw);
  std::printf("decode bandwidth limit %.1f tok/s; achieved/limit %.2f\n", limit_tps,
              limit_tps > 0 ? decode_tokens / st.decode_seconds / limit_tps : 0.0);
  if (llc_bytes > 0 && 4 * static_cast<double>(llc_bytes) >= bytes_per_step) {
    std::printf(
        "decode: the last-level cache (%.0f MB) can hold %.0f %% of a step's %.1f MB from one step "
        "to the next, so decode may read above the limit (--bandwidth-each-step empties it "
        "between steps)\n",
        static_cast<double>(llc_bytes) / 1e6,
        std::min(100.0, 100.0 * static_cast<double>(llc_bytes) / bytes_per_step),
        bytes_per_step / 1e6);
  }
  // Each round's decode (bytes per step over seconds per step) against limit(i) GB/s.
  const auto print_round_ratios = [&](const auto& limit) {
    std::vector<double> ratios, limits;
    for (size_t i = 0; i < runs.size(); ++i) {
      const GenerateStats& r = runs[i];
      limits.push_back(limit(i));
      ratios.push_back(bytes_per_step_of(r) / (r.decode_seconds / r.decode_steps) / limits.back());
      std::printf(" %.2f", ratios.back());
    }
    std::sort(ratios.begin(), ratios.end());
    std::printf(" (median %.2f; bandwidth %.1f-%.1f GB/s)\n", ratios[ratios.size() / 2],
                *std::min_element(limits.begin(), limits.end()) / 1e9,
                *std::max_element(limits.begin(), limits.end()) / 1e9);
  };
  if (rounds > 1 && steps > 0) {
    std::printf(
        "decode achieved/limit per round, against the bandwidth measured before and after it:");
    print_round_ratios([&](size_t i) { return (bws[i] + bws[i + 1]) / 2; });
  }
  if (step_reads && steps > 0) {
    std::printf(
        "decode achieved/limit per round, each step followed by a read of %.1f MB from memory "
        "(the limit: those reads' bandwidth; the steps start with cold caches%s):",
        step_reads->bytes_per_read() / 1e6,
        2 * llc_bytes > warm_step_bytes ? ", the read twice the last-level cache" : "");
    print_round_ratios([&](size_t i) { return step_read_bws[i]; });
  }
  if (!step_reads) print_step_gap(st);  // (steps separated by reads have no gap to measure)
  if (o.profile_ops) print_op_seconds(st, steps);
  finish_trace(rm, o.dist, nullptr);
}

// The batch of `o` under each of `settings`.
AlternatingBenchOptions alternating(const LatencyOptions& o, const std::string& settings) {
  AlternatingBenchOptions a;
  a.model_dir = o.model_dir;
  a.settings = settings;
  a.batch = o.batch;
  a.prompt_len = o.prompt_len;
  a.gen_len = o.gen_len;
  a.threads = o.threads;
  a.seed = o.seed;
  a.rounds = o.rounds > 0 ? o.rounds : 3;
  a.kv_dtype = o.kv_dtype;
  a.sampling = o.sampling;
  return a;
}

void run_latency(const LatencyOptions& o) {
  if (o.bandwidth_each_step &&
      (!o.quantizations.empty() || !o.scheduler_modes.empty() || o.dist.data_parallel_size > 1))
    DUET_ERROR(
        "--bandwidth-each-step times one rank's generator alone: leave out "
        "--quantizations, --scheduler-modes and --data-parallel-size");
  if (!o.quantizations.empty()) {
    if (o.dist.data_parallel_size > 1 || !o.scheduler_modes.empty())
      DUET_ERROR("--quantizations runs one rank's generator, without --scheduler-modes");
    run_quantization_bench(alternating(o, o.quantizations));
    return;
  }
  if (!o.scheduler_modes.empty()) {
    run_schedule_bench(alternating(o, o.scheduler_modes), o.dist);
    return;
  }
  launch_ranks(o.dist, o.model_dir, [&](DistContext* ctx) {
    if (ctx)
      run_latency_ep(o, *ctx);
    else
      run_latency_single(o);
  });
}

}  // namespace

void add_bench_latency(CLI::App& bench) {
  auto o = std::make_shared<LatencyOptions>();
  CLI::App* cmd = bench.add_subcommand("latency", "Prefill and decode speed of one batch");
  cmd->add_option("model_dir", o->model_dir, "Hugging Face model directory")->required();
  cmd->add_option("--batch", o->batch, "Sequences decoded together")->check(CLI::PositiveNumber);
  cmd->add_option("--prompt-len", o->prompt_len, "Prompt tokens per sequence")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gen-len", o->gen_len, "Generated tokens per sequence")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o->threads, "Compute threads (default: available cores)");
  cmd->add_option("--seed", o->seed, "Seed of the random prompts");
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_bench_sampling_options(cmd, o->sampling);
  cmd->add_flag("--profile-ops", o->profile_ops,
                "Also print decode time per kind of operation (attn, moe_route, experts, output, "
                "...), summed over layers (rank 0's with several ranks)");
  cmd->add_option("--scheduler-modes", o->scheduler_modes,
                  "Run the batch through the serving engine under each scheduler mode in turn "
                  "(plain, overlap, multistepN, overlap+multistepN; comma-separated) and "
                  "compare decode tok/s and the step gap");
  cmd->add_option("--quantizations", o->quantizations,
                  "Load the model once per --quantization (comma-separated, e.g. "
                  "none,int8,int4; +mmap after one, e.g. none+mmap, reads its unquantized "
                  "matrices as --mmap does) and compare prefill and decode tok/s, alternating "
                  "over --rounds");
  cmd->add_option("--rounds", o->rounds,
                  "Rounds of --scheduler-modes or --quantizations (default 3), or of the "
                  "batch alone (default 1), each round's decode then also set against the "
                  "bandwidth measured just before and after it")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--bandwidth-each-step", o->bandwidth_each_step,
                "After each decode step, read about as many bytes as the step from memory with "
                "the same threads, timed, and set each round's decode against those reads' "
                "bandwidth: a limit measured in the same milliseconds as the steps, on a "
                "machine whose bandwidth drifts (the steps start with cold caches, as a model "
                "larger than the caches runs; one rank, without --quantizations or "
                "--scheduler-modes)");
  add_dist_options(cmd, o->dist);
  cmd->callback([o] {
    o->kv_dtype = parse_kv_cache_dtype(o->kv_cache_dtype);
    run_latency(*o);
  });
}

}  // namespace duet
