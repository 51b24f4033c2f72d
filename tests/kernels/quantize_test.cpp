// int8 and int4 weights (DType::kQ8, kQ4): the quantization of weights and of x, and every
// product kernel against the scalar one and against the dequantized f32 matrix, for both.
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/grouped_matmul_impl.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "kernels/matmul_q8_impl.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

using matmul_q8::Kernel;
using simd::Isa;

Matrix f32_matrix(const std::vector<float>& v, int64_t rows, int64_t cols) {
  Matrix m;
  m.dtype = DType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.data = v.data();
  return m;
}

// The parameter of the tests that run on both formats.
class QuantizedKernelTest : public ::testing::TestWithParam<DType> {
 protected:
  QuantizedMatrix quantize(const std::vector<float>& v, int64_t rows, int64_t cols) const {
    return QuantizedMatrix(f32_matrix(v, rows, cols), GetParam());
  }
};

// Normal values; each group of kQ8Group columns of a row gets a magnitude of its own (2^-60 ..
// 2^60 where `extreme`, else 2^-4 .. 2^4), and about one group in eight is all zero. With
// `per_row` (and `extreme`), a row's groups lie within 2^±10 of a magnitude of the row's own
// (2^-60 .. 2^60): the spread a row's 16-bit scales keep at full precision (quantize.h).
std::vector<float> grouped_values(std::mt19937& rng, int64_t rows, int64_t cols, bool extreme,
                                  bool per_row = false) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(extreme ? -60 : -4, extreme ? 60 : 4);
  std::uniform_int_distribution<int> offset(-10, 10);
  std::uniform_int_distribution<int> pick(0, 7);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int row_exponent = exponent(rng);
    for (int64_t g = 0; g * kQ8Group < cols; ++g) {
      const bool zero = pick(rng) == 0;
      const int e = per_row ? row_exponent + offset(rng) : exponent(rng);
      const float scale = std::ldexp(1.0f, e);
      for (int64_t k = g * kQ8Group; k < std::min(cols, (g + 1) * kQ8Group); ++k) {
        v[r * cols + k] = zero ? 0.0f : scale * normal(rng);
      }
    }
  }
  return v;
}

