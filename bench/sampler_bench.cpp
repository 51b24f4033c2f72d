// Micro-benchmark of token sampling, one row of logits per call: greedy, temperature alone,
// temperature with top-p, with top-k. Args: n_vocab, mode (0 greedy, 1 temperature 0.7,
// 2 temperature 0.7 + top-p 0.9, 3 temperature 0.7 + top-k 40). The logits are normal with
// σ = 3, about the spread of a trained model's next-token logits.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "engine/sampler.h"

namespace duet {
namespace {

SamplingParams params_for(int64_t mode) {
  SamplingParams p;
  p.seed = 1;
  if (mode >= 1) p.temperature = 0.7f;
  if (mode == 2) p.top_p = 0.9f;
  if (mode == 3) p.top_k = 40;
  return p;
}

void BM_Sample(benchmark::State& state) {
  const int64_t n_vocab = state.range(0);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  for (float& v : logits) v = normal(rng);
  Sampler sampler(params_for(state.range(1)));
  int64_t sum = 0;
  for (auto _ : state) sum += sampler.sample(logits.data(), n_vocab);
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Sample)->ArgNames({"n_vocab", "mode"})->ArgsProduct({{32000, 151936}, {0, 1, 2, 3}});

}  // namespace
}  // namespace duet
