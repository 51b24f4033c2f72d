#include "kernels/fp8_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fp8_simd_impl.h"
#include "kernels/ops_impl.h"
#include "kernels/simd_impl.h"

namespace duet {

namespace {

constexpr float kE4m3Max = 448.0f;
// |q| below 2^-6 (an f32 exponent field below 121) is an E4M3 subnormal: a multiple of 2^-9.
constexpr uint32_t kMinNormalBits = 121u << 23;

// 448 / the group's largest magnitude (0 for a group of zeros), and the scale that undoes it.
inline void group_scale(float amax, float* scale, float* inv) {
  *scale = amax / kE4m3Max;
  *inv = amax > 0.0f ? kE4m3Max / amax : 0.0f;
}

}  // namespace

uint8_t f32_to_e4m3(float q) {
  uint32_t u;
  std::memcpy(&u, &q, 4);
  const uint32_t sign = (u >> 31) << 7;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t code;
  if (a < kMinNormalBits) {
    code = static_cast<uint32_t>(std::nearbyint(std::fabs(q) * 512.0f));  // 0..8, ties to even
  } else {
    // Rebias the exponent (127 -> 7) and round the 23-bit mantissa to 3 bits, to nearest even;
    // a carry moves into the exponent as it should.
    uint32_t r = a - (120u << 23);
    r += 0x7ffffu + ((r >> 20) & 1u);
    code = std::min(r >> 20, 0x7eu);
  }
  return static_cast<uint8_t>(sign | code);
}

float e4m3_to_f32(uint8_t c) {
  const uint32_t a = c & 0x7fu;
  float v;
  if (a >= 8) {
    const uint32_t bits = (a << 20) + (120u << 23);
    std::memcpy(&v, &bits, 4);
  } else {
    v = static_cast<float>(a) * 0x1p-9f;  // no f32 subnormals: right whatever MXCSR says
  }
  return (c & 0x80u) ? -v : v;
}

namespace fp8_impl {

void f32_to_fp8_row_scalar(const float* x, int64_t n, float* scales, uint8_t* codes) {
  for (int64_t g = 0; g * kFp8Group < n; ++g) {
    const int64_t b = g * kFp8Group, e = std::min(n, b + kFp8Group);
    float amax = 0.0f;
    for (int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
    float inv;
    group_scale(amax, &scales[g], &inv);
    for (int64_t i = b; i < e; ++i) codes[i] = f32_to_e4m3(x[i] * inv);
  }
}

void fp8_to_f32_row_scalar(const float* scales, const uint8_t* codes, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = e4m3_to_f32(codes[i]) * scales[i / kFp8Group];
}

void axpy_fp8_scalar(float alpha, const float* scales, const uint8_t* codes, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = std::fma(alpha, e4m3_to_f32(codes[i]) * scales[i / kFp8Group], y[i]);
}

}  // namespace fp8_impl

// GCC 12 warns about its own AVX-512 intrinsics; see simd_impl.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace fp8_impl::avx512 {

constexpr int64_t kW = 16;

DUET_TARGET_AVX512 inline __mmask16 first(int64_t n) {
  return static_cast<__mmask16>(n >= kW ? 0xffffu : (1u << n) - 1u);
}

// f32_to_e4m3 on 16 lanes (cvtps rounds to nearest even under MXCSR's default mode).
DUET_TARGET_AVX512 inline __m128i e4m3_codes(__m512 q) {
  const __m512i u = _mm512_castps_si512(q);
  const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(u, 31), 7);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  __m512i r = _mm512_sub_epi32(a, _mm512_set1_epi32(120 << 23));
  r = _mm512_add_epi32(
      r, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                          _mm512_and_si512(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(1))));
  const __m512i normal = _mm512_min_epu32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(0x7e));
  const __m512i sub =
      _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)));
  const __mmask16 is_sub =
      _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(static_cast<int>(kMinNormalBits)));
  return _mm512_cvtepi32_epi8(_mm512_or_si512(_mm512_mask_blend_epi32(is_sub, normal, sub), sign));
}

// e4m3_to_f32(code) × scale on 16 codes (fp8_simd::widen gives the values × 2^-8).
DUET_TARGET_AVX512 inline __m512 scaled_values(__m128i codes, float scale) {
  return _mm512_mul_ps(fp8_simd::widen(codes), _mm512_set1_ps(scale * 256.0f));
}

DUET_TARGET_AVX512 void f32_to_fp8_row(const float* x, int64_t n, float* scales, uint8_t* codes) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g * kFp8Group < n; ++g) {
    const int64_t b = g * kFp8Group, e = std::min(n, b + kFp8Group);
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = b; i < e; i += kW)
      m = _mm512_max_ps(m, _mm512_and_ps(_mm512_maskz_loadu_ps(first(e - i), x + i), abs_mask));
    float inv;
    group_scale(_mm512_reduce_max_ps(m), &scales[g], &inv);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t i = b; i < e; i += kW) {
      const __mmask16 k = first(e - i);
      const __m128i c = e4m3_codes(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vinv));
      _mm_mask_storeu_epi8(codes + i, k, c);
    }
  }
}

DUET_TARGET_AVX512 void fp8_to_f32_row(const float* scales, const uint8_t* codes, int64_t n,
                                       float* y) {
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 k = first(n - i);
    _mm512_mask_storeu_ps(y + i, k,
                          scaled_values(_mm_maskz_loadu_epi8(k, codes + i), scales[i / kFp8Group]));
  }
}

DUET_TARGET_AVX512 void axpy_fp8(float alpha, const float* scales, const uint8_t* codes, int64_t n,
                                 float* y) {
  const __m512 a = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 k = first(n - i);
    const __m512 v = scaled_values(_mm_maskz_loadu_epi8(k, codes + i), scales[i / kFp8Group]);
    _mm512_mask_storeu_ps(y + i, k, _mm512_fmadd_ps(a, v, _mm512_maskz_loadu_ps(k, y + i)));
  }
}

}  // namespace fp8_impl::avx512

#pragma GCC diagnostic pop

void f32_to_fp8_row(const float* x, int64_t n, float* scales, uint8_t* codes) {
  if (ops_impl::use_avx512()) return fp8_impl::avx512::f32_to_fp8_row(x, n, scales, codes);
  fp8_impl::f32_to_fp8_row_scalar(x, n, scales, codes);
}

void fp8_to_f32_row(const float* scales, const uint8_t* codes, int64_t n, float* y) {
  if (ops_impl::use_avx512()) return fp8_impl::avx512::fp8_to_f32_row(scales, codes, n, y);
  fp8_impl::fp8_to_f32_row_scalar(scales, codes, n, y);
}

void axpy_fp8(float alpha, const float* scales, const uint8_t* codes, int64_t n, float* y) {
  if (ops_impl::use_avx512()) return fp8_impl::avx512::axpy_fp8(alpha, scales, codes, n, y);
  fp8_impl::axpy_fp8_scalar(alpha, scales, codes, n, y);
}

}  // namespace duet
