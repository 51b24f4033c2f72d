#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

namespace duet {
namespace {

// 1 / theta^(2i / dim), in double.
double plain_inv_freq(double theta, int64_t dim, int64_t i) {
  return 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(dim));
}

// The rotation by the direct formula, in double, with the Rope's (f32) inv_freq.
std::vector<float> rotate_reference(const std::vector<float>& x, const Rope& rope, int64_t n_heads,
                                    int64_t stride, int64_t pos, RopeStyle style) {
  const int64_t dim = rope.params().dim;
  const int64_t half = dim / 2;
  const double scale = rope.params().cos_sin_scale;
  std::vector<float> out = x;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      double angle = static_cast<double>(pos) * rope.inv_freq()[static_cast<size_t>(i)];
      double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
      int64_t a = style == RopeStyle::kNeox ? i : 2 * i;
      int64_t b = style == RopeStyle::kNeox ? i + half : 2 * i + 1;
      double x0 = x[static_cast<size_t>(h * stride + a)];
      double x1 = x[static_cast<size_t>(h * stride + b)];
      out[static_cast<size_t>(h * stride + a)] = static_cast<float>(x0 * c - x1 * s);
      out[static_cast<size_t>(h * stride + b)] = static_cast<float>(x1 * c + x0 * s);
    }
  }
  return out;
}

TEST(RopeTest, PlainInvFreq) {
  for (auto [dim, theta] : {std::pair<int64_t, double>{128, 1e6}, {64, 10000}, {2, 500}}) {
    RopeParams p;
    p.dim = dim;
    p.theta = theta;
    Rope rope(p);
    ASSERT_EQ(rope.inv_freq().size(), static_cast<size_t>(dim / 2));
    for (int64_t i = 0; i < dim / 2; ++i) {
      EXPECT_FLOAT_EQ(rope.inv_freq()[static_cast<size_t>(i)], plain_inv_freq(theta, dim, i));
    }
  }
}

// Both layouts against the formula: several heads with a stride larger than dim (values past
// dim must stay), positions up to 4095, with and without a cos/sin scale.
TEST(RopeTest, RotationMatchesFormula) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
    for (double scale : {1.0, 1.2608}) {
      RopeParams p;
      p.dim = 64;
      p.theta = 10000;
      p.cos_sin_scale = scale;
      Rope rope(p);
      const int64_t n_heads = 3, stride = 80;
      for (int64_t pos : {0, 1, 2, 17, 1000, 4095}) {
        std::vector<float> x(static_cast<size_t>(n_heads * stride));
        for (float& v : x) v = normal(rng);
        std::vector<float> want = rotate_reference(x, rope, n_heads, stride, pos, style);
        rope.apply(x.data(), n_heads, stride, pos, style);
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_NEAR(x[i], want[i], 1e-6 * (1 + std::fabs(want[i])))
              << "style " << static_cast<int>(style) << " pos " << pos << " i " << i;
        }
      }
    }
  }
}

TEST(RopeTest, PositionZeroIsIdentityAndRotationKeepsNorm) {
  RopeParams p;
  p.dim = 8;
  Rope rope(p);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> y = x;
  rope.apply(y.data(), 1, 8, 0, RopeStyle::kNeox);
  EXPECT_EQ(y, x);
  rope.apply(y.data(), 1, 8, 123, RopeStyle::kInterleaved);
  double n0 = 0, n1 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    n0 += double(x[i]) * x[i];
    n1 += double(y[i]) * y[i];
  }
  EXPECT_NEAR(n1, n0, 1e-4);
  // Interleaved pair 0 at position 123 turns by 123 rad (inv_freq[0] = 1).
  EXPECT_NEAR(y[0], std::cos(123.0) * 1 - std::sin(123.0) * 2, 1e-5);
  EXPECT_NEAR(y[1], std::cos(123.0) * 2 + std::sin(123.0) * 1, 1e-5);
}

// Relative positions: <rope(q, m), rope(k, n)> depends only on m - n, in both layouts.
TEST(RopeTest, DotProductDependsOnRelativePosition) {
  std::mt19937 rng(22);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RopeParams p;
  p.dim = 32;
  Rope rope(p);
  std::vector<float> q(32), k(32);
  for (float& v : q) v = normal(rng);
  for (float& v : k) v = normal(rng);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
    auto rotated_dot = [&](int64_t m, int64_t n) {
      std::vector<float> a = q, b = k;
      rope.apply(a.data(), 1, 32, m, style);
      rope.apply(b.data(), 1, 32, n, style);
      double d = 0;
      for (int i = 0; i < 32; ++i) d += double(a[i]) * b[i];
      return d;
    };
    EXPECT_NEAR(rotated_dot(10, 3), rotated_dot(107, 100), 1e-4);
  }
}

// DeepSeek-V2-Lite: qk_rope_head_dim 64, rope_theta 10000, rope_scaling {type yarn, factor 40,
// beta_fast 32, beta_slow 1, original_max_position_embeddings 4096}.
RopeParams deepseek_v2_lite_rope() {
  RopeParams p;
  p.dim = 64;
  p.theta = 10000;
  p.yarn = true;
  p.factor = 40;
  p.beta_fast = 32;
  p.beta_slow = 1;
  p.original_max_position = 4096;
  return p;
}

