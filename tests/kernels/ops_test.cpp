#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops_impl.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

namespace scalar = ops_impl::scalar;
namespace avx512 = ops_impl::avx512;

const std::vector<int64_t> kSizes = {1, 7, 15, 16, 17, 33, 63, 64, 65, 100, 1003, 2048, 7171};

// Values of mixed magnitude (2^-20 .. 2^20 times a normal sample), some exact zeros.
std::vector<float> random_values(std::mt19937& rng, int64_t n, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::uniform_int_distribution<int> pick(0, 15);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) {
    int p = pick(rng);
    f = p == 0 ? 0.0f : p <= 2 ? std::ldexp(normal(rng), exponent(rng)) : normal(rng);
  }
  return v;
}

bool have_avx512() {
  return simd::isa_supported(simd::Isa::kAvx512);
}

// |got - want| <= rel · |want| + abs for every element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel,
                  float abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    bool same_special = (std::isnan(got[i]) && std::isnan(want[i])) || got[i] == want[i];
    if (!same_special && !(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + abs)) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
      ++failures;
    }
  }
}

TEST(OpsTest, RmsNormHandComputed) {
  // mean(x^2) = 12.5, so x / sqrt(12.5) * w.
  std::vector<float> x = {3, 4}, w = {1, 2}, y(2);
  rms_norm(x.data(), w.data(), 1, 2, 0.0f, y.data());
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], 8 / std::sqrt(12.5), 1e-6);
  scalar::rms_norm(x.data(), w.data(), 1, 2, 0.5f, y.data());
  EXPECT_NEAR(y[0], 3 / std::sqrt(13.0), 1e-6);
}

TEST(OpsTest, RmsNormSimdMatchesScalar) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(11);
  for (int64_t n : kSizes) {
    for (int64_t n_rows : {1, 3}) {
      std::vector<float> x = random_values(rng, n_rows * n);
      std::vector<float> w = random_values(rng, n);
      std::vector<float> want(x.size()), got(x.size());
      scalar::rms_norm(x.data(), w.data(), n_rows, n, 1e-6f, want.data());
      avx512::rms_norm(x.data(), w.data(), n_rows, n, 1e-6f, got.data());
      std::string what = "rms_norm n " + std::to_string(n);
      expect_close(got, want, 1e-5f, 0.0f, what);
      // In place.
      std::vector<float> inplace = x;
      rms_norm(inplace.data(), w.data(), n_rows, n, 1e-6f, inplace.data());
      expect_close(inplace, want, 1e-5f, 0.0f, what + " in place");
    }
  }
}

TEST(OpsTest, SiluMulHandComputed) {
  std::vector<float> gate = {0, 1, -2, 30}, up = {5, 2, 1, 1}, out(4);
  silu_mul(gate.data(), up.data(), 4, out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(out[2], -2 / (1 + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(out[3], 30.0, 1e-5);
}

TEST(OpsTest, SiluMulSimdMatchesScalar) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(12);
  for (int64_t n : kSizes) {
    std::vector<float> gate = random_values(rng, n, 4.0f);
    std::vector<float> up = random_values(rng, n);
    // The ends of exp's range.
    const float edges[] = {-100.0f, -88.0f, -87.0f, 87.0f, 88.0f, 100.0f, -0.0f, 1e-30f};
    for (size_t i = 0; i < std::size(edges) && i < gate.size(); ++i) gate[i] = edges[i];
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    scalar::silu_mul(gate.data(), up.data(), n, want.data());
    avx512::silu_mul(gate.data(), up.data(), n, got.data());
    expect_close(got, want, 2e-6f, 1e-37f, "silu_mul n " + std::to_string(n));
    // out aliasing gate.
    std::vector<float> inplace = gate;
    silu_mul(inplace.data(), up.data(), n, inplace.data());
    expect_close(inplace, want, 2e-6f, 1e-37f, "silu_mul in place n " + std::to_string(n));
  }
}

TEST(OpsTest, SoftmaxSimdMatchesScalar) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(13);
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back(151936);  // a vocabulary
  for (int64_t n : sizes) {
    std::vector<float> x = random_values(rng, n, 5.0f);
    for (size_t i = 1; i < x.size(); i += 5) x[i] = -std::numeric_limits<float>::infinity();
    std::vector<float> want = x, got = x;
    scalar::softmax(want.data(), n);
    avx512::softmax(got.data(), n);
    expect_close(got, want, 2e-6f, 1e-38f, "softmax n " + std::to_string(n));
    double sum = 0;
    for (float v : got) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-5) << n;
    for (size_t i = 1; i < got.size(); i += 5) ASSERT_EQ(got[i], 0.0f) << "masked entry " << i;
  }
}