std::vector<Isa> all_isas() {
  std::vector<Isa> out;
  for (Isa isa :
       {Isa::kAvx512Bf16, Isa::kAvx512Bf16Emulated, Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (simd::isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// x's value k of token t as quantized: d_x · q_x.
double x_value(const Q8Rows& x, int64_t t, int64_t k) {
  return double(matmul_q8::x_scale(x, t, k)) * matmul_q8::x_value(x, t, k);
}

// Σ_k |w[r, k] · x[t, k]| of the quantized operands: what the f32 rounding errors of the kernels
// scale with.
double abs_products(const Matrix& w, const Q8Rows& x, int64_t t, int64_t r) {
  double sum = 0;
  for (int64_t k = 0; k < w.cols; ++k)
    sum += std::fabs(double(q8_scale(w, r, k)) * q8_value(w, r, k) * x_value(x, t, k));
  return sum;
}

// The bound between a kernel and the scalar one: each lane sums the products of a group exactly
// in int32, then adds up to n_groups scaled terms in f32, each rounded (scale product, product,
// sum: 3 roundings), then a tree of at most 4 levels: (n_groups + 8) f32 roundings of at most
// the sum of the magnitudes.
double kernel_tolerance(const Matrix& w, const Q8Rows& x, int64_t t, int64_t r) {
  const double n_groups = double(q8_ld(w.cols) / kQ8Group);
  return (n_groups + 8) * 0x1p-24 * abs_products(w, x, t, r) + 1e-37;
}

TEST(QuantizeTest, RowIsScaledByItsGroupMaximumAndRoundedToNearest) {
  // Group 0: max 2.54 → scale 0.02; group 1 all zero; columns 40..127 are padding.
  std::vector<float> row(40, 0.0f);
  row[0] = 2.54f;
  row[1] = -1.27f;
  row[2] = 0.01f;    // 0.5 → 0 (to even)
  row[3] = 0.03f;    // 1.5 → 2 (to even)
  row[4] = -0.025f;  // -1.25 → -1
  std::vector<int8_t> q(q8_ld(40), 99);
  std::vector<float> scales(q8_ld(40) / kQ8Group, 99.0f);
  quantize_row_q8(DType::kF32, row.data(), 40, q.data(), scales.data());
  ASSERT_EQ(q.size(), 128u);
  EXPECT_FLOAT_EQ(scales[0], 2.54f / 127.0f);
  for (size_t g = 1; g < scales.size(); ++g) EXPECT_EQ(scales[g], 0.0f) << g;
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);  // -63.5 → -64 (to even)
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 2);
  EXPECT_EQ(q[4], -1);
  for (size_t k = 5; k < q.size(); ++k) EXPECT_EQ(q[k], 0) << k;
}

// Within half a step, but for int4's weights of the sign opposite to the group's extreme and
// within half a step of its magnitude (+8 steps, clamped to 7: within a step).
TEST_P(QuantizedKernelTest, DequantizedIsWithinHalfAStepAndBf16Matches) {
  std::mt19937 rng(5);
  for (int64_t cols : {1, 31, 32, 33, 100, 257}) {
    const int64_t rows = 7;
    std::vector<float> w = grouped_values(rng, rows, cols, true, true);
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = f32_to_bf16(w[i]);
    std::vector<float> w16_f32(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16_f32[i] = bf16_to_f32(w16[i]);

    QuantizedMatrix q = quantize(w16_f32, rows, cols);
    Matrix bf = f32_matrix(w16_f32, rows, cols);
    bf.dtype = DType::kBF16;
    bf.data = w16.data();
    QuantizedMatrix qb(bf, GetParam());
    const uint64_t group_bytes = GetParam() == DType::kQ4 ? 16 + 2 : 32 + 2;  // values, f16 scale
    EXPECT_EQ(q.view().nbytes(),
              uint64_t((rows + 3) / 4 * 4) * (q8_ld(cols) / 32 * group_bytes + 4));
    const std::vector<float> d = dequantize_int(q.view()), db = dequantize_int(qb.view());
    EXPECT_EQ(d, db) << "bf16 and its f32 widening quantize alike";
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        const float scale = std::fabs(q8_scale(q.view(), r, k));
        const bool clamped = GetParam() == DType::kQ4 && q8_value(q.view(), r, k) == 7;
        EXPECT_LE(std::fabs(d[r * cols + k] - w16_f32[r * cols + k]),
                  (clamped ? 1.0f : 0.5f) * scale * 1.0001f)
            << "cols " << cols << " r " << r << " k " << k;
      }
    }
  }
}

// Weights on a group's grid (d · q, one q at the format's extreme, d of any magnitude, a row's
// within 2^±10 of each other) come back exactly, from f32 and from bf16: the scale is found
// exactly, stored exactly (4 significant bits, well inside the f16 window of its row) and every
// weight lands on its q.
TEST_P(QuantizedKernelTest, RoundTripIsExactOnTheGrid) {
  const bool q4 = GetParam() == DType::kQ4;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> q_of(q4 ? -8 : -127, q4 ? 7 : 127), exponent(-60, 60);
  std::uniform_int_distribution<int> mantissa(8, 15), sign(0, 1), offset(-10, 10);
  for (int64_t cols : {32, 45, 128, 300}) {
    const int64_t rows = 6;
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      const int row_exponent = exponent(rng);
      for (int64_t g = 0; g * kQ8Group < cols; ++g) {
        // 4 significant bits: d · q is exact in bf16 for |q| ≤ 8 and in f32 for any q here.
        const float d = (sign(rng) ? -1.0f : 1.0f) *
                        std::ldexp(float(mantissa(rng)), row_exponent + offset(rng));
        const int64_t k0 = g * kQ8Group, n = std::min(kQ8Group, cols - k0);
        for (int64_t i = 0; i < n; ++i) w[r * cols + k0 + i] = d * float(q_of(rng));
        w[r * cols + k0 + n / 2] = d * (q4 ? -8.0f : (sign(rng) ? 127.0f : -127.0f));
      }
    }
    QuantizedMatrix q = quantize(w, rows, cols);
    EXPECT_EQ(dequantize_int(q.view()), w) << "cols " << cols;
    if (!q4) continue;
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = f32_to_bf16(w[i]);
      ASSERT_EQ(bf16_to_f32(w16[i]), w[i]);
    }
    Matrix bf = f32_matrix(w, rows, cols);
    bf.dtype = DType::kBF16;
    bf.data = w16.data();
    EXPECT_EQ(dequantize_int(QuantizedMatrix(bf, GetParam()).view()), w) << "bf16 cols " << cols;
  }
}

// In an arena (as a checkpoint's quantized copies are, in huge pages) the same bits as in memory
// of its own.
TEST_P(QuantizedKernelTest, ArenaCopyHasTheSameBits) {
  std::mt19937 rng(5);
  const int64_t rows = 13, cols = 300;
  const std::vector<float> w = grouped_values(rng, rows, cols, true);
  const QuantizedMatrix own = quantize(w, rows, cols);
  HugePageArena arena;
  arena.allocate(100);  // the copy starts past another buffer
  const QuantizedMatrix in_arena(f32_matrix(w, rows, cols), GetParam(), &arena);
  EXPECT_GT(arena.reserved_bytes(), 0u);
  EXPECT_EQ(dequantize_int(in_arena.view()), dequantize_int(own.view()));
  EXPECT_EQ(in_arena.view().nbytes(), own.view().nbytes());
  EXPECT_EQ(std::memcmp(in_arena.view().data, own.view().data, own.view().nbytes()), 0);
}

