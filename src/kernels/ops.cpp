#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"

#include "kernels/ops_impl.h"
#include "kernels/simd_impl.h"

namespace duet {

namespace ops_impl::scalar {

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * double(xr[i]);
    float scale = 1.0f / std::sqrt(static_cast<float>(ss / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  return static_cast<float>(double(max) + std::log(sum));
}

float dot(const float* a, const float* b, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += double(a[i]) * double(b[i]);
  return static_cast<float>(acc);
}

void axpy(float alpha, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void add_inplace(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

int64_t argmax_finite(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return -1;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

int64_t first_above(const float* x, int64_t n, float t) {
  int64_t i = 0;
  while (i < n && !(x[i] > t)) ++i;
  return i;
}

int64_t indices_at_least(const float* x, int64_t n, float t, int32_t* ids) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] >= t) ids[m++] = static_cast<int32_t>(i);
  return m;
}

double exp_scaled(const float* x, int64_t n, float t, float m, float* y, double* block_sums) {
  double sum = 0;
  for (int64_t b = 0; b * kExpBlock < n; ++b) {
    double block = 0;
    for (int64_t i = b * kExpBlock; i < std::min(n, (b + 1) * kExpBlock); ++i) {
      y[i] = std::exp(x[i] / t - m);
      block += y[i];
    }
    if (block_sums) block_sums[b] = block;
    sum += block;
  }
  return sum;
}

void axpy_bf16(float alpha, const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * bf16_to_f32(x[i]);
}

}  // namespace ops_impl::scalar

// GCC 12 warns about its own AVX-512 intrinsics; see simd_impl.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ops_impl::avx512 {

namespace {

constexpr int64_t kW = 16;

DUET_TARGET_AVX512 inline __mmask16 first(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// e^x for 16 lanes, within 1 ulp of std::exp (measured over [-87, 89)).
// x = n ln2 + r with |r| <= ln2/2; e^r by Cephes' expf polynomial; scaled by 2^n with vscalefps,
// which also gives inf and 0 at the ends. x < -103.97 gives 0, x >= 89 inf, NaN stays NaN.
DUET_TARGET_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-103.972084f);
  const __m512 hi = _mm512_set1_ps(89.0f);
  // max/min return their second operand when either is NaN, so NaN passes through.
  __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  __m512 e = _mm512_scalef_ps(p, n);
  // Below lo (e.g. -inf from masked logits) the result is exactly 0.
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), e);
}

DUET_TARGET_AVX512 inline __m512 silu_mul16(__m512 g, __m512 u) {
  __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

}  // namespace

DUET_TARGET_AVX512 void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n,
                                 float eps, float* y) {
  for (int64_t row = 0; row < n_rows; ++row) {
    const float* xr = x + row * n;
    float* yr = y + row * n;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 4 * kW <= n; i += 4 * kW) {
      for (int j = 0; j < 4; ++j) {
        __m512 v = _mm512_loadu_ps(xr + i + j * kW);
        acc[j] = _mm512_fmadd_ps(v, v, acc[j]);
      }
    }
    for (; i < n; i += kW) {
      __m512 v = _mm512_maskz_loadu_ps(first(std::min(kW, n - i)), xr + i);
      acc[0] = _mm512_fmadd_ps(v, v, acc[0]);
    }
    float ss = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(ss / static_cast<float>(n) + eps));
    for (i = 0; i < n; i += kW) {
      __mmask16 m = first(std::min(kW, n - i));
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), scale);
      _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
  }
}

DUET_TARGET_AVX512 void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    __m512 r = silu_mul16(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i));
    _mm512_mask_storeu_ps(out + i, m, r);
  }
}

DUET_TARGET_AVX512 float softmax(float* x, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, x + i));
  }
  __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), max));
    e = _mm512_maskz_mov_ps(m, e);
    sum = _mm512_add_ps(sum, e);
    _mm512_mask_storeu_ps(x + i, m, e);
  }
  const float total = _mm512_reduce_add_ps(sum);
  __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
  return _mm512_cvtss_f32(max) + std::log(total);
}