TEST(OpsTest, SoftmaxHandComputed) {
  std::vector<float> x = {1, 2, 3};
  softmax(x.data(), 3);
  double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(x[0], std::exp(1.0) / z, 1e-7);
  EXPECT_NEAR(x[2], std::exp(3.0) / z, 1e-7);
  float one = 42;
  softmax(&one, 1);
  EXPECT_EQ(one, 1.0f);
}

// The first largest value's index, ties and -0 included, or -1 for any NaN or ±inf anywhere
// (first, middle, in the tail the vector loop masks).
TEST(OpsTest, ArgmaxFiniteSimdMatchesScalar) {
  std::mt19937 rng(21);
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back(151936);
  const float bad[] = {std::nanf(""), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (int64_t n : sizes) {
    std::vector<float> x = random_values(rng, n, 4.0f);
    const int64_t want = scalar::argmax_finite(x.data(), n);
    ASSERT_GE(want, 0) << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_LE(x[size_t(i)], x[size_t(want)]) << n;
    EXPECT_EQ(argmax_finite(x.data(), n), want) << n;
    // The maximum again later: the first one still wins; and earlier: that one wins.
    if (n > 2) {
      x[size_t(n - 1)] = x[size_t(want)];
      EXPECT_EQ(argmax_finite(x.data(), n), want) << n;
      x[0] = x[size_t(want)];
      EXPECT_EQ(argmax_finite(x.data(), n), 0) << n;
    }
    for (float b : bad) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        std::vector<float> y = x;
        y[size_t(at)] = b;
        EXPECT_EQ(scalar::argmax_finite(y.data(), n), -1) << n << " " << at;
        if (have_avx512()) {
          EXPECT_EQ(avx512::argmax_finite(y.data(), n), -1) << n << " " << at;
        }
      }
    }
    if (have_avx512()) {
      EXPECT_EQ(avx512::argmax_finite(x.data(), n), scalar::argmax_finite(x.data(), n)) << n;
    }
  }
  const float zeros[] = {-0.0f, 0.0f, -1.0f};
  EXPECT_EQ(argmax_finite(zeros, 3), 0);
  const float low[] = {-3e38f, -3e38f};
  EXPECT_EQ(argmax_finite(low, 2), 0);
}

// exp(x / t - m) and its sum: the AVX-512 polynomial against std::exp, with logits of a
// vocabulary's size and spread, masked (-inf would be an error upstream: large negatives here).
TEST(OpsTest, ExpScaledSimdMatchesScalar) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(22);
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back(151936);
  for (int64_t n : sizes) {
    for (float t : {0.3f, 1.0f, 1.7f}) {
      std::vector<float> x = random_values(rng, n, 5.0f);
      for (size_t i = 3; i < x.size(); i += 7) x[i] = -1e30f;
      float m = -INFINITY;
      for (float v : x) m = std::max(m, v / t);
      std::vector<float> want(size_t(n) + 16, 7.0f), got(size_t(n) + 16, 7.0f);
      const size_t n_blocks = size_t((n + kExpBlock - 1) / kExpBlock);
      std::vector<double> bw(n_blocks + 1, 7.0), bg(n_blocks + 1, 7.0);
      const double sw = scalar::exp_scaled(x.data(), n, t, m, want.data(), bw.data());
      const double sg = avx512::exp_scaled(x.data(), n, t, m, got.data(), bg.data());
      EXPECT_EQ(avx512::exp_scaled(x.data(), n, t, m, got.data(), nullptr), sg);
      // Each block's sum, and the total as the blocks' sums added in order (what a draw walks).
      for (const std::vector<double>* bs : {&bw, &bg}) {
        ASSERT_EQ((*bs)[n_blocks], 7.0) << "past the last block";
        double total = 0;
        for (size_t b = 0; b < n_blocks; ++b) total += (*bs)[b];
        EXPECT_EQ(total, bs == &bw ? sw : sg) << n;
      }
      for (size_t b = 0; b < n_blocks; ++b) {
        double ref = 0;
        for (size_t i = b * kExpBlock; i < std::min(size_t(n), (b + 1) * kExpBlock); ++i)
          ref += want[i];
        EXPECT_EQ(bw[b], ref) << n << " block " << b;
        EXPECT_NEAR(bg[b], ref, 1e-6 * ref) << n << " block " << b;
      }
      want.resize(size_t(n));
      for (size_t i = size_t(n); i < got.size(); ++i) ASSERT_EQ(got[i], 7.0f) << "past the end";
      got.resize(size_t(n));
      expect_close(got, want, 2e-6f, 1e-38f, "exp_scaled n " + std::to_string(n));
      EXPECT_NEAR(sg, sw, 1e-6 * sw) << n;
      EXPECT_GE(sw, 1.0) << "the largest term is exp(0)";
      for (size_t i = 3; i < got.size(); i += 7) ASSERT_EQ(got[i], 0.0f) << i;
    }
  }
}

