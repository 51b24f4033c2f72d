#include "kernels/matmul_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/fp8_rows.h"
#include "kernels/grouped_matmul.h"
#include "kernels/grouped_matmul_impl.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

using simd::Isa;

// Relative to Σ|w||x| of an output: f32 sums of a few hundred terms in any order stay well inside.
constexpr double kRelTol = 1e-5;

// fp8 weights and their block scales, with their storage.
struct Fp8Weights {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Matrix m;
};

struct Shape {
  int64_t rows, cols, block_rows, block_cols;
};

// Random codes (E4M3's NaN codes 0x7f and 0xff apart) and scales of magnitudes 10^±scale_decades.
Fp8Weights random_fp8(std::mt19937& rng, const Shape& s, double scale_decades = 1.0) {
  Fp8Weights w;
  w.codes.resize(static_cast<size_t>(s.rows * s.cols));
  std::uniform_int_distribution<int> code(0, 255);
  for (uint8_t& c : w.codes) {
    do c = static_cast<uint8_t>(code(rng));
    while ((c & 0x7f) == 0x7f);
  }
  const int64_t sr = (s.rows + s.block_rows - 1) / s.block_rows;
  const int64_t sc = (s.cols + s.block_cols - 1) / s.block_cols;
  std::uniform_real_distribution<double> decade(-scale_decades, scale_decades);
  w.scales.resize(static_cast<size_t>(sr * sc));
  for (float& v : w.scales) v = static_cast<float>(std::pow(10.0, decade(rng)) / 448.0);
  w.m = Matrix{DType::kF8E4M3, s.rows, s.cols, w.codes.data()};
  w.m.f8 = {w.scales.data(), s.block_rows, s.block_cols, 0};
  return w;
}

// Rows of three kinds, for the kernels that widen a group of 32 or 64 codes one way when all are
// normal and another when one has exponent 0: all 254 non-NaN codes (every group has codes of
// exponent 0), the normal codes alone, and 64-column steps of exponent-0 codes (zeros,
// subnormals) alternating with steps of exponent-1 codes, of like magnitudes (so that a
// subnormal read as a normal value moves the sum past expect_close's bound).
void fill_code_kinds(Fp8Weights& w, const Shape& s) {
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) {
      uint8_t code = 0;
      if (r % 3 == 0) {
        const int64_t k = (c + 17 * r) % 254;  // codes 0..126 and 128..254
        code = static_cast<uint8_t>(k < 127 ? k : k + 1);
      } else if (r % 3 == 1) {
        const int64_t k = (c + 17 * r) % 238;  // exponents 1..15: codes 8..126 and 136..254
        code = static_cast<uint8_t>(k < 119 ? 8 + k : 136 + k - 119);
      } else {
        const int64_t k = (c + 5 * r) % 16;  // a sign bit and 3 mantissa bits
        const int64_t e = (c / 64) % 2;      // exponent 0 or 1 for the whole step
        code = static_cast<uint8_t>((k / 8) * 0x80 + e * 8 + k % 8);
      }
      w.codes[r * s.cols + c] = code;
    }
}

std::vector<float> random_x(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = normal(rng);
  return v;
}

std::vector<float> dequantized(const Matrix& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  dequantize_fp8(w, out.data());
  return out;
}

// Σ|w||x| per output [n_tokens, w.rows], in double.
std::vector<double> abs_product(const Matrix& w, const std::vector<float>& x, int64_t n_tokens) {
  const std::vector<float> wd = dequantized(w);
  std::vector<double> out(static_cast<size_t>(n_tokens * w.rows));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      double a = 0;
      for (int64_t c = 0; c < w.cols; ++c)
        a += std::fabs(double(wd[r * w.cols + c]) * x[t * w.cols + c]);
      out[t * w.rows + r] = a;
    }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), kRelTol * bound[i] + 1e-30)
        << what << " at " << i << ": " << got[i] << " vs " << want[i];
  }
}

