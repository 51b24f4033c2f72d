// Private to src/kernels and its tests: products with int8 weights (DType::kQ8, quantize.h).
// x is quantized too, per token in the weights' groups (scale max|x| / 127, as llama.cpp's Q8_0
// × Q8_0 dot product does), so each group's dot product is exact in int32 and only the scaling
// and the sum over groups run in f32:
//   y[t, r] = Σ_g d_w[r, g] · d_x[t, g] · Σ_{k in g} q_w[r, k] · q_x[t, k].
// Every kernel computes the same integer sums from the same quantized x; they differ only in
// the order of the f32 additions.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/simd_impl.h"

namespace duet {

// x quantized for a product with kQ8 weights of `cols` columns: n_tokens rows of q8_ld(cols).
struct Q8Rows {
  // [n_tokens, ld] int8 q_x, zero past cols; with `offset`, q_x + 128 as uint8 (the u8 operand
  // of vpdpbusd).
  const int8_t* q = nullptr;
  // [n_tokens, ld / 4] f32: group g's scale d_x in elements [8g, 8g + 8), repeated so that a
  // vector of 8 lanes per group loads it whole.
  const float* scales = nullptr;
  int64_t ld = 0;
  bool offset = false;
};

namespace matmul_q8 {

// The kernels, one per instruction set; each SIMD one is tested against kScalar.
enum class Kernel {
  kScalar,      // plain loops, integer group sums, f64 accumulation: the reference
  kAvx2,        // vpmaddubsw + vpmaddwd on |x| and w with x's signs (32 bytes: 1 group)
  kAvx512,      // the same on 64 bytes (2 groups), signs by mask
  kAvx512Vnni,  // vpdpbusd on x + 128, minus 128 · Σ w from a vpdpbusd of its own
};

const char* kernel_name(Kernel k);
bool kernel_supported(Kernel k);
// The kernel matmul uses on isa: AVX-512 VNNI where the CPU has it and isa is an AVX-512 one.
Kernel kernel_for(simd::Isa isa);
// Every SIMD kernel this CPU runs.
std::vector<Kernel> simd_kernels();

// Buffers for a quantized copy of x.
struct Buffer {
  std::vector<int8_t> q;
  std::vector<float> scales;
  Q8Rows rows;
};

// x[n_tokens, cols] (contiguous or gathered f32 rows) quantized as kernel k reads it, into buf;
// the result points into buf.
const Q8Rows& quantize_x(Kernel k, XRows x, int64_t cols, int64_t n_tokens, Buffer& buf);

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens, on the calling
// thread; x quantized by quantize_x for k.
void rows_with(Kernel k, const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
               int64_t r_begin, int64_t r_end);

// The same from f32 x (x.q8 used when set, else quantized here).
void rows_from_f32(Kernel k, const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                   int64_t r_begin, int64_t r_end);

// matmul() for kQ8 weights: x quantized once, rows shared out over pool.
void matmul_with(Kernel k, ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens,
                 float* y);

}  // namespace matmul_q8
}  // namespace duet
