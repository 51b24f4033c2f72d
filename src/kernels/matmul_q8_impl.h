// Private to src/kernels and its tests: products with int8 or int4 weights (DType::kQ8, kQ4,
// quantize.h). x is quantized to int8, per token in the weights' groups (scale max|x| / 127, as
// llama.cpp's Q8_0 × Q8_0 and Q4_0 × Q8_0 dot products do), so each group's dot product is exact
// in int32 and only the scaling and the sum over groups run in f32:
//   y[t, r] = D_w[r] · Σ_g s_w[r, g] · d_x[t, g] · Σ_{k in g} q_w[r, k] · q_x[t, k],
// the weights' scale d_w = D_w · s_w (a power-of-two row factor and an f16, quantize.h).
// Every kernel computes the same integer sums of each group from the same quantized x; they
// differ only in the order of the f32 additions.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/simd_impl.h"

namespace duet {

// x quantized for a product with kQ8 or kQ4 weights of `cols` columns: n_tokens rows of
// ld = q8_ld(cols)
// values, in the order of the weights' superblocks (kernels/quantize.h).
struct Q8Rows {
  // [n_tokens, ld / 128, 8, 4, 4] int8 q_x, zero past cols: bytes [16k + 4j, 16k + 4j + 4) of
  // superblock s are bytes [4k, 4k + 4) of its group j, so that the 16 bytes of step k,
  // broadcast to the 4 lanes of each weight row, meet the 4 weight bytes of each group.
  const int8_t* q = nullptr;
  // [n_tokens, ld / 128, 16] f32: lane 4r + j holds the scale d_x of group j of the superblock.
  const float* scales = nullptr;
  // [n_tokens, ld / 128, 16] int32: lane 4r + j holds -128 · Σ q_x over group j, which takes the
  // +128 of the weights' bytes back out of a vpdpbusd sum (kQ4: corr / 16 takes their +8 out).
  const int32_t* corr = nullptr;
  int64_t ld = 0;
};

namespace matmul_q8 {

// The kernels, one per instruction set; each SIMD one is tested against kScalar.
// kQ4 weights run the same kernels, their nibbles unpacked to bytes q + 8, which every kernel
// multiplies unsigned (vpmaddubsw or vpdpbusd) with x, started from -8 · Σ x.
enum class Kernel {
  kScalar,      // plain loops, integer group sums, f64 accumulation: the reference
  kAvx2,        // vpmaddubsw + vpmaddwd on |x| and w with x's signs, two 32-byte halves
  kAvx512,      // the same on 64 bytes, signs by mask
  kAvx512Vnni,  // vpdpbusd on the weights' q + 128 and x, started from -128 · Σ x
  kAvx2Vnni,    // the same on two 32-byte halves with AVX-VNNI's (VEX) vpdpbusd
  // For tests and benchmarks: kAvx2Vnni's code with the EVEX vpdpbusd on ymm registers (AVX-512
  // VNNI and VL), the same semantics, so that CPUs without AVX-VNNI (Zen 4, Ice Lake) run it.
  // kernel_for never picks it.
  kAvx2VnniEvex,
};

const char* kernel_name(Kernel k);
bool kernel_supported(Kernel k);
// The kernel matmul uses on isa: AVX-512 VNNI where the CPU has it and isa is an AVX-512 one,
// AVX-VNNI where the CPU has it and isa is avx2.
Kernel kernel_for(simd::Isa isa);
// Every SIMD kernel this CPU runs, kAvx2VnniEvex included.
std::vector<Kernel> simd_kernels();

// Buffers for a quantized copy of x.
struct Buffer {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> corr;
  Q8Rows rows;
};

// x[n_tokens, cols] (contiguous or gathered f32 rows) quantized, into buf; the result points
// into buf. Per group: d_x = max|x| / 127, q_x = round(x · (1 / d_x)) to nearest even. The same
// bits whatever k (which picks the loops: AVX-512 for the AVX-512 kernels, else scalar).
const Q8Rows& quantize_x(XRows x, int64_t cols, int64_t n_tokens, Buffer& buf,
                         Kernel k = Kernel::kScalar);

// q_x and d_x of element k of token t.
int x_value(const Q8Rows& x, int64_t t, int64_t k);
float x_scale(const Q8Rows& x, int64_t t, int64_t k);

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens, on the calling
// thread; x quantized by quantize_x.
void rows_with(Kernel k, const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
               int64_t r_begin, int64_t r_end);

// The same from f32 x (x.q8 used when set, else quantized here).
void rows_from_f32(Kernel k, const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                   int64_t r_begin, int64_t r_end);

// matmul() for kQ8 and kQ4 weights: x quantized once, rows shared out over pool.
void matmul_with(Kernel k, ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens,
                 float* y);

}  // namespace matmul_q8
}  // namespace duet