// x as isa's kernels multiply it by fp8 weights: rounded to bf16 where matmul_impl::rounds_x
// (AVX-512 BF16 and its emulation, for every token count), else as it is.
std::vector<float> as_multiplied(Isa isa, const std::vector<float>& x, int64_t /*n_tokens*/) {
  if (!matmul_impl::rounds_x(isa, DType::kF8E4M3)) return x;
  std::vector<float> r(x.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return r;
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa :
       {Isa::kAvx512Bf16, Isa::kAvx512Bf16Emulated, Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (simd::isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// The AVX-512 kernels widen each code through an f16: exact for all 256 codes, signed zero and
// subnormals included.
TEST(MatmulFp8Test, WideningIsExactForEveryCode) {
  if (!simd::isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512";
  for (int c0 = 0; c0 < 256; c0 += 16) {
    uint8_t codes[16];
    float got[16];
    for (int i = 0; i < 16; ++i) codes[i] = static_cast<uint8_t>(c0 + i);
    fp8_impl::e4m3_values_over_256(codes, got);
    for (int i = 0; i < 16; ++i) {
      const float want = e4m3_to_f32(codes[i]);
      const float g = got[i] * 256.0f;
      EXPECT_EQ(std::memcmp(&g, &want, 4), 0) << "code " << c0 + i << ": " << g << " vs " << want;
    }
  }
}

// The one-token kernels on AVX-512 BF16 widen each code by shifting its bits into an f32's: exact
// for every code but E4M3's NaNs, subnormals (f32 subnormals then) and signed zero included.
TEST(MatmulFp8Test, ShiftWideningIsExactForEveryCode) {
  if (!simd::isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512";
  for (int c0 = 0; c0 < 256; c0 += 16) {
    uint8_t codes[16];
    float got[16];
    for (int i = 0; i < 16; ++i) codes[i] = static_cast<uint8_t>(c0 + i);
    fp8_impl::e4m3_values_over_2_120(codes, got);
    for (int i = 0; i < 16; ++i) {
      if ((codes[i] & 0x7f) == 0x7f) continue;
      const double want = double(e4m3_to_f32(codes[i])) * 0x1p-120;
      EXPECT_EQ(double(got[i]), want) << "code " << c0 + i;
      EXPECT_EQ(std::signbit(got[i]), (codes[i] & 0x80) != 0) << "code " << c0 + i;
    }
  }
}

// Activations from 1e-12 to 1e12 (the shift widening multiplies x by 2^64 and sums the products as
// the true ones × 2^-56): as the dequantized product, on every instruction set, 1 to 5 tokens.
TEST(MatmulFp8Test, TinyAndHugeActivations) {
  std::mt19937 rng(18);
  ThreadPool pool(2);
  const Fp8Weights w = random_fp8(rng, {24, 256, 128, 128}, 3.0);
  const std::vector<float> wd = dequantized(w.m);
  const Matrix wf{DType::kF32, 24, 256, wd.data()};
  for (double magnitude : {1e-12, 1e-6, 1e6, 1e12}) {
    for (int64_t n : {1, 2, 5}) {
      std::vector<float> x = random_x(rng, n * 256);
      for (float& v : x) v = static_cast<float>(v * magnitude);
      std::vector<float> want(static_cast<size_t>(n * 24)), got(want.size());
      for (Isa isa : isas()) {
        const std::vector<float> xm = as_multiplied(isa, x, n);
        matmul_scalar(wf, xm.data(), n, want.data());
        matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, w.m, x.data(), n, got.data());
        expect_close(got, want, abs_product(w.m, xm, n),
                     std::string(simd::isa_name(isa)) + " |x| ~ " + std::to_string(magnitude));
      }
    }
  }
}

// matmul() on every instruction set, the AVX-512 row kernel and the scalar one against the plain
// product with the dequantized f32 matrix: ragged rows and columns, blocks of several sizes
// (blocks of 16 and 48 columns end inside a vector of bf16 pairs), 1 to 100 tokens. On AVX-512
// BF16 and its emulation against the product on x rounded to bf16 (as bf16 weights multiply it):
// the codes' values are widened exactly, so the result is that product up to f32 sums.
TEST(MatmulFp8Test, MatchesTheDequantizedProduct) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const Shape shapes[] = {{1, 16, 128, 128},    {5, 130, 128, 128}, {37, 300, 128, 128},
                          {130, 257, 128, 128}, {64, 96, 16, 32},   {9, 50, 1, 16},
                          {21, 200, 16, 48},    {6, 1000, 128, 128}};
  for (const Shape& s : shapes) {
    const Fp8Weights w = random_fp8(rng, s);
    const std::vector<float> wd = dequantized(w.m);
    const Matrix wf{DType::kF32, s.rows, s.cols, wd.data()};
    for (int64_t n : {1, 2, 3, 4, 7, 8, 33, 100}) {
      const std::vector<float> x = random_x(rng, n * s.cols);
      std::vector<float> want(static_cast<size_t>(n * s.rows));
      matmul_scalar(wf, x.data(), n, want.data());
      const std::vector<double> bound = abs_product(w.m, x, n);
      const std::string at = "[" + std::to_string(s.rows) + ", " + std::to_string(s.cols) +
                             "] blocks " + std::to_string(s.block_rows) + "x" +
                             std::to_string(s.block_cols) + ", " + std::to_string(n) + " tokens";
      std::vector<float> got(want.size());
      matmul_scalar(w.m, x.data(), n, got.data());
      expect_close(got, want, bound, "scalar " + at);
      for (Isa isa : isas()) {
        const std::vector<float> xm = as_multiplied(isa, x, n);
        std::vector<float> want_m = want;
        if (xm != x) matmul_scalar(wf, xm.data(), n, want_m.data());
        std::fill(got.begin(), got.end(), -1.0f);
        matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, w.m, x.data(), n, got.data());
        expect_close(got, want_m, xm != x ? abs_product(w.m, xm, n) : bound,
                     std::string(simd::isa_name(isa)) + " " + at);
      }
    }
  }
}

// From kWidenOnceTokens tokens on rows are widened once and multiplied in f32; batch-invariant
// products never take that turn, so a row's result is the same bit for bit alone and in a batch.
TEST(MatmulFp8Test, BatchInvariantProductsDoNotDependOnTheTokenCount) {
  std::mt19937 rng(16);
  ThreadPool pool(2);
  const Fp8Weights w = random_fp8(rng, {200, 300, 128, 128});
  const std::vector<float> x = random_x(rng, 40 * 300);
  std::vector<float> one(200), many(40 * 200);
  set_matmul_batch_invariant(true);
  for (Isa isa : isas()) {
    matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, w.m, x.data(), 1, one.data());
    matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, w.m, x.data(), 40, many.data());
    for (int64_t r = 0; r < 200; ++r)
      ASSERT_EQ(one[r], many[r]) << simd::isa_name(isa) << " row " << r;
  }
  set_matmul_batch_invariant(false);
}

// The bf16-pair kernels on vdpbf16ps give their emulation's bits (the data has no denormals), so
// the suite's runs on the emulation vouch for CPUs with the instruction; and they round x (the
// AVX-512 kernels' product on x as it is differs).
TEST(MatmulFp8Test, PairKernelsEqualTheirEmulation) {
  if (!simd::isa_supported(Isa::kAvx512Bf16)) GTEST_SKIP() << "no AVX-512 BF16";
  std::mt19937 rng(17);
  ThreadPool pool(2);
  const Fp8Weights w = random_fp8(rng, {70, 400, 32, 48});
  for (int64_t n : {8, 9, 64}) {
    const std::vector<float> x = random_x(rng, n * 400);
    std::vector<float> native(static_cast<size_t>(n * 70)), emulated(native.size()),
        f32(native.size());
    matmul_impl::matmul_with(Isa::kAvx512Bf16, matmul_impl::Path::kAuto, pool, w.m, x.data(), n,
                             native.data());
    matmul_impl::matmul_with(Isa::kAvx512Bf16Emulated, matmul_impl::Path::kAuto, pool, w.m,
                             x.data(), n, emulated.data());
    matmul_impl::matmul_with(Isa::kAvx512, matmul_impl::Path::kAuto, pool, w.m, x.data(), n,
                             f32.data());
    EXPECT_EQ(native, emulated) << n << " tokens";
    EXPECT_NE(native, f32) << n << " tokens";
  }
}

// From 8 tokens on, on AVX-512 (emulating the bf16 pairs) and, where the CPU has it, AVX-512
// BF16: rows widened by shifts (groups of 32 normal codes) and through f32 (groups holding a
// zero or subnormal, and rows' last partial groups) give the dequantized product on the rounded
// x, for rows of fill_code_kinds' three kinds.
TEST(MatmulFp8Test, PairKernelsWidenEveryCode) {
  std::mt19937 rng(23);
  ThreadPool pool(2);
  for (const Shape& s : {Shape{7, 1000, 128, 128}, Shape{9, 200, 16, 64}}) {
    Fp8Weights w = random_fp8(rng, s, 30.0);
    fill_code_kinds(w, s);
    for (int64_t n : {8, 33}) {
      const std::vector<float> x = random_x(rng, n * s.cols);
      for (Isa isa : {Isa::kAvx512Bf16Emulated, Isa::kAvx512Bf16}) {
        if (!simd::isa_supported(isa)) continue;
        const std::vector<float> xm = as_multiplied(isa, x, n);
        const std::vector<float> wd = dequantized(w.m);
        std::vector<float> want(static_cast<size_t>(n * s.rows)), got(want.size(), -1.0f);
        matmul_scalar(Matrix{DType::kF32, s.rows, s.cols, wd.data()}, xm.data(), n, want.data());
        matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, w.m, x.data(), n, got.data());
        expect_close(got, want, abs_product(w.m, xm, n),
                     std::string(simd::isa_name(isa)) + " " + std::to_string(s.cols) + " cols, " +
                         std::to_string(n) + " tokens");
      }
    }
  }
}

