// Token sampling from one row of logits: greedy, or temperature → top-k → top-p → draw, with a
// per-sequence seeded generator so a seeded request is reproducible. A row costs a few passes
// over the vocabulary (vectorised), plus a sort of only as many of the most likely tokens as
// top-k or top-p keep.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace duet {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0 or -1: all tokens
  float top_p = 1.0f;        // (0, 1]
  std::optional<uint64_t> seed;
};

class Sampler {
 public:
  // Throws duet::Error for out-of-range parameters.
  explicit Sampler(const SamplingParams& p);

  // logits: [n_vocab] f32. Greedy picks the lowest id among equal maxima. Throws duet::Error
  // naming the first token id whose logit is NaN or infinite (the model's numerics broke down for
  // this sequence: no token can be chosen); the caller ends that request with the error.
  int32_t sample(const float* logits, int64_t n_vocab);

 private:
  // Top-p among the candidates cand_[0, n_cand) (sorted by rank or not), whose probabilities sum
  // to `sum`: the smallest set of the best ranks reaching top_p of it, then a draw from it.
  int32_t draw_nucleus(size_t n_cand, bool sorted, double sum);
  // A draw from cand_[0, n_keep), whose probabilities sum to `sum`.
  int32_t draw_first(size_t n_keep, double sum);
  // A draw from every token, in vocabulary order, the probabilities summing to `total`.
  int32_t draw_all(int64_t n_vocab, double total);

  SamplingParams p_;
  std::mt19937_64 rng_;
  // Reused scratch: the unnormalised probabilities [n_vocab] (where needed); (logit, id) pairs,
  // ordered by descending logit (lower id first among equals) as far as top-k / top-p need.
  std::vector<float> probs_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> bucket_mass_;  // top-p: probability per bucket (sampler.cpp)
  std::vector<double> block_sums_;   // probs_'s sum per kExpBlock tokens (exp_scaled)
  std::vector<int32_t> ids_;         // top-p: the ids that pass its filter
};

}  // namespace duet
