// Private to src/kernels: E4M3 codes widened in AVX-512 registers, shared by the fp8 rows of the
// all-to-all (fp8_rows.cpp) and the fp8 weights' products (matmul_fp8*.cpp).
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

// 32 words of bf16(value × 2^-8) of 32 normal codes (exponent E of 1 to 15, mantissa M), each
// code c given as two shifted copies in its word: at4 holding c's 7 low bits at bits 4-10, at15
// its sign at bit 15 (what else they hold is masked off). The value 2^(E-7) (1 + M/8) times
// 2^-8 is a bf16 of exponent E + 112, so its bits are (c & 0x7f) << 4 OR 0x3800 (112 << 7, no
// bit in common) with the sign at bit 15: two ternary logics. Wrong for codes of exponent 0
// (zeros, subnormals), which callers find (has_exponent_0) and widen otherwise; a NaN code
// (0x7f, 0xff) reads as ±480.
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE __m512i bf16_of_normal(__m512i at4, __m512i at15) {
  const __m512i bits = _mm512_set1_epi16(0x07f0), bias = _mm512_set1_epi16(0x3800);
  const __m512i sign = _mm512_set1_epi16(static_cast<int16_t>(0x8000));
  // (at4 & bits) | bias, then | (at15 & sign): 0xea and 0xf8 as ternary logic
  return _mm512_ternarylogic_epi32(_mm512_ternarylogic_epi32(at4, bits, bias, 0xea), at15, sign,
                                   0xf8);
}

// Whether a code of the (masked) bytes has exponent 0: a zero or a subnormal.
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE bool has_exponent_0(__m512i codes, __mmask64 k) {
  return _mm512_mask_testn_epi8_mask(k, codes, _mm512_set1_epi8(0x78)) != 0;
}
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE bool has_exponent_0(__m256i codes) {
  return _mm256_testn_epi8_mask(codes, _mm256_set1_epi8(0x78)) != 0;
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