// Below the pairs' token count where the look-ups do not serve (and while batch-invariant),
// direct_x widens the rounded x once per product (x.widened = each rounded value × 2^64, at the
// rounded rows' stride), and the row kernels give the same bits from it as from x itself, which
// they round and widen per call; where the look-ups serve, it does not widen.
TEST(MatmulFp8Test, DirectXWidensOncePerProductBelowThePairs) {
  std::mt19937 rng(18);
  const int64_t rows = 40, cols = 300;
  const Fp8Weights w = random_fp8(rng, {rows, cols, 128, 128});
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512Bf16Emulated}) {
    if (!simd::isa_supported(isa)) continue;
    for (bool invariant : {false, true}) {
      set_matmul_batch_invariant(invariant);
      for (int64_t n : {int64_t{1}, int64_t{3}, matmul_impl::kFp8PairsMinTokens - 1,
                        matmul_impl::kFp8PairsMinTokens}) {
        const std::string what = std::string(simd::isa_name(isa)) +
                                 (invariant ? " invariant " : " ") + std::to_string(n) + " tokens";
        const std::vector<float> x = random_x(rng, n * cols);
        matmul_impl::XBuffer buf;
        const XRows d = matmul_impl::direct_x(isa, w.m, x.data(), n, buf);
        ASSERT_NE(d.bf16, nullptr) << what;
        ASSERT_EQ(d.widened != nullptr, matmul_impl::fp8_reads_widened(isa, w.m, n)) << what;
        if (d.widened) {
          EXPECT_EQ(reinterpret_cast<uintptr_t>(d.widened) % 64, 0u) << what;
          for (int64_t t = 0; t < n; ++t)
            for (int64_t c = 0; c < cols; ++c)
              ASSERT_EQ(d.widened[t * d.ld + c], bf16_to_f32(d.bf16[t * d.ld + c]) * 0x1p64f)
                  << what << " token " << t << " column " << c;
        }
        std::vector<float> from_direct(static_cast<size_t>(n * rows)), from_x(from_direct.size());
        matmul_impl::matmul_rows_with(isa, matmul_impl::Path::kAuto, w.m, d, n, from_direct.data(),
                                      rows, 0, rows);
        matmul_impl::matmul_rows_with(isa, matmul_impl::Path::kAuto, w.m, x.data(), n,
                                      from_x.data(), rows, 0, rows);
        EXPECT_EQ(from_direct, from_x) << what;
      }
    }
  }
  set_matmul_batch_invariant(false);
}

