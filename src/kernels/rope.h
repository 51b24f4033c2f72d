// Rotary position embeddings, plain and yarn-scaled, in the two layouts checkpoints use.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace duet {

enum class RopeStyle {
  kNeox,         // pairs (i, i + dim/2): Llama, Qwen, Mixtral (rotate_half)
  kInterleaved,  // pairs (2i, 2i + 1): DeepSeek-V2's MLA rope part
};

struct RopeParams {
  int64_t dim = 0;       // rotated dimensions per head (even)
  double theta = 10000;  // rope_theta
  // yarn (rope_scaling.type == "yarn"); off when factor <= 1 and !yarn.
  bool yarn = false;
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position = 4096;
  bool truncate = true;          // floor/ceil the correction range, as both HF and DeepSeek do
  double cos_sin_scale = 1.0;    // yarn's attention factor applied to cos and sin
};

// Precomputes inverse frequencies; apply() rotates in place.
class Rope {
 public:
  explicit Rope(const RopeParams& p);

  // Rotates the first `dim` values of each of n_heads vectors x[h * stride + 0 .. dim) for
  // position `pos`.
  void apply(float* x, int64_t n_heads, int64_t stride, int64_t pos, RopeStyle style) const;

  // apply() in two halves, for vectors of one position rotated in several calls:
  // cos[i], sin[i] (i < dim / 2) of position pos's angles, then the rotation by them.
  void angles(int64_t pos, float* cos, float* sin) const;
  void rotate(float* x, int64_t n_heads, int64_t stride, const float* cos, const float* sin,
              RopeStyle style) const;

  const std::vector<float>& inv_freq() const { return inv_freq_; }  // [dim / 2]
  const RopeParams& params() const { return p_; }

 private:
  RopeParams p_;
  std::vector<float> inv_freq_;
};

// The angles of a batch's positions under one Rope, cos then sin of each token's: made once
// per step and read by every layer, where each layer made its own before (2 · dim / 2 double
// sin and cos a token: 0.9 us for dim 128 on Zen 4, every layer of every step).
class RopeAngles {
 public:
  // Makes the table for positions pos[0, n) under rope, unless it already holds exactly those
  // (the same Rope object and the same positions): the first layer of a step makes it, the others
  // find it made. Tokens are shared out over pool from kParallelTokens on.
  void update(ThreadPool& pool, const Rope& rope, const int64_t* pos, int64_t n);

  // [dim / 2] cos and sin of token t's position (t < the n of the last update).
  const float* cos(int64_t t) const { return table_.data() + t * 2 * half_; }
  const float* sin(int64_t t) const { return cos(t) + half_; }

 private:
  static constexpr int64_t kParallelTokens = 16;
  const Rope* rope_ = nullptr;
  int64_t half_ = 0;
  std::vector<int64_t> pos_;  // [n] the positions the table holds
  std::vector<float> table_;  // [n, 2 * half_] f32
};

// yarn's mscale: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace duet