// Slices start at a block of 4 rows (the layout interleaves a block's rows).
TEST_P(QuantizedKernelTest, RowSliceKeepsGroupsAndScales) {
  std::mt19937 rng(8);
  std::vector<float> w = grouped_values(rng, 9, 170, false);
  QuantizedMatrix q = quantize(w, 9, 170);
  const std::vector<float> all = dequantize_int(q.view());
  const std::vector<float> part = dequantize_int(q.view().row_slice(4, 5));
  EXPECT_EQ(part, std::vector<float>(all.begin() + 4 * 170, all.end()));
  EXPECT_THROW(q.view().row_slice(3, 4), std::logic_error);
}

// Row r of `cols` weights (f32) as the scale rule of quantize.h says they come back, computed
// here from the rule's f32 group scales d (quantize_row_q8 or _q4): the row factor D, the power
// of two with max |d| / D in [2^14, 2^15) (or 2^-149), found by halving and doubling; s = d / D
// rounded to f16; q = round(w / (D · s)) to nearest even, clamped to the format's range.
std::vector<float> dequantized_by_rule(DType to, const float* row, int64_t cols, float& D) {
  const bool q4 = to == DType::kQ4;
  const int64_t n_groups = q8_ld(cols) / kQ8Group;
  std::vector<int8_t> q(static_cast<size_t>(q8_ld(cols)));
  std::vector<float> d(static_cast<size_t>(n_groups));
  (q4 ? quantize_row_q4 : quantize_row_q8)(DType::kF32, row, cols, q.data(), d.data());
  float amax = 0.0f;
  for (float v : d) amax = std::max(amax, std::fabs(v));
  D = amax == 0.0f ? 0.0f : 1.0f;
  while (amax != 0.0f && amax / D >= 0x1p15f) D *= 2.0f;
  while (amax != 0.0f && amax / D < 0x1p14f && D > 0x1p-149f) D /= 2.0f;
  std::vector<float> out(static_cast<size_t>(cols));
  for (int64_t k = 0; k < cols; ++k) {
    const float ds = D * f16_to_f32(f32_to_f16(D != 0.0f ? d[k / kQ8Group] / D : 0.0f));
    const float v = ds != 0.0f ? std::nearbyint(row[k] / ds) : 0.0f;
    out[k] = ds * std::clamp(v, q4 ? -8.0f : -127.0f, q4 ? 7.0f : 127.0f);
  }
  return out;
}

