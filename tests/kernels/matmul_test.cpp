#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

using matmul_impl::Path;
using simd::Isa;

// A weight matrix with its storage, f32 or bf16.
struct TestMatrix {
  DType dtype;
  int64_t rows;
  int64_t cols;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  Matrix view() const {
    Matrix m;
    m.dtype = dtype;
    m.rows = rows;
    m.cols = cols;
    m.data = dtype == DType::kBF16 ? static_cast<const void*>(bf16.data())
                                   : static_cast<const void*>(f32.data());
    return m;
  }

  // The same matrix with every element replaced by its magnitude.
  TestMatrix abs() const {
    TestMatrix a = *this;
    for (float& v : a.f32) v = std::fabs(v);
    for (uint16_t& v : a.bf16) v &= 0x7fff;
    return a;
  }
};

// Values of mixed magnitude (2^-20 .. 2^20), some exact zeros.
std::vector<float> random_values(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::uniform_int_distribution<int> pick(0, 15);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) {
    int p = pick(rng);
    if (p == 0) {
      f = 0.0f;
    } else if (p <= 2) {
      f = std::ldexp(normal(rng), exponent(rng));
    } else {
      f = normal(rng);
    }
  }
  return v;
}

TestMatrix random_matrix(std::mt19937& rng, DType dtype, int64_t rows, int64_t cols) {
  TestMatrix m{dtype, rows, cols, {}, {}};
  std::vector<float> v = random_values(rng, rows * cols);
  if (dtype == DType::kBF16) {
    m.bf16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) m.bf16[i] = f32_to_bf16(v[i]);
  } else {
    m.f32 = v;
  }
  return m;
}

std::vector<float> abs_values(std::vector<float> v) {
  for (float& f : v) f = std::fabs(f);
  return v;
}

std::vector<Isa> simd_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (simd::isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

const char* path_name(Path p) {
  switch (p) {
    case Path::kAuto:
      return "auto";
    case Path::kDirect:
      return "direct";
    case Path::kTiled:
      return "tiled";
  }
  return "?";
}

constexpr float kGuard = 12345.0f;
constexpr int64_t kPad = 64;  // guard elements after each output
constexpr float kRelTol = 1e-5f;

// Expects got ≈ want elementwise, within kRelTol of scale (Σ|w||x| for each output, which bounds
// the rounding error of any summation order), and the guard values past n untouched.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<float>& scale, int64_t n, const std::string& what) {
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; ++i) {
    size_t k = static_cast<size_t>(i);
    float tol = kRelTol * scale[k] + std::numeric_limits<float>::min();
    if (!(std::fabs(got[k] - want[k]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[k] << " want " << want[k]
                    << " tol " << tol;
      ++failures;
    }
  }
  for (size_t k = static_cast<size_t>(n); k < got.size(); ++k) {
    ASSERT_EQ(got[k], kGuard) << what << ": wrote past the end at " << k;
  }
}

TEST(MatmulTest, ScalarMatchesHandComputedProduct) {
  // W [2, 3], x [2 tokens, 3] → y [2, 2]
  TestMatrix w{DType::kF32, 2, 3, {1, 2, 3, -1, 0.5f, 4}, {}};
  std::vector<float> x = {1, 1, 1, 2, -1, 0.25f};
  std::vector<float> y(4);
  matmul_scalar(w.view(), x.data(), 2, y.data());
  EXPECT_EQ(y, (std::vector<float>{6, 3.5f, 0.75f, -1.5f}));

  // matmul_xw with W [2 rows, 3 cols]: x [2 tokens, 2] → y [2, 3]
  std::vector<float> x2 = {1, 2, -1, 0.5f};
  std::vector<float> y2(6);
  matmul_xw_scalar(w.view(), x2.data(), 2, y2.data());
  EXPECT_EQ(y2, (std::vector<float>{-1, 3, 11, -1.5f, -1.75f, -1}));
}

TEST(MatmulTest, ScalarBf16WidensExactly) {
  TestMatrix w{DType::kBF16, 1, 3, {}, {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f)}};
  std::vector<float> x = {2, 3, 4};
  float y = 0;
  matmul_scalar(w.view(), x.data(), 1, &y);
  EXPECT_EQ(y, 3.0f - 6.0f + 1.0f);
}