TEST(OpsTest, FirstAboveFindsTheFirstGreaterValue) {
  std::mt19937 rng(23);
  for (int64_t n : {0, 1, 15, 16, 17, 31, 33, 100, 1000}) {
    std::vector<float> x = random_values(rng, std::max<int64_t>(n, 1));
    x.resize(size_t(n));
    for (float t : {-2.0f, 0.0f, 0.5f, 0.99f, 2.0f}) {
      int64_t want = 0;
      while (want < n && !(x[size_t(want)] > t)) ++want;
      EXPECT_EQ(scalar::first_above(x.data(), n, t), want) << n << " " << t;
      EXPECT_EQ(first_above(x.data(), n, t), want) << n << " " << t;
      if (have_avx512()) {
        EXPECT_EQ(avx512::first_above(x.data(), n, t), want) << n << " " << t;
      }
    }
    // Equal is not above; NaN never is; the one value above sits in every lane and the tail.
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> y(size_t(n), 1.0f);
      if (at > 0) y[size_t(at - 1)] = NAN;
      y[size_t(at)] = 1.5f;
      EXPECT_EQ(first_above(y.data(), n, 1.0f), at) << n;
      EXPECT_EQ(first_above(y.data(), n, 1.5f), n) << n;
    }
  }
}

TEST(OpsTest, IndicesAtLeastKeepsEveryPassingIndexInOrder) {
  std::mt19937 rng(24);
  for (int64_t n : {0, 1, 15, 16, 17, 33, 100, 1000, 32000}) {
    std::vector<float> x = random_values(rng, std::max<int64_t>(n, 1));
    x.resize(size_t(n));
    if (n > 20) x[7] = NAN, x[9] = 0.5f, x[10] = 0.5f;  // NaN never passes; equal does
    for (float t : {-10.0f, 0.0f, 0.5f, 1.5f, 10.0f}) {
      std::vector<int32_t> want;
      for (int64_t i = 0; i < n; ++i)
        if (x[size_t(i)] >= t) want.push_back(int32_t(i));
      std::vector<int32_t> got(size_t(n) + 16, -7);
      got.resize(size_t(indices_at_least(x.data(), n, t, got.data())));
      EXPECT_EQ(got, want) << n << " " << t;
      std::vector<int32_t> ref(size_t(n) + 1);
      ref.resize(size_t(scalar::indices_at_least(x.data(), n, t, ref.data())));
      EXPECT_EQ(ref, want) << n << " " << t;
      if (have_avx512()) {
        std::vector<int32_t> v(size_t(n) + 16, -7);
        const int64_t m = avx512::indices_at_least(x.data(), n, t, v.data());
        v.resize(size_t(m));
        EXPECT_EQ(v, want) << n << " " << t;
      }
    }
  }
}