// Below the pairs' token count on a CPU with AVX-512 BF16 and VBMI: the few-token kernel takes
// every code, ragged row ends (masked 64-code steps), rows not a multiple of its tiles, row
// ranges, 1 to 7 tokens (blocks of up to 3), 64-column blocks and scales from 1e-30 to 1e30, as
// the dequantized product on the rounded x; matmul() below 8 tokens gives its bits (the
// dispatch), and blocks not whole multiples of 64 columns are not its. Rows of fill_code_kinds'
// three kinds, so that each way of widening a step (the look-ups, the shifts) is taken and would
// be seen wrong.
TEST(MatmulFp8Test, LookUpKernelTakesFewTokensForEveryCode) {
  if (!fp8_impl::lut_supported()) GTEST_SKIP() << "no AVX-512 BF16 and VBMI";
  std::mt19937 rng(19);
  ThreadPool pool(2);
  const Shape shapes[] = {
      {7, 1000, 128, 128}, {13, 320, 64, 64}, {4, 64, 128, 128}, {9, 37, 128, 128}};
  for (const Shape& s : shapes) {
    Fp8Weights w = random_fp8(rng, s, 30.0);
    fill_code_kinds(w, s);
    ASSERT_TRUE(fp8_impl::lut_applies(w.m));
    const std::vector<float> wd = dequantized(w.m);
    const Matrix wf{DType::kF32, s.rows, s.cols, wd.data()};
    for (int64_t n = 1; n < matmul_impl::kFp8PairsMinTokens; ++n) {
      const std::vector<float> x = random_x(rng, n * s.cols);
      const std::vector<float> xm = as_multiplied(Isa::kAvx512Bf16, x, n);
      std::vector<float> want(static_cast<size_t>(n * s.rows));
      matmul_scalar(wf, xm.data(), n, want.data());
      const int64_t ldx = s.cols + 3;  // rows apart by more than their length
      std::vector<uint16_t> xb(static_cast<size_t>(n * ldx), 0x7fc0);  // NaN between rows
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < s.cols; ++c) xb[t * ldx + c] = f32_to_bf16(x[t * s.cols + c]);
      const std::string at = "[" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "], " +
                             std::to_string(n) + " tokens";
      std::vector<float> got(want.size(), -1.0f);
      fp8_impl::matmul_rows_lut(w.m, xb.data(), ldx, n, got.data(), s.rows, 0, s.rows);
      expect_close(got, want, abs_product(w.m, xm, n), "look-up " + at);
      for (int64_t r0 = 1; r0 < s.rows; r0 += 3) {  // rows [r0, rows) alone
        const int64_t nr = s.rows - r0;
        std::vector<float> part(static_cast<size_t>(n * nr));
        fp8_impl::matmul_rows_lut(w.m, xb.data(), ldx, n, part.data(), nr, r0, s.rows);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = r0; r < s.rows; ++r)
            ASSERT_EQ(part[t * nr + r - r0], got[t * s.rows + r]) << at << " row " << r;
      }
      std::vector<float> via(want.size());
      matmul_impl::matmul_with(Isa::kAvx512Bf16, matmul_impl::Path::kAuto, pool, w.m, x.data(), n,
                               via.data());
      EXPECT_EQ(via, got) << at;
    }
  }
  EXPECT_FALSE(fp8_impl::lut_applies(random_fp8(rng, {8, 96, 16, 48}).m));
}

