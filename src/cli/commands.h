// The `duet` subcommands. Each registers its options on the app and runs when selected; errors
// surface as duet::Error and are printed by main.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv_dtype.h"
#include "engine/sampler.h"

namespace duet {

// The median of a bench's rounds (the upper middle of an even count; 0 for none).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One batch of `duet bench latency` run under each of several settings, alternating.
struct AlternatingBenchOptions {
  std::string model_dir;
  std::string settings;  // the comma-separated list
  int64_t batch = 1;
  int64_t prompt_len = 128;
  int64_t gen_len = 64;
  int threads = 0;
  uint64_t seed = 0;
  int rounds = 3;
  KvCacheDtype kv_dtype = KvCacheDtype::kAuto;  // --kv-cache-dtype
  SamplingParams sampling;                      // of every request (bench_sampling)
};

// The benchmarks' sampling options (--temperature, --top-p, --top-k): greedy unless given.
inline void add_bench_sampling_options(CLI::App* cmd, SamplingParams& p) {
  cmd->add_option("--temperature", p.temperature, "Sampling temperature (default 0: greedy)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", p.top_p, "Nucleus sampling mass in (0, 1] (default 1)");
  cmd->add_option("--top-k", p.top_k, "Keep the k most likely tokens (default 0: all)");
}

// Request i's sampling in a benchmark: `p` with a seed of its own, so runs repeat.
inline SamplingParams bench_sampling(const SamplingParams& p, uint64_t seed, size_t i) {
  SamplingParams s = p;
  s.seed = seed * 1000003 + i;
  return s;
}

// `duet bench latency --scheduler-modes`: the batch through the serving engine per scheduler
// mode ("plain,overlap,multistep4,overlap+multistep4"; bench_schedule.cpp), on the ranks `dist`
// describes (one, or a data-parallel group with each rank decoding o.batch sequences).
struct DistOptions;
void run_schedule_bench(const AlternatingBenchOptions& o, const DistOptions& dist);

// `duet bench latency --quantizations none,int8,int4`: the batch through the model loaded under
// each --quantization (bench_quantization.cpp).
void run_quantization_bench(const AlternatingBenchOptions& o);

void add_make_model_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);    // serve_command.cpp
void add_bench_serve(CLI::App& bench);    // bench_serve.cpp
void add_bench_command(CLI::App& app);
void add_bench_latency(CLI::App& bench);  // adds "bench" and its benchmarks (bench_command.cpp)
void add_tokenize_command(CLI::App& app);  // tokenize_command.cpp
void add_bench_tokenizer(CLI::App& bench);  // bench_tokenizer.cpp
void add_bench_all2all(CLI::App& bench);  // bench_all2all.cpp
void add_bench_overlap(CLI::App& bench);  // bench_overlap.cpp
void add_bench_soak(CLI::App& bench);     // bench_soak.cpp
void add_bench_accuracy(CLI::App& bench);  // bench_accuracy.cpp

}  // namespace duet