TEST(MatmulTest, IsaNameIsKnown) {
  std::string isa = matmul_isa();
  EXPECT_TRUE(isa == "avx512" || isa == "avx2" || isa == "scalar") << isa;
  EXPECT_EQ(isa, simd::isa_name(simd::best_isa()));
}

// Every SIMD path × dtype × shape against matmul_scalar.
TEST(MatmulTest, SimdMatchesScalar) {
  ThreadPool pool(3);
  std::mt19937 rng(1234);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {1, 7, 16, 17, 33, 100, 513, 1003}) {
      for (int64_t rows : {1, 5, 37}) {
        TestMatrix w = random_matrix(rng, dtype, rows, cols);
        TestMatrix w_abs = w.abs();
        for (int64_t n_tokens : {0, 1, 3, 8, 9, 31, 64, 70}) {
          // x starts one float into its buffer so rows are not 64-byte aligned.
          std::vector<float> x_buf = random_values(rng, n_tokens * cols + 1);
          const float* x = x_buf.data() + 1;
          std::vector<float> x_abs = abs_values(x_buf);
          int64_t n_out = n_tokens * rows;
          std::vector<float> want(static_cast<size_t>(n_out + kPad), kGuard);
          std::vector<float> scale(static_cast<size_t>(n_out + kPad), kGuard);
          matmul_scalar(w.view(), x, n_tokens, want.data());
          matmul_scalar(w_abs.view(), x_abs.data() + 1, n_tokens, scale.data());
          for (Isa isa : simd_isas()) {
            for (Path path : {Path::kAuto, Path::kDirect, Path::kTiled}) {
              std::string what = std::string(simd::isa_name(isa)) + " " + path_name(path) + " " +
                                 dtype_name(dtype) + " rows " + std::to_string(rows) + " cols " +
                                 std::to_string(cols) + " n_tokens " + std::to_string(n_tokens);
              std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
              std::fill(got.begin(), got.begin() + n_out, std::nanf(""));
              matmul_impl::matmul_with(isa, path, pool, w.view(), x, n_tokens, got.data());
              expect_close(got, want, scale, n_out, what);
            }
          }
        }
      }
    }
  }
}

// Many rows, so every thread gets several chunks; the pooled scalar fallback too.
TEST(MatmulTest, ManyRowsAllPathsAndPublicEntry) {
  ThreadPool pool(2);
  std::mt19937 rng(99);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t rows = 1003, cols = 70;
    TestMatrix w = random_matrix(rng, dtype, rows, cols);
    for (int64_t n_tokens : {1, 9, 64}) {
      std::vector<float> x = random_values(rng, n_tokens * cols);
      int64_t n_out = n_tokens * rows;
      std::vector<float> want(static_cast<size_t>(n_out + kPad), kGuard);
      std::vector<float> scale(static_cast<size_t>(n_out + kPad), kGuard);
      matmul_scalar(w.view(), x.data(), n_tokens, want.data());
      matmul_scalar(w.abs().view(), abs_values(x).data(), n_tokens, scale.data());
      std::vector<Isa> isas = simd_isas();
      isas.push_back(Isa::kScalar);
      for (Isa isa : isas) {
        std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
        matmul_impl::matmul_with(isa, Path::kAuto, pool, w.view(), x.data(), n_tokens, got.data());
        expect_close(got, want, scale, n_out, std::string("pooled ") + simd::isa_name(isa));
      }
      std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
      matmul(pool, w.view(), x.data(), n_tokens, got.data());
      expect_close(got, want, scale, n_out, "matmul()");
    }
  }
}