// A row slice starting inside a block (MLA's per-head slices of kv_b_proj) reads its rows' scales.
TEST(MatmulFp8Test, RowSliceInsideABlockKeepsItsScales) {
  std::mt19937 rng(12);
  ThreadPool pool(2);
  const Fp8Weights w = random_fp8(rng, {100, 64, 32, 32});
  const std::vector<float> x = random_x(rng, 3 * 64);
  const Matrix slice = w.m.row_slice(21, 40);
  for (Isa isa : isas()) {
    const std::vector<float> xm = as_multiplied(isa, x, 3);
    std::vector<float> full(3 * 100);
    matmul_scalar(w.m, xm.data(), 3, full.data());
    std::vector<float> got(3 * 40);
    matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, slice, x.data(), 3, got.data());
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t r = 0; r < 40; ++r)
        EXPECT_NEAR(got[t * 40 + r], full[t * 100 + 21 + r],
                    1e-5 * (1 + std::fabs(full[t * 100 + 21 + r])))
            << simd::isa_name(isa) << " token " << t << " row " << r;
  }
}

// All-zero blocks (zero codes, or a zero scale over codes), the largest codes (±448), and scales
// from 1e-30 to 1e30 in one matrix: finite, and as the dequantized product.
TEST(MatmulFp8Test, EdgeBlocksAndExtremeScales) {
  std::mt19937 rng(13);
  ThreadPool pool(2);
  Fp8Weights w = random_fp8(rng, {70, 200, 16, 32});
  const int64_t sc = 7;  // ceil(200 / 32)
  for (int64_t c = 0; c < 32; ++c)
    for (int64_t r = 0; r < 16; ++r) w.codes[r * 200 + c] = 0;  // block (0, 0): zero codes
  w.scales[1] = 0.0f;                                           // block (0, 1): zero scale
  for (int64_t c = 64; c < 96; ++c)
    for (int64_t r = 0; r < 16; ++r) w.codes[r * 200 + c] = (r + c) % 2 ? 0x7e : 0xfe;
  for (int64_t b = 0; b < sc; ++b) {
    w.scales[1 * sc + b] = 1e-30f;
    w.scales[2 * sc + b] = 1e30f / 448.0f;
  }
  const std::vector<float> wd = dequantized(w.m);
  const Matrix wf{DType::kF32, w.m.rows, w.m.cols, wd.data()};
  for (int64_t n : {1, 5, 40}) {
    const std::vector<float> x = random_x(rng, n * 200);
    std::vector<float> want(static_cast<size_t>(n * 70)), got(want.size());
    for (Isa isa : isas()) {
      const std::vector<float> xm = as_multiplied(isa, x, n);
      matmul_scalar(wf, xm.data(), n, want.data());
      matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, w.m, x.data(), n, got.data());
      expect_close(got, want, abs_product(w.m, xm, n), simd::isa_name(isa));
    }
  }
}