DUET_TARGET_AVX512 float dot(const float* a, const float* b, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    for (int j = 0; j < 4; ++j) {
      acc[j] =
          _mm512_fmadd_ps(_mm512_loadu_ps(a + i + j * kW), _mm512_loadu_ps(b + i + j * kW), acc[j]);
    }
  }
  for (; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    acc[0] =
        _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc[0]);
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

DUET_TARGET_AVX512 void axpy(float alpha, const float* x, int64_t n, float* y) {
  __m512 a = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    __m512 r = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

DUET_TARGET_AVX512 void add_inplace(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    __m512 r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

// f32_to_bf16 in integers: round to nearest even by adding 0x7fff plus the kept part's lowest
// bit, except NaNs, which keep their top bits with the quiet bit set.
DUET_TARGET_AVX512 void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + i));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet));
    _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtepi32_epi16(r));
  }
}

DUET_TARGET_AVX512 void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i)), 16);
    _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(u));
  }
}

// Two passes: the largest value (and whether any is NaN or ±inf: |x| not below inf), then the
// first place it occurs.
DUET_TARGET_AVX512 int64_t argmax_finite(const float* x, int64_t n) {
  const __m512 inf = _mm512_set1_ps(INFINITY);
  __m512 vmax[2] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY)};
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    for (int j = 0; j < 2; ++j) {
      const __m512 v = _mm512_loadu_ps(x + i + j * kW);
      bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(v), inf, _CMP_NLT_UQ);
      vmax[j] = _mm512_max_ps(vmax[j], v);
    }
  }
  for (; i < n; i += kW) {
    const __mmask16 m = first(std::min(kW, n - i));
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    bad |= _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(v), inf, _CMP_NLT_UQ);
    vmax[0] = _mm512_mask_max_ps(vmax[0], m, vmax[0], v);
  }
  if (bad) return -1;
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(vmax[0], vmax[1])));
  for (i = 0; i < n; i += kW) {
    const __mmask16 m = first(std::min(kW, n - i));
    const __mmask16 eq =
        _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), max, _CMP_EQ_OQ);
    if (eq) return i + __builtin_ctz(eq);
  }
  return -1;  // not reached: the largest value is one of x's
}

// Skips whole vectors at or below t with one compare each.
DUET_TARGET_AVX512 int64_t first_above(const float* x, int64_t n, float t) {
  const __m512 vt = _mm512_set1_ps(t);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = first(std::min(kW, n - i));
    const __mmask16 gt =
        _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), vt, _CMP_GT_OQ);
    if (gt) return i + __builtin_ctz(gt);
  }
  return n;
}

// Each vector's passing lanes' indices packed in a register (vpcompressd), then stored whole: the
// form that stores to memory is microcoded on Zen 4 and took twice the scalar loop's time.
DUET_TARGET_AVX512 int64_t indices_at_least(const float* x, int64_t n, float t, int32_t* ids) {
  const __m512 vt = _mm512_set1_ps(t);
  const __m512i step = _mm512_set1_epi32(kW);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t m = 0;
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 k = first(std::min(kW, n - i));
    const __mmask16 ge =
        _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), vt, _CMP_GE_OQ);
    _mm512_storeu_si512(ids + m, _mm512_maskz_compress_epi32(ge, idx));
    m += __builtin_popcount(ge);
    idx = _mm512_add_epi32(idx, step);
  }
  return m;
}