TEST(OpsTest, DotSimdMatchesScalar) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(14);
  for (int64_t n : kSizes) {
    std::vector<float> a = random_values(rng, n), b = random_values(rng, n);
    double scale = 0;
    for (size_t i = 0; i < a.size(); ++i) scale += std::fabs(double(a[i]) * b[i]);
    float want = scalar::dot(a.data(), b.data(), n);
    EXPECT_NEAR(avx512::dot(a.data(), b.data(), n), want, 1e-5 * scale) << n;
    EXPECT_NEAR(dot(a.data(), b.data(), n), want, 1e-5 * scale) << n;
  }
  EXPECT_EQ(dot(nullptr, nullptr, 0), 0.0f);
}

TEST(OpsTest, AxpyAndAddSimdMatchScalar) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(15);
  for (int64_t n : kSizes) {
    std::vector<float> x = random_values(rng, n), y = random_values(rng, n);
    std::vector<float> want = y, got = y;
    scalar::axpy(-0.37f, x.data(), n, want.data());
    avx512::axpy(-0.37f, x.data(), n, got.data());
    // The SIMD version fuses the multiply-add (one rounding instead of two).
    std::vector<float> scale(y.size());
    for (size_t i = 0; i < y.size(); ++i) scale[i] = std::fabs(y[i]) + std::fabs(0.37f * x[i]);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-7f * scale[i]) << "axpy n " << n << " i " << i;
    }
    want = y;
    got = y;
    scalar::add_inplace(x.data(), n, want.data());
    avx512::add_inplace(x.data(), n, got.data());
    EXPECT_EQ(got, want) << "add_inplace n " << n;
    got = y;
    add_inplace(x.data(), n, got.data());
    EXPECT_EQ(got, want) << "add_inplace() n " << n;
  }
}

// bf16 rows (the all-to-all's --all2all-dtype bf16): rounding bit for bit as f32_to_bf16 on
// random values, ties, NaN, infinities, subnormals and values that round up to infinity;
// widening and the bf16 axpy as the scalar versions.
TEST(OpsTest, Bf16RowsSimdMatchScalar) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(17);
  std::vector<float> edge = {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256,  // ties
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::denorm_min(),
                             std::numeric_limits<float>::max(), -3.4e38f};
  uint32_t snan_bits = 0x7f800001u;  // a signalling NaN whose payload sits in the low bits
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  edge.push_back(snan);
  for (int64_t n : kSizes) {
    std::vector<float> x = random_values(rng, n);
    for (size_t i = 0; i < x.size() && i < edge.size(); ++i) x[i] = edge[i];
    std::vector<uint16_t> want(x.size()), got(x.size(), 0xdead);
    scalar::f32_to_bf16_row(x.data(), n, want.data());
    avx512::f32_to_bf16_row(x.data(), n, got.data());
    EXPECT_EQ(got, want) << "n " << n;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(want[i], f32_to_bf16(x[i])) << i;
    std::vector<float> wide_want(x.size()), wide_got(x.size());
    scalar::bf16_to_f32_row(want.data(), n, wide_want.data());
    avx512::bf16_to_f32_row(want.data(), n, wide_got.data());
    EXPECT_EQ(std::memcmp(wide_got.data(), wide_want.data(), x.size() * 4), 0) << "n " << n;
    std::vector<float> y = random_values(rng, n), ay = y, by = y;
    std::vector<uint16_t> h(x.size());
    std::vector<float> xs = random_values(rng, n);
    scalar::f32_to_bf16_row(xs.data(), n, h.data());
    scalar::axpy_bf16(0.6f, h.data(), n, ay.data());
    avx512::axpy_bf16(0.6f, h.data(), n, by.data());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(by[i], ay[i], 2e-7f * (std::fabs(y[i]) + std::fabs(xs[i]))) << "axpy_bf16 " << i;
  }
}

TEST(OpsTest, SimdLeavesMemoryPastTheEndAlone) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(16);
  const int64_t n = 19;
  std::vector<float> x = random_values(rng, n + 16), y(n + 16, 7.0f), w(n + 16, 1.0f);
  avx512::axpy(2.0f, x.data(), n, y.data());
  avx512::add_inplace(x.data(), n, y.data());
  avx512::silu_mul(x.data(), x.data(), n, y.data());
  avx512::rms_norm(x.data(), w.data(), 1, n, 1e-6f, y.data());
  avx512::softmax(y.data(), n);
  for (int64_t i = n; i < n + 16; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], 7.0f) << i;
}

}  // namespace
}  // namespace duet
