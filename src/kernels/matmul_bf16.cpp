// matmul for bf16 weights on AVX-512 BF16: x rounded to bf16 once per product, products of bf16
// pairs with vdpbf16ps (matmul_bf16_impl.h), and the same kernels on an emulation of the
// instruction so that tests run them on CPUs without it.

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_impl.h"

namespace duet {

namespace {

#define DUET_PAIRS_IMPL "kernels/matmul_bf16_impl.h"
#include "kernels/pairs_instances.h"
#undef DUET_PAIRS_IMPL

}  // namespace

namespace matmul_impl {

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where inlined (see simd_impl.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// v rounded to bf16 per lane, exactly as f32_to_bf16 (core/dtype.h): to nearest even by integer
// arithmetic on the bits, NaN made quiet. (vcvtneps2bf16 would flush denormals, and only exists
// with AVX-512 BF16; the emulated path must round the same.)
DUET_TARGET_AVX512 inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

}  // namespace

DUET_TARGET_AVX512 void round_row(const float* src, int64_t cols, uint16_t* dst, int64_t ld) {
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), to_bf16(_mm512_loadu_ps(src + k)));
  }
  if (k < cols) {
    const auto mask = static_cast<__mmask16>((1u << (cols - k)) - 1u);
    _mm256_mask_storeu_epi16(dst + k, mask, to_bf16(_mm512_maskz_loadu_ps(mask, src + k)));
  }
  std::fill(dst + cols, dst + ld, uint16_t{0});
}

#pragma GCC diagnostic pop

XRows round_x(XRows x, int64_t cols, int64_t n_tokens, std::vector<uint16_t>& buf) {
  DUET_CHECK(simd::isa_supported(simd::Isa::kAvx512), "round_x: needs AVX-512");
  DUET_CHECK(!x.bf16 && n_tokens >= 0 && cols >= 0,
             "round_x: x already rounded, or n_tokens " << n_tokens << " cols " << cols);
  const int64_t ld = (cols + 31) / 32 * 32 + 32;         // whole cache lines plus one
  uint16_t* rounded = aligned_bf16(buf, n_tokens * ld);  // [n_tokens, ld] bf16
  for (int64_t t = 0; t < n_tokens; ++t) round_row(x.row(t, cols), cols, rounded + t * ld, ld);
  return XRows::rounded(rounded, ld);
}

void matmul_rows_dpbf16(simd::Isa isa, const Matrix& w, XRows x, int64_t n_tokens, float* y,
                        int64_t ldy, int64_t r_begin, int64_t r_end, bool tiled) {
  DUET_CHECK(rounds_x(isa, w.dtype) && w.cols > 0,
             "matmul_rows_dpbf16: " << simd::isa_name(isa) << " " << dtype_name(w.dtype) << " cols "
                                    << w.cols);
  thread_local std::vector<uint16_t> x_buf;
  if (!x.bf16) x = round_x(x, w.cols, n_tokens, x_buf);
  if (isa == simd::Isa::kAvx512Bf16) {
    avx512bf16::matmul_rows(w, x, n_tokens, y, ldy, r_begin, r_end, tiled);
  } else {
    avx512bf16_emulated::matmul_rows(w, x, n_tokens, y, ldy, r_begin, r_end, tiled);
  }
}

}  // namespace matmul_impl

}  // namespace duet
