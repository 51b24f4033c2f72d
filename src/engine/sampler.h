// Token sampling from one row of logits: greedy, or temperature → top-k → top-p → draw, with a
// per-sequence seeded generator so a seeded request is reproducible.
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
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused scratch
};

int32_t argmax(const float* x, int64_t n);

}  // namespace duet
