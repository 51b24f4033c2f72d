#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace duet {

namespace {

// inv_freq for yarn, as DeepSeek's DeepseekV2YarnRotaryEmbedding and HF's
// _compute_yarn_parameters: dimensions that turn fewer than beta_slow times over the original
// context are interpolated (divided by factor), those turning more than beta_fast times are
// kept (extrapolated), with a linear ramp between.
void yarn_inv_freq(const RopeParams& p, std::vector<float>& inv_freq) {
  const double dim = static_cast<double>(p.dim);
  auto correction_dim = [&](double num_rotations) {
    return dim *
           std::log(static_cast<double>(p.original_max_position) /
                    (num_rotations * 2 * std::numbers::pi)) /
           (2 * std::log(p.theta));
  };
  double low = correction_dim(p.beta_fast);
  double high = correction_dim(p.beta_slow);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // as the references do, to avoid dividing by 0
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    double extrapolation = 1.0 - ramp;
    double base = std::pow(p.theta, static_cast<double>(2 * i) / dim);
    double freq_extra = 1.0 / base;
    double freq_inter = 1.0 / (p.factor * base);
    inv_freq[i] =
        static_cast<float>(freq_inter * (1.0 - extrapolation) + freq_extra * extrapolation);
  }
}

// Rotates pairs (x[i], x[i + half]) for i < half.
void rotate_neox(float* x, int64_t half, const float* cos, const float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    float x0 = x[i];
    float x1 = x[i + half];
    x[i] = x0 * cos[i] - x1 * sin[i];
    x[i + half] = x1 * cos[i] + x0 * sin[i];
  }
}

// Rotates pairs (x[2i], x[2i + 1]) for i < half.
void rotate_interleaved(float* x, int64_t half, const float* cos, const float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    float x0 = x[2 * i];
    float x1 = x[2 * i + 1];
    x[2 * i] = x0 * cos[i] - x1 * sin[i];
    x[2 * i + 1] = x1 * cos[i] + x0 * sin[i];
  }
}

}  // namespace

// inv_freq is computed in double and stored as f32 (torch computes it in f32; the two agree to
// within an ulp of f32).
Rope::Rope(const RopeParams& p) : p_(p) {
  DUET_CHECK(p.dim > 0 && p.dim % 2 == 0, "rope dim " << p.dim << " must be positive and even");
  DUET_CHECK(p.theta > 1, "rope theta " << p.theta);
  inv_freq_.resize(static_cast<size_t>(p.dim / 2));
  if (p.yarn) {
    DUET_CHECK(p.factor > 0 && p.beta_fast > 0 && p.beta_slow > 0 && p.original_max_position > 0,
               "yarn factor " << p.factor << " beta_fast " << p.beta_fast << " beta_slow "
                              << p.beta_slow << " original_max_position "
                              << p.original_max_position);
    yarn_inv_freq(p, inv_freq_);
    return;
  }
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    inv_freq_[i] = static_cast<float>(
        1.0 / std::pow(p.theta, static_cast<double>(2 * i) / static_cast<double>(p.dim)));
  }
}

// The angle pos · inv_freq[i] and its cos and sin are computed in double from the f32
// inv_freq, then rounded to f32 (torch forms the angle in f32, which at position 4000 is off by
// up to ~2e-4 rad; this is the exact rotation for the f32 inv_freq).
void Rope::angles(int64_t pos, float* cos, float* sin) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double angle = static_cast<double>(pos) * static_cast<double>(inv_freq_[i]);
    cos[i] = static_cast<float>(std::cos(angle) * p_.cos_sin_scale);
    sin[i] = static_cast<float>(std::sin(angle) * p_.cos_sin_scale);
  }
}

void Rope::rotate(float* x, int64_t n_heads, int64_t stride, const float* cos, const float* sin,
                  RopeStyle style) const {
  const int64_t half = p_.dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * stride;
    if (style == RopeStyle::kNeox) {
      rotate_neox(xh, half, cos, sin);
    } else {
      rotate_interleaved(xh, half, cos, sin);
    }
  }
}

void Rope::apply(float* x, int64_t n_heads, int64_t stride, int64_t pos, RopeStyle style) const {
  const int64_t half = p_.dim / 2;
  constexpr int64_t kStackHalf = 256;
  float stack_buf[2 * kStackHalf];
  std::vector<float> heap_buf;
  float* cos = stack_buf;
  if (half > kStackHalf) {
    heap_buf.resize(static_cast<size_t>(2 * half));
    cos = heap_buf.data();
  }
  float* sin = cos + half;
  angles(pos, cos, sin);
  rotate(x, n_heads, stride, cos, sin, style);
}

void RopeAngles::update(ThreadPool& pool, const Rope& rope, const int64_t* pos, int64_t n) {
  const auto count = static_cast<size_t>(n);
  if (rope_ == &rope && pos_.size() == count && std::equal(pos, pos + n, pos_.begin())) return;
  rope_ = nullptr;  // until the table is whole again
  half_ = rope.params().dim / 2;
  pos_.assign(pos, pos + n);
  table_.resize(count * static_cast<size_t>(2 * half_));
  const auto make = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* c = table_.data() + t * 2 * half_;
      rope.angles(pos[t], c, c + half_);
    }
  };
  if (n >= kParallelTokens) {
    pool.parallel_for(n, make);
  } else {
    make(0, n);
  }
  rope_ = &rope;
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace duet