// The range of the 16-bit scales (quantize.h), on rows a plain f16 scale (max|w| / 127, m / -8)
// loses: bf16 weights of 1e-30, whose scale underflows f16; a row of groups of 1e3 and one of
// 1e-6, whose scale is below (int8) or a few units of (int4) f16's least subnormal; weights of
// 1e30, whose scale overflows f16; bf16 subnormals (1e-39, the row factor's floor 2^-149); and
// all-zero groups and rows. Each weight comes back exactly as the rule says and within half a
// step (int4: a step where clamped to 7), from bf16 as from f32, and every kernel multiplies
// them as the scalar one does and as the dequantized f32 matrix does, up to the rounding of x.
TEST_P(QuantizedKernelTest, RowFactorKeepsTheRangeOfBf16) {
  const bool q4 = GetParam() == DType::kQ4;
  const int64_t rows = 7, cols = 96;
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols), 0.0f);
  const auto fill = [&](int64_t r, int64_t g, float magnitude) {
    for (int64_t k = g * kQ8Group; k < (g + 1) * kQ8Group; ++k)
      w[r * cols + k] = magnitude * normal(rng);
  };
  for (int64_t g = 0; g < 3; ++g) fill(0, g, 1e-30f);
  fill(1, 0, 1e3f);
  fill(1, 1, 1e-6f);
  fill(1, 2, 1e3f);
  w[1 * cols + 40] = 3e-6f;  // group 1's largest, so that its scale is known
  for (int64_t k = 32; k < 64; ++k) w[1 * cols + k] = std::clamp(w[1 * cols + k], -2e-6f, 3e-6f);
  fill(3, 1, 0.02f);  // row 2: zeros; row 3: a group between zero groups
  for (int64_t g = 0; g < 3; ++g) fill(4, g, 0.05f);
  for (int64_t g = 0; g < 3; ++g) fill(5, g, 1e30f);
  for (int64_t g = 0; g < 3; ++g) fill(6, g, 1e-39f);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w16[i] = f32_to_bf16(w[i]);
    w[i] = bf16_to_f32(w16[i]);
  }
  // What a plain f16 scale would make of them: rows 0, 1 (group 1) and 5 out of its range.
  const float plain_f16_error[3][2] = {{1.0f, 1.0f}, {1.0f, 0.01f}, {INFINITY, INFINITY}};
  const int64_t at[3][2] = {{0, 0}, {1, 1}, {5, 0}};  // (row, group)
  for (int i = 0; i < 3; ++i) {
    std::vector<int8_t> q(128);
    std::vector<float> d(4);
    (q4 ? quantize_row_q4 : quantize_row_q8)(DType::kF32, &w[at[i][0] * cols], cols, q.data(),
                                             d.data());
    const float g = d[at[i][1]], plain = f16_to_f32(f32_to_f16(g));
    EXPECT_GE(std::fabs(plain - g), plain_f16_error[i][q4] * std::fabs(g)) << "row " << at[i][0];
  }

  QuantizedMatrix q = quantize(w, rows, cols);
  Matrix bf = f32_matrix(w, rows, cols);
  bf.dtype = DType::kBF16;
  bf.data = w16.data();
  const std::vector<float> deq = dequantize_int(q.view());
  EXPECT_EQ(dequantize_int(QuantizedMatrix(bf, GetParam()).view()), deq);
  for (int64_t r = 0; r < rows; ++r) {
    float D;
    const std::vector<float> want = dequantized_by_rule(GetParam(), &w[r * cols], cols, D);
    EXPECT_EQ(q8_row_scale(q.view(), r), D) << "row " << r;
    for (int64_t k = 0; k < cols; ++k) {
      const float v = w[r * cols + k], got = deq[r * cols + k];
      EXPECT_EQ(got, want[k]) << "row " << r << " k " << k;
      const float step = std::fabs(q8_scale(q.view(), r, k));
      const bool clamped = q4 && q8_value(q.view(), r, k) == 7;
      EXPECT_LE(std::fabs(got - v), (clamped ? 1.0f : 0.5f) * step * 1.0001f)
          << "row " << r << " k " << k;
      EXPECT_EQ(step == 0.0f, v == 0.0f && (r == 2 || (r == 3 && k / kQ8Group != 1)))
          << "row " << r << " k " << k << ": only the zero groups have scale 0";
    }
  }

  for (int64_t n_tokens : {1, 3, 5}) {
    std::vector<float> x = grouped_values(rng, n_tokens, cols, false);
    matmul_q8::Buffer buf;
    const Q8Rows xq = matmul_q8::quantize_x(x.data(), cols, n_tokens, buf);
    std::vector<float> want(static_cast<size_t>(n_tokens * rows)), ref(want.size());
    matmul_q8::rows_with(Kernel::kScalar, q.view(), xq, n_tokens, want.data(), rows, 0, rows);
    matmul_scalar(f32_matrix(deq, rows, cols), x.data(), n_tokens, ref.data());
    for (Kernel k : matmul_q8::simd_kernels()) {
      std::vector<float> got(want.size(), std::nanf(""));
      matmul_q8::rows_with(k, q.view(), xq, n_tokens, got.data(), rows, 0, rows);
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_NEAR(got[t * rows + r], want[t * rows + r], kernel_tolerance(q.view(), xq, t, r))
              << matmul_q8::kernel_name(k) << " n_tokens " << n_tokens << " t " << t << " r " << r;
        }
      }
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double b = 0, mag = 0;
        for (int64_t k = 0; k < cols; ++k) {
          b += 0.5 * matmul_q8::x_scale(xq, t, k) * std::fabs(deq[r * cols + k]);
          mag += std::fabs(double(deq[r * cols + k]) * x[t * cols + k]);
        }
        const double bound = b * 1.0001 + 12 * 0x1p-23 * (mag + b) + 1e-44;
        EXPECT_NEAR(want[t * rows + r], ref[t * rows + r], bound) << "t " << t << " r " << r;
        if (r == 2) {
          EXPECT_EQ(want[t * rows + r], 0.0f);
        }
      }
    }
  }
}

// int4: the scale maps the group's weight of largest magnitude to -8 (the first, on a tie of
// magnitudes), the others rounded to nearest even and clamped to [-8, 7].
TEST(QuantizeTest, Int4RowMapsTheExtremeToMinus8) {
  std::vector<float> row(70, 0.0f);
  row[0] = -2.0f;     // the extreme, first of two: -8 (d = 0.25)
  row[1] = 2.0f;      // +8 → clamped to 7
  row[2] = 0.375f;    // 1.5 → 2 (to even)
  row[3] = 0.125f;    // 0.5 → 0 (to even)
  row[4] = -0.875f;   // -3.5 → -4 (to even)
  row[5] = 1.875f;    // 7.5 → 8 (to even) → 7
  row[6] = -1.625f;   // -6.5 → -6 (to even)
  row[32] = 0.5f;     // group 1: a positive extreme, d = -0.0625
  row[33] = -0.25f;   // 4
  row[64] = -1e-30f;  // group 2: a tiny extreme, still exact
  std::vector<int8_t> q(q8_ld(70), 99);
  std::vector<float> scales(q8_ld(70) / kQ8Group, 99.0f);
  quantize_row_q4(DType::kF32, row.data(), 70, q.data(), scales.data());
  EXPECT_EQ(scales[0], 0.25f);
  EXPECT_EQ(scales[1], -0.0625f);
  EXPECT_EQ(scales[2], 1e-30f / 8.0f);
  EXPECT_EQ(scales[3], 0.0f);
  const std::vector<int> want = {-8, 7, 2, 0, -4, 7, -6};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(q[k], want[k]) << k;
  EXPECT_EQ(q[32], -8);
  EXPECT_EQ(q[33], 4);
  EXPECT_EQ(q[64], -8);
  for (size_t k = 7; k < q.size(); ++k) {
    if (k != 32 && k != 33 && k != 64) {
      EXPECT_EQ(q[k], 0) << k;
    }
  }
}