// Expects got [n_tokens, ldy] to hold rows [r_begin, r_end) of want [n_tokens, rows] (within
// kRelTol of scale) in its first r_end - r_begin columns, and the guard value past them.
void expect_row_range(const std::vector<float>& got, const std::vector<float>& want,
                      const std::vector<float>& scale, int64_t n_tokens, int64_t rows, int64_t ldy,
                      int64_t r_begin, int64_t r_end, const std::string& what) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < ldy; ++j) {
      const float g = got[static_cast<size_t>(t * ldy + j)];
      if (j >= r_end - r_begin) {
        ASSERT_EQ(g, kGuard) << what << ": wrote token " << t << " column " << j;
        continue;
      }
      const size_t k = static_cast<size_t>(t * rows + r_begin + j);
      ASSERT_NEAR(g, want[k], kRelTol * scale[k] + std::numeric_limits<float>::min())
          << what << " token " << t << " row " << r_begin + j;
    }
  }
}

// Every token count from 1 to 17 (the rows a routed expert gets in a decode batch: register
// blocks of every size, ragged token blocks) on both paths, through matmul_rows_with on a range
// of rows written at a row stride wider than the range; nothing else may be written.
TEST(MatmulTest, EveryTokenCountOnARowRange) {
  std::mt19937 rng(17);
  const int64_t rows = 23, cols = 45, r_begin = 5, r_end = 19, ldy = 20;
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::kScalar);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    TestMatrix w = random_matrix(rng, dtype, rows, cols);
    for (int64_t n_tokens = 1; n_tokens <= 17; ++n_tokens) {
      std::vector<float> x = random_values(rng, n_tokens * cols);
      std::vector<float> want(static_cast<size_t>(n_tokens * rows));
      std::vector<float> scale(want.size());
      matmul_scalar(w.view(), x.data(), n_tokens, want.data());
      matmul_scalar(w.abs().view(), abs_values(x).data(), n_tokens, scale.data());
      for (Isa isa : isas) {
        for (Path path : {Path::kDirect, Path::kTiled}) {
          const std::string what = std::string(simd::isa_name(isa)) + " " + path_name(path) +
                                   " " + dtype_name(dtype) + " n_tokens " +
                                   std::to_string(n_tokens);
          std::vector<float> got(static_cast<size_t>(n_tokens * ldy), kGuard);
          matmul_impl::matmul_rows_with(isa, path, w.view(), x.data(), n_tokens, got.data(), ldy,
                                        r_begin, r_end);
          expect_row_range(got, want, scale, n_tokens, rows, ldy, r_begin, r_end, what);
        }
      }
    }
  }
}

// The tiled path's panels (64 weight rows × 128 columns with AVX-512, 16 × 128 with AVX2) on a
// row range that starts mid-panel and ends in a partial panel, with columns that leave every
// kind of tail when packing (bf16 pairs of 2 · width columns, a whole vector, part of one) and
// several column blocks; each token block size occurs, and 130 tokens make two token groups.
// Nothing outside the range is written.
TEST(MatmulTest, TiledPanelEdges) {
  std::mt19937 rng(64);
  const int64_t rows = 200, r_begin = 3, r_end = 197, ldy = r_end - r_begin + 5;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {5, 32, 40, 257, 300}) {
      TestMatrix w = random_matrix(rng, dtype, rows, cols);
      for (int64_t n_tokens : {1, 6, 7, 13, 50, 130}) {
        std::vector<float> x = random_values(rng, n_tokens * cols);
        std::vector<float> want(static_cast<size_t>(n_tokens * rows)), scale(want.size());
        matmul_scalar(w.view(), x.data(), n_tokens, want.data());
        matmul_scalar(w.abs().view(), abs_values(x).data(), n_tokens, scale.data());
        for (Isa isa : simd_isas()) {
          const std::string what = std::string(simd::isa_name(isa)) + " " + dtype_name(dtype) +
                                   " cols " + std::to_string(cols) + " n_tokens " +
                                   std::to_string(n_tokens);
          std::vector<float> got(static_cast<size_t>(n_tokens * ldy), kGuard);
          matmul_impl::matmul_rows_with(isa, Path::kTiled, w.view(), x.data(), n_tokens, got.data(),
                                        ldy, r_begin, r_end);
          expect_row_range(got, want, scale, n_tokens, rows, ldy, r_begin, r_end, what);
        }
      }
    }
  }
}