DUET_TARGET_AVX512 double exp_scaled(const float* x, int64_t n, float t, float m, float* y,
                                     double* block_sums) {
  static_assert(kExpBlock % kW == 0, "a block is whole vectors");
  const __m512 vt = _mm512_set1_ps(t), vm = _mm512_set1_ps(m);
  double total = 0;
  for (int64_t b = 0; b * kExpBlock < n; ++b) {
    __m512d sum[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    const int64_t end = std::min(n, (b + 1) * kExpBlock);
    for (int64_t i = b * kExpBlock; i < end; i += kW) {
      const __mmask16 k = first(std::min(kW, end - i));
      const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
      const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_div_ps(v, vt), vm)));
      _mm512_mask_storeu_ps(y + i, k, e);
      sum[0] = _mm512_add_pd(sum[0], _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
      sum[1] = _mm512_add_pd(
          sum[1],
          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    const double block = _mm512_reduce_add_pd(_mm512_add_pd(sum[0], sum[1]));
    if (block_sums) block_sums[b] = block;
    total += block;
  }
  return total;
}

DUET_TARGET_AVX512 void axpy_bf16(float alpha, const uint16_t* x, int64_t n, float* y) {
  __m512 a = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += kW) {
    __mmask16 m = first(std::min(kW, n - i));
    const __m512 v = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i)), 16));
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(a, v, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

}  // namespace ops_impl::avx512

#pragma GCC diagnostic pop

namespace ops_impl {

bool use_avx512() {
  static const bool yes = simd::isa_supported(simd::Isa::kAvx512);
  return yes;
}

}  // namespace ops_impl

using ops_impl::use_avx512;

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  if (use_avx512()) return ops_impl::avx512::rms_norm(x, w, n_rows, n, eps, y);
  ops_impl::scalar::rms_norm(x, w, n_rows, n, eps, y);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (use_avx512()) return ops_impl::avx512::silu_mul(gate, up, n, out);
  ops_impl::scalar::silu_mul(gate, up, n, out);
}

void softmax(float* x, int64_t n) {
  if (use_avx512()) {
    ops_impl::avx512::softmax(x, n);
    return;
  }
  ops_impl::scalar::softmax(x, n);
}

int64_t argmax_finite(const float* x, int64_t n) {
  if (use_avx512()) return ops_impl::avx512::argmax_finite(x, n);
  return ops_impl::scalar::argmax_finite(x, n);
}

int64_t first_above(const float* x, int64_t n, float t) {
  if (use_avx512()) return ops_impl::avx512::first_above(x, n, t);
  return ops_impl::scalar::first_above(x, n, t);
}

int64_t indices_at_least(const float* x, int64_t n, float t, int32_t* ids) {
  if (use_avx512()) return ops_impl::avx512::indices_at_least(x, n, t, ids);
  return ops_impl::scalar::indices_at_least(x, n, t, ids);
}

double exp_scaled(const float* x, int64_t n, float t, float m, float* y, double* block_sums) {
  if (use_avx512()) return ops_impl::avx512::exp_scaled(x, n, t, m, y, block_sums);
  return ops_impl::scalar::exp_scaled(x, n, t, m, y, block_sums);
}

float dot(const float* a, const float* b, int64_t n) {
  if (use_avx512()) return ops_impl::avx512::dot(a, b, n);
  return ops_impl::scalar::dot(a, b, n);
}

void axpy(float alpha, const float* x, int64_t n, float* y) {
  if (use_avx512()) return ops_impl::avx512::axpy(alpha, x, n, y);
  ops_impl::scalar::axpy(alpha, x, n, y);
}

void add_inplace(const float* x, int64_t n, float* y) {
  if (use_avx512()) return ops_impl::avx512::add_inplace(x, n, y);
  ops_impl::scalar::add_inplace(x, n, y);
}

void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y) {
  if (use_avx512()) return ops_impl::avx512::f32_to_bf16_row(x, n, y);
  ops_impl::scalar::f32_to_bf16_row(x, n, y);
}

void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y) {
  if (use_avx512()) return ops_impl::avx512::bf16_to_f32_row(x, n, y);
  ops_impl::scalar::bf16_to_f32_row(x, n, y);
}

void axpy_bf16(float alpha, const uint16_t* x, int64_t n, float* y) {
  if (use_avx512()) return ops_impl::avx512::axpy_bf16(alpha, x, n, y);
  ops_impl::scalar::axpy_bf16(alpha, x, n, y);
}

}  // namespace duet