TEST(QuantizeTest, XIsWithinHalfAStepOfItsGroupAndPaddedWithZeros) {
  std::mt19937 rng(3);
  const int64_t cols = 100, n_tokens = 3;
  std::vector<float> x = grouped_values(rng, n_tokens, cols, false);
  matmul_q8::Buffer buf;
  const Q8Rows q = matmul_q8::quantize_x(x.data(), cols, n_tokens, buf);
  ASSERT_EQ(q.ld, 128);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < q.ld; ++i) {
      const double step = matmul_q8::x_scale(q, t, i);
      const double want = i < cols ? x[t * cols + i] : 0.0;
      EXPECT_LE(std::fabs(x_value(q, t, i) - want), 0.5 * step * 1.0001) << t << " " << i;
      if (i >= cols) {
        EXPECT_EQ(matmul_q8::x_value(q, t, i), 0);
      }
    }
  }
}

// x quantized by the AVX-512 loops gives the scalar loops' bits: values, scales and the
// corrections, on ragged widths (part of a group, of 16 values), ties (x · (1 / d) = k + 0.5),
// zero groups and extreme magnitudes.
TEST(QuantizeTest, XQuantizationIsTheSameOnEveryKernel) {
  std::mt19937 rng(13);
  for (int64_t cols : {1, 15, 16, 17, 32, 40, 100, 300}) {
    const int64_t n_tokens = 4;
    std::vector<float> x = grouped_values(rng, n_tokens, cols, true);
    for (int64_t i = 0; i < cols; i += 3) x[i] = float(i % 7) - 3.5f;  // halves, first token
    matmul_q8::Buffer ref_buf;
    const Q8Rows ref = matmul_q8::quantize_x(x.data(), cols, n_tokens, ref_buf);
    for (Kernel k : matmul_q8::simd_kernels()) {
      matmul_q8::Buffer buf;
      const Q8Rows got = matmul_q8::quantize_x(x.data(), cols, n_tokens, buf, k);
      EXPECT_EQ(buf.q, ref_buf.q) << matmul_q8::kernel_name(k) << " cols " << cols;
      EXPECT_EQ(buf.scales, ref_buf.scales) << matmul_q8::kernel_name(k) << " cols " << cols;
      EXPECT_EQ(buf.corr, ref_buf.corr) << matmul_q8::kernel_name(k) << " cols " << cols;
      EXPECT_EQ(got.ld, ref.ld);
    }
  }
}

// Every SIMD kernel against the scalar one, on the same quantized x, to kernel_tolerance: ragged
// column counts (part of a group, of a 64-byte chunk), every token block size, row counts that
// leave a remainder of the 4-row block, groups of extreme and zero scale.
TEST_P(QuantizedKernelTest, SimdKernelsMatchScalar) {
  std::mt19937 rng(42);
  for (bool extreme : {false, true}) {
    for (int64_t cols : {32, 40, 64, 96, 100, 160, 1003}) {
      for (int64_t rows : {1, 4, 5, 13}) {
        QuantizedMatrix q = quantize(grouped_values(rng, rows, cols, extreme), rows, cols);
        const Matrix& w = q.view();
        for (int64_t n_tokens : {1, 2, 3, 4, 5, 9, 17, 130}) {
          if (n_tokens == 130 && cols != 160 && cols != 1003) continue;
          std::vector<float> x = grouped_values(rng, n_tokens, cols, extreme);
          matmul_q8::Buffer buf;
          const Q8Rows xq = matmul_q8::quantize_x(x.data(), cols, n_tokens, buf);
          std::vector<float> want(static_cast<size_t>(n_tokens * rows));
          matmul_q8::rows_with(Kernel::kScalar, w, xq, n_tokens, want.data(), rows, 0, rows);
          for (Kernel k : matmul_q8::simd_kernels()) {
            std::vector<float> got(want.size(), std::nanf(""));
            matmul_q8::rows_with(k, w, xq, n_tokens, got.data(), rows, 0, rows);
            for (int64_t t = 0; t < n_tokens; ++t) {
              for (int64_t r = 0; r < rows; ++r) {
                ASSERT_NEAR(got[t * rows + r], want[t * rows + r], kernel_tolerance(w, xq, t, r))
                    << matmul_q8::kernel_name(k) << " cols " << cols << " rows " << rows
                    << " n_tokens " << n_tokens << " t " << t << " r " << r
                    << (extreme ? " extreme" : "");
              }
            }
          }
        }
      }
    }
  }
}

