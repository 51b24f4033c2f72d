// Rotary position embeddings, plain and yarn-scaled, in the two layouts checkpoints use.
#pragma once

#include <cstdint>
#include <vector>

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

// yarn's mscale: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace duet