TEST(RopeTest, YarnInvFreqForDeepSeekV2Lite) {
  const RopeParams p = deepseek_v2_lite_rope();
  Rope rope(p);
  // The correction range by hand: dim · ln(4096 / (rotations · 2π)) / (2 ln 10000).
  const double low_exact = 64 * std::log(4096 / (32 * 2 * std::numbers::pi)) / (2 * std::log(1e4));
  const double high_exact = 64 * std::log(4096 / (1 * 2 * std::numbers::pi)) / (2 * std::log(1e4));
  EXPECT_NEAR(low_exact, 10.47, 0.01);
  EXPECT_NEAR(high_exact, 22.51, 0.01);
  const double low = 10, high = 23;  // floor and ceil
  ASSERT_EQ(rope.inv_freq().size(), 32u);
  for (int64_t i = 0; i < 32; ++i) {
    double extra = plain_inv_freq(1e4, 64, i);
    double inter = extra / 40;
    double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    double mask = 1 - ramp;  // 1: keep the original frequency
    double want = inter * (1 - mask) + extra * mask;
    EXPECT_NEAR(rope.inv_freq()[static_cast<size_t>(i)], want, 1e-7 * want) << "i " << i;
  }
  // The ends: unscaled below the range, divided by the factor above it.
  EXPECT_FLOAT_EQ(rope.inv_freq()[10], plain_inv_freq(1e4, 64, 10));
  EXPECT_FLOAT_EQ(rope.inv_freq()[23], plain_inv_freq(1e4, 64, 23) / 40);
  EXPECT_FLOAT_EQ(rope.inv_freq()[16],
                  plain_inv_freq(1e4, 64, 16) * (1 - 6.0 / 13 + 6.0 / 13 / 40));
}

TEST(RopeTest, YarnWithoutTruncation) {
  RopeParams p = deepseek_v2_lite_rope();
  p.truncate = false;
  Rope rope(p);
  const double low = 64 * std::log(4096 / (32 * 2 * std::numbers::pi)) / (2 * std::log(1e4));
  const double high = 64 * std::log(4096 / (1 * 2 * std::numbers::pi)) / (2 * std::log(1e4));
  for (int64_t i = 0; i < 32; ++i) {
    double extra = plain_inv_freq(1e4, 64, i);
    double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    double want = extra / 40 * ramp + extra * (1 - ramp);
    EXPECT_NEAR(rope.inv_freq()[static_cast<size_t>(i)], want, 1e-7 * want) << "i " << i;
  }
}

TEST(RopeTest, YarnRangeClampsAndAvoidsZeroWidth) {
  // An original context of 6 puts both correction dims below 0, so low = high = 0 and high
  // becomes 0.001: dimension 0 keeps its frequency, all others are interpolated.
  RopeParams p = deepseek_v2_lite_rope();
  p.original_max_position = 6;
  Rope rope(p);
  EXPECT_FLOAT_EQ(rope.inv_freq()[0], 1.0f);
  EXPECT_FLOAT_EQ(rope.inv_freq()[1], plain_inv_freq(1e4, 64, 1) / 40);
  EXPECT_FLOAT_EQ(rope.inv_freq()[31], plain_inv_freq(1e4, 64, 31) / 40);
}

TEST(RopeTest, YarnGetMscale) {
  EXPECT_NEAR(yarn_get_mscale(40, 0.707), 1.2608, 1e-4);
  EXPECT_DOUBLE_EQ(yarn_get_mscale(40, 0.707), 0.1 * 0.707 * std::log(40.0) + 1);
  EXPECT_EQ(yarn_get_mscale(1, 0.707), 1.0);
  EXPECT_EQ(yarn_get_mscale(0.5, 1), 1.0);
  EXPECT_NEAR(yarn_get_mscale(40, 1), 1.3689, 1e-4);
}

TEST(RopeTest, RejectsOddDim) {
  RopeParams p;
  p.dim = 7;
  EXPECT_ANY_THROW(Rope{p});
}

// The step's table holds each token's angles as Rope::angles makes them, bit for bit, on the
// caller (few tokens) and on the pool (many); a later update with other positions, or the same
// positions under another Rope, holds the new angles, not the old.
TEST(RopeTest, AnglesTableFollowsItsPositionsAndRope) {
  ThreadPool pool(2);
  RopeParams p;
  p.dim = 8;
  p.theta = 10000;
  RopeParams yarn = p;
  yarn.yarn = true;
  yarn.factor = 4;
  yarn.original_max_position = 64;
  yarn.cos_sin_scale = 1.2;
  const Rope plain(p), scaled(yarn);
  const auto expect_table = [&](const RopeAngles& table, const Rope& rope,
                                const std::vector<int64_t>& pos) {
    for (size_t t = 0; t < pos.size(); ++t) {
      std::vector<float> cos(4), sin(4);
      rope.angles(pos[t], cos.data(), sin.data());
      const auto i = static_cast<int64_t>(t);
      ASSERT_TRUE(std::equal(cos.begin(), cos.end(), table.cos(i))) << "token " << t;
      ASSERT_TRUE(std::equal(sin.begin(), sin.end(), table.sin(i))) << "token " << t;
    }
  };
  RopeAngles table;
  std::vector<int64_t> pos = {7, 0, 123};
  table.update(pool, plain, pos.data(), 3);
  expect_table(table, plain, pos);
  table.update(pool, plain, pos.data(), 3);  // the same: kept
  expect_table(table, plain, pos);
  pos[1] = 5;
  table.update(pool, plain, pos.data(), 3);
  expect_table(table, plain, pos);
  table.update(pool, scaled, pos.data(), 3);
  expect_table(table, scaled, pos);
  table.update(pool, scaled, pos.data(), 2);  // fewer tokens
  expect_table(table, scaled, {7, 5});
  std::vector<int64_t> many(100);
  for (size_t t = 0; t < many.size(); ++t) many[t] = static_cast<int64_t>(3 * t + 1);
  table.update(pool, scaled, many.data(), 100);  // on the pool
  expect_table(table, scaled, many);
}

}  // namespace
}  // namespace duet