// AVX-VNNI's kernel, as VEX vpdpbusd where the CPU has AVX-VNNI and in its EVEX form where it has
// AVX-512 VNNI (SimdKernelsMatchScalar runs both too): its integer sums are exact, as AVX2's, and
// it scales and sums them as AVX2's kernel does, so its products are AVX2's bit for bit. matmul
// picks the VEX form on the avx2 path where the CPU runs it, never the EVEX one.
TEST_P(QuantizedKernelTest, Avx2VnniKernelsGiveAvx2sBits) {
  const bool vex = matmul_q8::kernel_supported(Kernel::kAvx2Vnni);
  EXPECT_EQ(matmul_q8::kernel_for(Isa::kAvx2), vex ? Kernel::kAvx2Vnni : Kernel::kAvx2);
  std::vector<Kernel> kernels;
  for (Kernel k : {Kernel::kAvx2Vnni, Kernel::kAvx2VnniEvex}) {
    if (matmul_q8::kernel_supported(k)) kernels.push_back(k);
  }
  if (kernels.empty()) {
    GTEST_SKIP() << "this CPU has neither AVX-VNNI nor AVX-512 VNNI: the avx2vnni kernel is not "
                    "run here";
  }
  std::mt19937 rng(31);
  for (bool extreme : {false, true}) {
    for (int64_t cols : {32, 100, 160, 1003}) {
      for (int64_t rows : {1, 5, 13}) {
        QuantizedMatrix q = quantize(grouped_values(rng, rows, cols, extreme), rows, cols);
        for (int64_t n_tokens : {1, 2, 3, 4, 5, 9}) {
          std::vector<float> x = grouped_values(rng, n_tokens, cols, extreme);
          matmul_q8::Buffer buf;
          const Q8Rows xq = matmul_q8::quantize_x(x.data(), cols, n_tokens, buf);
          std::vector<float> want(static_cast<size_t>(n_tokens * rows));
          matmul_q8::rows_with(Kernel::kAvx2, q.view(), xq, n_tokens, want.data(), rows, 0, rows);
          for (Kernel k : kernels) {
            std::vector<float> got(want.size(), std::nanf(""));
            matmul_q8::rows_with(k, q.view(), xq, n_tokens, got.data(), rows, 0, rows);
            ASSERT_EQ(got, want) << matmul_q8::kernel_name(k) << " cols " << cols << " rows "
                                 << rows << " n_tokens " << n_tokens << (extreme ? " extreme" : "");
          }
        }
      }
    }
  }
  // Shared out over a pool, x quantized inside, as matmul runs it.
  ThreadPool pool(3);
  const int64_t rows = 300, cols = 1003, n_tokens = 33;
  QuantizedMatrix q = quantize(grouped_values(rng, rows, cols, false), rows, cols);
  std::vector<float> x = grouped_values(rng, n_tokens, cols, false);
  std::vector<float> want(static_cast<size_t>(n_tokens * rows));
  matmul_q8::matmul_with(Kernel::kAvx2, pool, q.view(), x.data(), n_tokens, want.data());
  for (Kernel k : kernels) {
    std::vector<float> got(want.size(), std::nanf(""));
    matmul_q8::matmul_with(k, pool, q.view(), x.data(), n_tokens, got.data());
    EXPECT_EQ(got, want) << matmul_q8::kernel_name(k) << " pooled";
  }
}

// Row ranges that start and end inside blocks of 4 rows, written at a stride wider than the
// range: each kernel writes exactly the range's rows, as the scalar one computes them.
TEST_P(QuantizedKernelTest, RowRangesWriteOnlyTheirRows) {
  std::mt19937 rng(9);
  const int64_t rows = 23, cols = 200, ldy = 24;
  QuantizedMatrix q = quantize(grouped_values(rng, rows, cols, false), rows, cols);
  for (int64_t n_tokens : {1, 5}) {
    std::vector<float> x = grouped_values(rng, n_tokens, cols, false);
    matmul_q8::Buffer buf;
    const Q8Rows xq = matmul_q8::quantize_x(x.data(), cols, n_tokens, buf);
    std::vector<float> all(n_tokens * rows);
    matmul_q8::rows_with(Kernel::kScalar, q.view(), xq, n_tokens, all.data(), rows, 0, rows);
    for (auto [r_begin, r_end] : {std::pair<int64_t, int64_t>{1, 3}, {3, 9}, {5, 23}, {8, 12}}) {
      for (Kernel k : matmul_q8::simd_kernels()) {
        std::vector<float> got(n_tokens * ldy, 12345.0f);
        matmul_q8::rows_with(k, q.view(), xq, n_tokens, got.data(), ldy, r_begin, r_end);
        for (int64_t t = 0; t < n_tokens; ++t) {
          for (int64_t i = 0; i < ldy; ++i) {
            const float v = got[t * ldy + i];
            if (i < r_end - r_begin) {
              EXPECT_NEAR(v, all[t * rows + r_begin + i],
                          kernel_tolerance(q.view(), xq, t, r_begin + i))
                  << matmul_q8::kernel_name(k) << " [" << r_begin << ", " << r_end << ") t " << t;
            } else {
              EXPECT_EQ(v, 12345.0f) << matmul_q8::kernel_name(k) << " wrote past the range";
            }
          }
        }
      }
    }
  }
}