// x · W (MLA's absorbed attention multiplies by W_UK so) from the codes in place.
TEST(MatmulFp8Test, XwMatchesTheDequantizedProduct) {
  std::mt19937 rng(14);
  ThreadPool pool(2);
  for (const Shape& s : {Shape{48, 130, 16, 32}, Shape{7, 300, 128, 128}}) {
    const Fp8Weights w = random_fp8(rng, s);
    const std::vector<float> wd = dequantized(w.m);
    const Matrix wf{DType::kF32, s.rows, s.cols, wd.data()};
    for (int64_t n : {1, 4}) {
      const std::vector<float> x = random_x(rng, n * s.rows);
      std::vector<float> want(static_cast<size_t>(n * s.cols)), got(want.size());
      matmul_xw_scalar(wf, x.data(), n, want.data());
      for (Isa isa : isas()) {
        matmul_impl::matmul_xw_with(isa, pool, w.m, x.data(), n, got.data());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
              << simd::isa_name(isa) << " at " << i;
      }
    }
  }
}

// MLA's per-head x · W_UK of an fp8 checkpoint as one job: each head as matmul_xw gives it.
TEST(MatmulFp8Test, GroupedXwEqualsEachHeadAlone) {
  std::mt19937 rng(16);
  ThreadPool pool(2);
  const Fp8Weights kv_b = random_fp8(rng, {256, 300, 128, 128});  // 4 heads of 64 rows
  for (int64_t n : {1, 4}) {
    const std::vector<float> x = random_x(rng, n * 64);
    std::vector<float> got(static_cast<size_t>(4 * n * 300)), want(got.size());
    for (Isa isa : isas()) {
      std::vector<XwGroup> heads;
      for (int64_t h = 0; h < 4; ++h)
        heads.push_back({kv_b.m.row_slice(h * 64, 64), x.data(), n, got.data() + h * n * 300});
      matmul_impl::matmul_xw_grouped_with(isa, pool, heads);
      for (int64_t h = 0; h < 4; ++h) {
        matmul_impl::matmul_xw_with(isa, pool, kv_b.m.row_slice(h * 64, 64), x.data(), n,
                                    want.data() + h * n * 300);
      }
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << simd::isa_name(isa) << " n " << n;
    }
  }
}

// The routed experts' grouped products take fp8 experts as matmul() does.
TEST(MatmulFp8Test, GroupedProductsTakeFp8Experts) {
  std::mt19937 rng(15);
  ThreadPool pool(2);
  const Fp8Weights gate = random_fp8(rng, {96, 144, 128, 128});
  const Fp8Weights up = random_fp8(rng, {96, 144, 128, 128});
  const std::vector<float> x = random_x(rng, 5 * 144);
  for (Isa isa : isas()) {
    const std::vector<float> xm = as_multiplied(isa, x, 5);
    std::vector<float> g(5 * 96), u(5 * 96);
    matmul_scalar(gate.m, xm.data(), 5, g.data());
    matmul_scalar(up.m, xm.data(), 5, u.data());
    std::vector<float> y(5 * 96), yg(5 * 96);
    grouped_impl::matmul_grouped_with(isa, pool, {MatmulGroup{gate.m, x.data(), 5, y.data()}});
    grouped_impl::gated_matmul_grouped_with(isa, pool,
                                            {GatedGroup{gate.m, up.m, x.data(), 5, yg.data()}});
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], g[i], 1e-5 * (1 + std::fabs(g[i]))) << simd::isa_name(isa);
      const float want = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      ASSERT_NEAR(yg[i], want, 1e-4 * (1 + std::fabs(want))) << simd::isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace duet
