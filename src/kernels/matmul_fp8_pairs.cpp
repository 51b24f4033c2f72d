// Products with fp8 weights on instruction sets that multiply bf16 pairs (AVX-512 BF16 and its
// emulation). x is rounded to bf16 as for bf16 weights (matmul_impl::round_x), for every token
// count; from kFp8PairsMinTokens tokens on the codes are widened to bf16 exactly and multiplied
// with vdpbf16ps (matmul_fp8_pairs_impl.h); fewer, where the CPU has AVX-512 VBMI, widened in
// registers (matmul_fp8_lut.cpp: shifts, and byte look-ups for zeros and subnormals); otherwise
// fewer, and batch-invariant products, run the f32 kernels of matmul_fp8.cpp on the rounded x.

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/fp8_simd_impl.h"
#include "kernels/matmul_fp8.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_impl.h"

namespace duet::fp8_impl {

namespace {

using fp8_impl::scale_row;

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where inlined (see simd_impl.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define DUET_PAIRS_IMPL "kernels/matmul_fp8_pairs_impl.h"
#include "kernels/pairs_instances.h"
#undef DUET_PAIRS_IMPL

#pragma GCC diagnostic pop

template <simd::Isa kIsa>
void matmul_rows_dpbf16(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t r_begin, int64_t r_end, bool /*tiled*/) {
  DUET_CHECK(w.f8.block_cols % 16 == 0, "fp8 matmul: block_cols " << w.f8.block_cols);
  thread_local std::vector<uint16_t> x_buf;
  if (!x.bf16) x = matmul_impl::round_x(x, w.cols, n_tokens, x_buf);
  // Fewer tokens than the pairs take (decode's experts and projections): codes widened to bf16 in
  // registers where the CPU can.
  if (lut_serves(kIsa, w, n_tokens)) {
    return matmul_rows_lut(w, x.bf16, x.ld, n_tokens, y, ldy, r_begin, r_end);
  }
  if (matmul_impl::fp8_reads_widened(kIsa, w, n_tokens)) {
    thread_local std::vector<float> f32_buf;  // unless direct_x widened x for the whole product
    if (!x.widened) x = matmul_impl::widen_x(x, w.cols, n_tokens, f32_buf);
    return matmul_rows_shift_avx512(w, XRows(x.widened, x.ld), n_tokens, y, ldy, r_begin, r_end);
  }
  if constexpr (kIsa == simd::Isa::kAvx512Bf16) {
    avx512bf16::matmul_rows(w, x, n_tokens, y, ldy, r_begin, r_end);
  } else {
    avx512bf16_emulated::matmul_rows(w, x, n_tokens, y, ldy, r_begin, r_end);
  }
}

}  // namespace

RowsFn pairs_rows_fn(simd::Isa isa) {
  DUET_CHECK(simd::has_dpbf16(isa), "fp8 pairs: " << simd::isa_name(isa));
  return isa == simd::Isa::kAvx512Bf16 ? &matmul_rows_dpbf16<simd::Isa::kAvx512Bf16>
                                       : &matmul_rows_dpbf16<simd::Isa::kAvx512Bf16Emulated>;
}

}  // namespace duet::fp8_impl

namespace duet::matmul_impl {

bool fp8_reads_widened(simd::Isa isa, const Matrix& w, int64_t n_tokens) {
  if (matmul_batch_invariant()) return true;
  return n_tokens < kFp8PairsMinTokens && !fp8_impl::lut_serves(isa, w, n_tokens);
}

DUET_TARGET_AVX512 XRows widen_x(XRows x, int64_t cols, int64_t n_tokens, std::vector<float>& buf) {
  DUET_CHECK(x.bf16 && x.ld >= (cols + 15) / 16 * 16,
             "widen_x: x not rounded, or ld " << x.ld << " for " << cols << " cols");
  float* out = aligned_floats(buf, n_tokens * x.ld);  // [n_tokens, x.ld] f32
  for (int64_t t = 0; t < n_tokens; ++t) {
    const uint16_t* row = x.bf16 + t * x.ld;  // zero past cols, to a whole number of vectors
    for (int64_t c = 0; c < cols; c += simd::Avx512::kWidth) {
      _mm512_store_ps(out + t * x.ld + c,
                      _mm512_mul_ps(simd::Avx512::load(row + c), _mm512_set1_ps(0x1p64f)));
    }
  }
  x.widened = out;
  return x;
}

}  // namespace duet::matmul_impl