// A token's products are the same bits alone and in a batch of any size, on every kernel and
// through matmul() on every instruction set: each accumulator sums in the same order whatever the
// token block, and x is quantized per token (so --batch-invariant needs nothing more of int8).
TEST_P(QuantizedKernelTest, ProductsAreBatchInvariant) {
  ThreadPool pool(2);
  std::mt19937 rng(21);
  const int64_t rows = 70, cols = 300, n_tokens = 11;
  QuantizedMatrix q = quantize(grouped_values(rng, rows, cols, false), rows, cols);
  std::vector<float> x = grouped_values(rng, n_tokens, cols, false);
  for (Isa isa : all_isas()) {
    std::vector<float> batch(n_tokens * rows), alone(rows);
    matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, q.view(), x.data(), n_tokens,
                             batch.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, q.view(), x.data() + t * cols,
                               1, alone.data());
      EXPECT_EQ(alone, std::vector<float>(batch.begin() + t * rows, batch.begin() + (t + 1) * rows))
          << simd::isa_name(isa) << " token " << t;
    }
  }
}

// matmul() with int8 weights against the f32 product with the dequantized matrix: they differ
// by the rounding of x to int8, at most half of x's step in each group times Σ |w| there, plus
// f32 rounding. Through matmul_with on every instruction set (pool and calling thread), and
// matmul_scalar.
TEST_P(QuantizedKernelTest, ProductIsTheDequantizedProductUpToTheRoundingOfX) {
  ThreadPool pool(3);
  std::mt19937 rng(7);
  for (int64_t cols : {40, 96, 1003}) {
    for (int64_t rows : {3, 300}) {
      QuantizedMatrix q = quantize(grouped_values(rng, rows, cols, false), rows, cols);
      const std::vector<float> deq = dequantize_int(q.view());
      for (int64_t n_tokens : {1, 6, 33}) {
        std::vector<float> x = grouped_values(rng, n_tokens, cols, false);
        std::vector<float> ref(static_cast<size_t>(n_tokens * rows));
        matmul_scalar(f32_matrix(deq, rows, cols), x.data(), n_tokens, ref.data());
        matmul_q8::Buffer buf;
        const Q8Rows xq = matmul_q8::quantize_x(x.data(), cols, n_tokens, buf);
        std::vector<double> bound(ref.size());
        for (int64_t t = 0; t < n_tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            double b = 0, mag = 0;
            for (int64_t k = 0; k < cols; ++k) {
              const double step = matmul_q8::x_scale(xq, t, k);
              b += 0.5 * step * std::fabs(deq[r * cols + k]);
              mag += std::fabs(deq[r * cols + k] * x[t * cols + k]);
            }
            bound[t * rows + r] = b * 1.0001 + (cols / 32 + 8) * 0x1p-23 * (mag + b) + 1e-30;
          }
        }
        std::vector<float> scalar(ref.size());
        matmul_scalar(q.view(), x.data(), n_tokens, scalar.data());
        std::vector<std::pair<std::string, std::vector<float>>> results = {{"scalar", scalar}};
        for (Isa isa : all_isas()) {
          std::vector<float> got(ref.size(), std::nanf(""));
          matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, q.view(), x.data(),
                                   n_tokens, got.data());
          results.emplace_back(simd::isa_name(isa), got);
        }
        for (const auto& [name, got] : results) {
          for (size_t i = 0; i < ref.size(); ++i) {
            ASSERT_NEAR(got[i], ref[i], bound[i]) << name << " cols " << cols << " rows " << rows
                                                  << " n_tokens " << n_tokens << " at " << i;
          }
        }
      }
    }
  }
}

TEST_P(QuantizedKernelTest, ZeroWeightsOrZeroXGiveExactZeros) {
  ThreadPool pool(2);
  const int64_t rows = 6, cols = 96, n_tokens = 5;
  std::vector<float> zeros(rows * cols, 0.0f);
  std::mt19937 rng(1);
  std::vector<float> x = grouped_values(rng, n_tokens, cols, false);
  QuantizedMatrix zq = quantize(zeros, rows, cols);
  QuantizedMatrix q = quantize(grouped_values(rng, rows, cols, false), rows, cols);
  std::vector<float> x0(n_tokens * cols, 0.0f);
  for (Isa isa : all_isas()) {
    std::vector<float> y(rows * n_tokens, 1.0f);
    matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, zq.view(), x.data(), n_tokens,
                             y.data());
    EXPECT_EQ(y, std::vector<float>(y.size(), 0.0f)) << simd::isa_name(isa);
    std::fill(y.begin(), y.end(), 1.0f);
    matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, q.view(), x0.data(), n_tokens,
                             y.data());
    EXPECT_EQ(y, std::vector<float>(y.size(), 0.0f)) << simd::isa_name(isa);
  }
}

