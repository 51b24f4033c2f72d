// Private to src/kernels: E4M3 codes widened in AVX-512 registers, shared by the fp8 rows of the
// all-to-all (fp8_rows.cpp) and the fp8 weights' products (matmul_fp8.cpp).
#pragma once

#include "kernels/simd_impl.h"

namespace duet::fp8_simd {

// 16 codes' values × 2^-8: the sign-extended code shifted left by 7 puts E4M3's sign at bit 15
// (and a copy at bit 14, cleared), its exponent at bits 10-13 and its mantissa at bits 7-9 of an
// f16, whose exponent bias (15) is E4M3's (7) plus 8; subnormal codes land on f16 subnormals, so
// every code, 0x7f and 0xff included, converts exactly, in 4 instructions. A value times s is
// then widen(codes) × (256 s), exactly as rounded as e4m3_to_f32(code) × s.
DUET_TARGET_AVX512 inline __m512 widen(__m128i codes) {
  const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7);
  return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0xbfff))));
}

// Zeroes R × T vector sums, unrolled so that they stay in registers.
template <int R, int T>
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE void zero_sums(__m512 (&sums)[R][T]) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) sums[i][j] = _mm512_setzero_ps();
}

}  // namespace duet::fp8_simd