TEST(MatmulTest, RowSliceMultipliesOnlyThoseRows) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  TestMatrix w = random_matrix(rng, DType::kBF16, 40, 33);
  std::vector<float> x = random_values(rng, 3 * 33);
  std::vector<float> full(3 * 40), scale(3 * 40), part(3 * 7);
  matmul(pool, w.view(), x.data(), 3, full.data());
  matmul_scalar(w.abs().view(), abs_values(x).data(), 3, scale.data());
  matmul(pool, w.view().row_slice(11, 7), x.data(), 3, part.data());
  // Block boundaries differ from the full product's, so the summation order may too.
  for (int t = 0; t < 3; ++t) {
    for (int r = 0; r < 7; ++r) {
      EXPECT_NEAR(part[t * 7 + r], full[t * 40 + 11 + r], kRelTol * scale[t * 40 + 11 + r]);
    }
  }
}

TEST(MatmulTest, EmptyShapes) {
  ThreadPool pool(2);
  TestMatrix w{DType::kF32, 3, 0, {}, {}};
  std::vector<float> y(6, kGuard);
  float x = 0;
  matmul(pool, w.view(), &x, 2, y.data());  // cols 0: y is all zeros
  EXPECT_EQ(y, std::vector<float>(6, 0.0f));
  TestMatrix w2{DType::kF32, 0, 4, {}, {}};
  std::vector<float> x2(8, 1.0f);
  matmul(pool, w2.view(), x2.data(), 2, y.data());  // rows 0: nothing to write
  matmul_xw(pool, w.view(), x2.data(), 2, y.data());
}

TEST(MatmulTest, RejectsF16Weights) {
  ThreadPool pool(1);
  std::vector<uint16_t> data(4);
  Matrix w{DType::kF16, 2, 2, data.data()};
  std::vector<float> x(2), y(2);
  EXPECT_THROW(matmul(pool, w, x.data(), 1, y.data()), Error);
}

TEST(MatmulXwTest, SimdMatchesScalar) {
  ThreadPool pool(3);
  std::mt19937 rng(4321);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {1, 7, 16, 17, 33, 64, 100, 1003}) {
      for (int64_t rows : {1, 5, 37, 512}) {
        TestMatrix w = random_matrix(rng, dtype, rows, cols);
        TestMatrix w_abs = w.abs();
        for (int64_t n_tokens : {0, 1, 3, 8, 9, 31, 64, 70}) {
          if (rows * cols * n_tokens > 4'000'000) continue;
          std::vector<float> x_buf = random_values(rng, n_tokens * rows + 1);
          const float* x = x_buf.data() + 1;
          std::vector<float> x_abs = abs_values(x_buf);
          int64_t n_out = n_tokens * cols;
          std::vector<float> want(static_cast<size_t>(n_out + kPad), kGuard);
          std::vector<float> scale(static_cast<size_t>(n_out + kPad), kGuard);
          matmul_xw_scalar(w.view(), x, n_tokens, want.data());
          matmul_xw_scalar(w_abs.view(), x_abs.data() + 1, n_tokens, scale.data());
          std::vector<Isa> isas = simd_isas();
          isas.push_back(Isa::kScalar);
          for (Isa isa : isas) {
            std::string what = std::string("xw ") + simd::isa_name(isa) + " " + dtype_name(dtype) +
                               " rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                               " n_tokens " + std::to_string(n_tokens);
            std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
            std::fill(got.begin(), got.begin() + n_out, std::nanf(""));
            matmul_impl::matmul_xw_with(isa, pool, w.view(), x, n_tokens, got.data());
            expect_close(got, want, scale, n_out, what);
          }
          std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
          matmul_xw(pool, w.view(), x, n_tokens, got.data());
          expect_close(got, want, scale, n_out, "matmul_xw()");
        }
      }
    }
  }
}

}  // namespace
}  // namespace duet
