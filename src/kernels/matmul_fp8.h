// Products of f32 activations with fp8 weights as DeepSeek-V3 and Qwen3-FP8 publish them
// (DType::kF8E4M3: one E4M3 code per weight and an f32 scale per block, Matrix::f8), computed from
// the codes in place: each weight is read as its one byte and widened in registers, each block's
// partial dot product is multiplied by the block's scale. matmul(), matmul_xw() and the grouped
// products (grouped_matmul.h) come here for fp8 matrices; this header is for them and for tests.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/matmul.h"
#include "kernels/simd_impl.h"

namespace duet {

// Weight (r, c) of an fp8 matrix as f32: e4m3_to_f32(code) × its block's scale.
float fp8_weight(const Matrix& w, int64_t r, int64_t c);

// out[w.rows, w.cols] f32 = every weight of the fp8 matrix w (for tests and reference products;
// the kernels never expand a matrix).
void dequantize_fp8(const Matrix& w, float* out);

namespace fp8_impl {

// The scales of row r's blocks: [ceil(w.cols / w.f8.block_cols)] f32.
inline const float* scale_row(const Matrix& w, int64_t r) {
  const int64_t n_cb = (w.cols + w.f8.block_cols - 1) / w.f8.block_cols;
  return w.f8.scale_inv + (w.f8.row0 + r) / w.f8.block_rows * n_cb;
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens, with x's rows
// contiguous or gathered (not rounded), w fp8 with f8.block_cols a multiple of 16. The shape
// of matmul_impl's row kernels (`tiled` is ignored: one path serves every token count).
// avx512 needs simd::Isa::kAvx512, avx2 AVX2 and F16C; the scalar one sums each block in double.
void matmul_rows_avx512(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t r_begin, int64_t r_end, bool tiled);
void matmul_rows_avx2(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                      int64_t r_begin, int64_t r_end, bool tiled);
// matmul_rows_avx512's one-token kernel for every token count, widening the codes in three
// integer instructions rather than through f16 (values × 2^-120, f32 subnormals for E4M3's), for
// x multiplied by 2^64 (exactly; the product is then the true one, normal unless |x| < 2^-61,
// as long as |x| < 2^63): the AVX-512 BF16 kernels pass x so (matmul_fp8_pairs.cpp).
void matmul_rows_shift_avx512(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                              int64_t r_begin, int64_t r_end);
void matmul_rows_scalar(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t r_begin, int64_t r_end, bool tiled);

// y[t * w.cols + c] = Σ_r x[t * w.rows + r] · w(r, c) for c in [c_begin, c_end), the product
// matmul_xw() makes; c_begin a multiple of 16 for avx512.
void matmul_xw_cols_avx512(const Matrix& w, const float* x, int64_t n_tokens, float* y,
                           int64_t c_begin, int64_t c_end);
void matmul_xw_cols_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y,
                           int64_t c_begin, int64_t c_end);

// The row kernel for products on isa: on the instruction sets that multiply bf16 pairs,
// pairs_rows_fn(isa); AVX-512 on AVX-512, AVX2 on AVX2 (scalar without F16C), scalar on scalar.
// matmul_xw's is AVX-512 or scalar.
using RowsFn = void (*)(const Matrix&, XRows, int64_t, float*, int64_t, int64_t, int64_t, bool);
RowsFn rows_fn(simd::Isa isa);

// On an instruction set that multiplies bf16 pairs (simd::has_dpbf16(isa)), from
// matmul_fp8_pairs.cpp: x rounded to bf16 (here, unless it comes rounded), then from
// matmul_impl::kFp8PairsMinTokens tokens on (unless batch-invariant) the codes widened to bf16
// and multiplied in pairs, else matmul_rows_avx512 on the rounded x.
RowsFn pairs_rows_fn(simd::Isa isa);
using XwColsFn = void (*)(const Matrix&, const float*, int64_t, float*, int64_t, int64_t);
XwColsFn xw_cols_fn(simd::Isa isa);

// Few-token products (matmul_fp8_lut.cpp): on CPUs with AVX-512 BF16 and VBMI (lut_supported),
// for w whose blocks are whole multiples of 64 columns (lut_applies),
// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens, x's rows
// rounded to bf16 (round_x) ldx apart, each code widened to bf16(value × 2^-8) once per block of
// up to 3 tokens (normal codes by shifts, 64-code steps holding a zero or subnormal by byte
// look-ups) and multiplied in pairs (vdpbf16ps): the same weights and x as the pairs kernels,
// summed in another order. NaN codes read as 480 or NaN.
bool lut_supported();
bool lut_applies(const Matrix& w);
// Whether a product on isa of n_tokens tokens with w runs the look-ups: on kAvx512Bf16 where
// lut_supported and lut_applies, below matmul_impl::kFp8PairsMinTokens, and not while
// batch-invariant (whose sums must not depend on the token count).
bool lut_serves(simd::Isa isa, const Matrix& w, int64_t n_tokens);
void matmul_rows_lut(const Matrix& w, const uint16_t* x, int64_t ldx, int64_t n_tokens, float* y,
                     int64_t ldy, int64_t r_begin, int64_t r_end);

// The 16 codes' values × 2^-120, as matmul_rows_shift_avx512 widens them (needs AVX-512): the
// code's bits shifted into an f32's, exact for every code but the NaNs 0x7f and 0xff.
void e4m3_values_over_2_120(const uint8_t codes[16], float out[16]);

// The 16 codes' values × 2^-8, as the AVX-512 kernels widen them (exposed for tests; needs
// AVX-512): each code's bits placed in an f16 and converted, exact for all 256 codes.
void e4m3_values_over_256(const uint8_t codes[16], float out[16]);

}  // namespace fp8_impl

}  // namespace duet