// The grouped products (MoE experts) on int8 weights: gathered rows of x, a row range per task,
// the gated pair and the scatter into output rows, each as matmul_scalar on the same weights.
TEST_P(QuantizedKernelTest, GroupedProductsMatchScalar) {
  ThreadPool pool(3);
  std::mt19937 rng(11);
  const int64_t n_embd = 96, n_ff = 160, n_tokens = 7;
  std::vector<QuantizedMatrix> gate, up, down;
  for (int e = 0; e < 2; ++e) {
    gate.push_back(quantize(grouped_values(rng, n_ff, n_embd, false), n_ff, n_embd));
    up.push_back(quantize(grouped_values(rng, n_ff, n_embd, false), n_ff, n_embd));
    down.push_back(quantize(grouped_values(rng, n_embd, n_ff, false), n_embd, n_ff));
  }
  std::vector<float> x = grouped_values(rng, n_tokens, n_embd, false);
  std::vector<const float*> gathered;  // tokens in reverse order
  for (int64_t t = n_tokens - 1; t >= 0; --t) gathered.push_back(x.data() + t * n_embd);
  std::vector<float> x_rev;
  for (const float* row : gathered) x_rev.insert(x_rev.end(), row, row + n_embd);

  for (Isa isa : all_isas()) {
    const std::string what = simd::isa_name(isa);
    // matmul_grouped: expert e's gate on the gathered rows.
    std::vector<std::vector<float>> y(2, std::vector<float>(n_tokens * n_ff));
    std::vector<MatmulGroup> groups;
    for (int e = 0; e < 2; ++e)
      groups.push_back({gate[e].view(), XRows(gathered.data()), n_tokens, y[e].data()});
    grouped_impl::matmul_grouped_with(isa, pool, groups);
    for (int e = 0; e < 2; ++e) {
      std::vector<float> want(y[e].size());
      matmul_scalar(gate[e].view(), x_rev.data(), n_tokens, want.data());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(y[e][i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << what << " grouped";
    }
    // gated: silu(gate) * up.
    std::vector<float> act(n_tokens * n_ff);
    grouped_impl::gated_matmul_grouped_with(
        isa, pool, {GatedGroup{gate[0].view(), up[0].view(), x.data(), n_tokens, act.data()}});
    std::vector<float> g(n_tokens * n_ff), u(n_tokens * n_ff);
    matmul_scalar(gate[0].view(), x.data(), n_tokens, g.data());
    matmul_scalar(up[0].view(), x.data(), n_tokens, u.data());
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = g[i] / (1 + std::exp(-double(g[i]))) * u[i];
      ASSERT_NEAR(act[i], want, 1e-4 * (1 + std::fabs(want))) << what << " gated at " << i;
    }
    // scatter: rows of both experts into two output rows with weights.
    std::vector<float> out(2 * n_embd, 5.0f);
    float* rows_out[2] = {out.data(), out.data() + n_embd};
    const float weights[2] = {0.25f, -2.0f};
    std::vector<float> a = grouped_values(rng, 2, n_ff, false);
    grouped_impl::matmul_grouped_scatter_with(
        isa, pool,
        {ScatterGroup{down[0].view(), a.data(), 1, rows_out, weights},
         ScatterGroup{down[1].view(), a.data() + n_ff, 1, rows_out + 1, weights + 1}},
        {out.data(), out.data() + n_embd});
    for (int e = 0; e < 2; ++e) {
      std::vector<float> want(n_embd);
      matmul_scalar(down[e].view(), a.data() + e * n_ff, 1, want.data());
      for (int64_t i = 0; i < n_embd; ++i) {
        ASSERT_NEAR(out[e * n_embd + i], weights[e] * want[i], 1e-4 * (1 + std::fabs(want[i])))
            << what << " scatter";
      }
    }
  }
}

TEST_P(QuantizedKernelTest, RefusesWhatHasNoKernel) {
  ThreadPool pool(1);
  std::vector<float> w(4 * 32, 1.0f), x(4 * 32, 1.0f), y(4 * 32);
  QuantizedMatrix q = quantize(w, 4, 32);
  EXPECT_THROW(matmul_xw(pool, q.view(), x.data(), 1, y.data()), Error);
  EXPECT_THROW(matmul_xw_scalar(q.view(), x.data(), 1, y.data()), Error);
  std::vector<int8_t> dst(64 * 32);
  EXPECT_THROW(pack_panels(q.view(), dst.data()), Error);
  EXPECT_FALSE(matmul_reads_panels(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedKernelTest, ::testing::Values(DType::kQ8, DType::kQ4),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace duet
