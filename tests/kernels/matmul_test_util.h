// Test helpers shared by the matmul tests: random weight matrices in either dtype, the scalar
// product they should give with a tolerance scale, and checks of results against it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_impl.h"

namespace duet::test {

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
inline std::vector<float> random_values(std::mt19937& rng, int64_t n) {
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

inline TestMatrix random_matrix(std::mt19937& rng, DType dtype, int64_t rows, int64_t cols) {
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

inline std::vector<float> abs_values(std::vector<float> v) {
  for (float& f : v) f = std::fabs(f);
  return v;
}

constexpr float kGuard = 12345.0f;
constexpr int64_t kPad = 64;  // guard elements after each output
constexpr float kRelTol = 1e-5f;

// Every SIMD instruction set this CPU runs, the emulation of AVX-512 BF16 included.
inline std::vector<Isa> simd_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512Bf16Emulated, Isa::kAvx512, Isa::kAvx2}) {
    if (simd::isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

// The label of one product case in failure messages: "avx512 bf16 cols 129 n_tokens 17".
inline std::string case_name(Isa isa, DType dtype, int64_t cols, int64_t n_tokens) {
  return std::string(simd::isa_name(isa)) + " " + dtype_name(dtype) + " cols " +
         std::to_string(cols) + " n_tokens " + std::to_string(n_tokens);
}

// x rounded to bf16 and back, as kernels that multiply bf16 pairs see it.
inline std::vector<float> rounded(const float* x, int64_t n) {
  std::vector<float> r(static_cast<size_t>(n));
  for (size_t i = 0; i < r.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return r;
}

// What a product should give: matmul_scalar's result y, and Σ|w||x| per output (the scale of the
// tolerance), each followed by `pad` guard values.
struct Expected {
  std::vector<float> y, scale;
};

inline Expected expected_product(const TestMatrix& w, const float* x, int64_t n_tokens,
                                 int64_t pad) {
  const size_t n_out = static_cast<size_t>(n_tokens * w.rows);
  Expected e{std::vector<float>(n_out + static_cast<size_t>(pad), kGuard),
             std::vector<float>(n_out + static_cast<size_t>(pad), kGuard)};
  matmul_scalar(w.view(), x, n_tokens, e.y.data());
  matmul_scalar(w.abs().view(), abs_values(std::vector<float>(x, x + n_tokens * w.cols)).data(),
                n_tokens, e.scale.data());
  return e;
}

// The expected product of w and x on x as each instruction set multiplies it: as it is, or
// rounded to bf16 where matmul_impl::rounds_x.
struct Expectations {
  Expectations(const TestMatrix& w, const float* x, int64_t n_tokens, int64_t pad = 0)
      : dtype(w.dtype),
        exact(expected_product(w, x, n_tokens, pad)),
        of_rounded(dtype == DType::kBF16
                       ? expected_product(w, rounded(x, n_tokens * w.cols).data(), n_tokens, pad)
                       : exact) {}
  const Expected& operator()(Isa isa) const {
    return matmul_impl::rounds_x(isa, dtype) ? of_rounded : exact;
  }

  DType dtype;
  Expected exact, of_rounded;
};

// Expects got ≈ want elementwise, within kRelTol of scale (Σ|w||x| for each output, which bounds
// the rounding error of any summation order), and the guard values past n untouched.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
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

// Expects got [n_tokens, ldy] to hold rows [r_begin, r_end) of want [n_tokens, rows] (within
// kRelTol of scale) in its first r_end - r_begin columns, and the guard value past them.
inline void expect_row_range(const std::vector<float>& got, const std::vector<float>& want,
                             const std::vector<float>& scale, int64_t n_tokens, int64_t rows,
                             int64_t ldy, int64_t r_begin, int64_t r_end, const std::string& what) {
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

}  // namespace duet::test
