#include "kernels/attend.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/ops_impl.h"
#include "kernels/simd_impl.h"

namespace duet {

namespace {

int64_t n_positions(const std::vector<KvSpan>& spans) {
  int64_t n = 0;
  for (const KvSpan& s : spans) n += s.n;
  return n;
}

void check_shape(const AttendShape& a, int64_t n_ctx) {
  DUET_CHECK(a.n_q >= 1 && a.k_dim >= 1 && a.v_dim >= 1 && a.ldq >= a.k_dim && a.ldo >= a.v_dim &&
                 n_ctx >= 1,
             "attend: n_q " << a.n_q << " k_dim " << a.k_dim << " v_dim " << a.v_dim << " ldq "
                            << a.ldq << " ldo " << a.ldo << " positions " << n_ctx);
}

}  // namespace

void attend_scalar(const AttendShape& a, const float* q, const std::vector<KvSpan>& spans,
                   float* out, std::vector<float>& scores) {
  const int64_t n_ctx = n_positions(spans);
  check_shape(a, n_ctx);
  scores.resize(static_cast<size_t>(a.n_q * n_ctx));
  for (int64_t h = 0; h < a.n_q; ++h) {
    const float* qh = q + h * a.ldq;
    float* s = scores.data() + h * n_ctx;
    int64_t j = 0;
    for (const KvSpan& sp : spans) {
      for (int64_t i = 0; i < sp.n; ++i, ++j) {
        s[j] = ops_impl::scalar::dot(qh, sp.k + i * sp.k_stride, a.k_dim) * a.scale;
      }
    }
    ops_impl::scalar::softmax(s, n_ctx);
    std::vector<double> acc(static_cast<size_t>(a.v_dim), 0.0);
    j = 0;
    for (const KvSpan& sp : spans) {
      for (int64_t i = 0; i < sp.n; ++i, ++j) {
        const float* vj = sp.v + i * sp.v_stride;
        for (int64_t d = 0; d < a.v_dim; ++d) acc[d] += double(s[j]) * double(vj[d]);
      }
    }
    for (int64_t d = 0; d < a.v_dim; ++d) out[h * a.ldo + d] = static_cast<float>(acc[d]);
  }
}

// GCC 12 warns about its own AVX-512 intrinsics; see simd_impl.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

using S = simd::Avx512;
constexpr int64_t kW = S::kWidth;
constexpr int kMaxHeads = 4;   // query heads per pass over the keys (accumulators per position)
constexpr int kValueVecs = 4;  // value vectors per pass: kMaxHeads × 4 accumulators
constexpr int kPosBlock = 4;   // positions per pass over a query: kMaxHeads × 4 accumulators
constexpr int64_t kAhead = 16;  // positions prefetched ahead, into L2

DUET_TARGET_AVX512 inline __mmask16 lanes(int64_t n) {
  return n >= kW ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : S::first(static_cast<int>(n));
}

DUET_TARGET_AVX512 inline void prefetch_row(const float* row, int64_t n) {
  for (int64_t d = 0; d < n; d += kW)
    _mm_prefetch(reinterpret_cast<const char*>(row + d), _MM_HINT_T1);
}

// acc[jj][g] += q[g, d : d + n) · k_jj[d : d + n) for J positions and G heads; n == kW unless
// kPart (then m masks the n lanes).
template <int G, int J, bool kPart>
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE void scores_step(__m512 (&acc)[J][G], const float* q,
                                                       int64_t ldq, const float* k,
                                                       int64_t k_stride, int64_t d, __mmask16 m) {
  __m512 kv[J];
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
    kv[jj] = kPart ? _mm512_maskz_loadu_ps(m, k + jj * k_stride + d)
                   : _mm512_loadu_ps(k + jj * k_stride + d);
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const __m512 qv =
        kPart ? _mm512_maskz_loadu_ps(m, q + g * ldq + d) : _mm512_loadu_ps(q + g * ldq + d);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) acc[jj][g] = _mm512_fmadd_ps(qv, kv[jj], acc[jj][g]);
  }
}

// s[g * lds + jj] = scale · q[g] · k_jj for J positions from k and G heads. Each key vector is
// loaded once for the G heads, each query vector once for the J positions.
template <int G, int J>
DUET_TARGET_AVX512 void scores_block(const float* q, int64_t ldq, int64_t k_dim, const float* k,
                                     int64_t k_stride, float scale, float* s, int64_t lds) {
  __m512 acc[J][G];
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[jj][g] = S::zero();
  }
  int64_t d = 0;
  for (; d + kW <= k_dim; d += kW) scores_step<G, J, false>(acc, q, ldq, k, k_stride, d, 0);
  if (d < k_dim) scores_step<G, J, true>(acc, q, ldq, k, k_stride, d, lanes(k_dim - d));
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
    if constexpr (G == 4) {
      alignas(16) float v[4];
      _mm_store_ps(v, _mm_mul_ps(S::hsum4(acc[jj][0], acc[jj][1], acc[jj][2], acc[jj][3]),
                                 _mm_set1_ps(scale)));
      for (int g = 0; g < 4; ++g) s[g * lds + jj] = v[g];
    } else {
      for (int g = 0; g < G; ++g) s[g * lds + jj] = S::hsum(acc[jj][g]) * scale;
    }
  }
}

// s[g * lds + j] = scale · q[g] · k_j for the span's positions j and G heads, kPosBlock at a
// time.
template <int G>
DUET_TARGET_AVX512 void span_scores(const float* q, int64_t ldq, int64_t k_dim, const KvSpan& sp,
                                    float scale, float* s, int64_t lds) {
  int64_t j = 0;
  for (; j + kPosBlock <= sp.n; j += kPosBlock) {
    const float* kj = sp.k + j * sp.k_stride;
    for (int64_t i = kAhead; i < kAhead + kPosBlock && j + i < sp.n; ++i) {
      prefetch_row(kj + i * sp.k_stride, k_dim);
    }
    scores_block<G, kPosBlock>(q, ldq, k_dim, kj, sp.k_stride, scale, s + j, lds);
  }
  for (; j < sp.n; ++j) {
    scores_block<G, 1>(q, ldq, k_dim, sp.k + j * sp.k_stride, 0, scale, s + j, lds);
  }
}

// out[g * ldo + d0 + :kValueVecs·kW] += Σ_j p[g * ldp + j] · v_j[d0 + ...] over the span, for
// g < G; lanes at or past v_dim are neither read nor written.
template <int G>
DUET_TARGET_AVX512 void span_values(const float* p, int64_t ldp, const KvSpan& sp, int64_t d0,
                                    int64_t v_dim, float* out, int64_t ldo) {
  __mmask16 m[kValueVecs];
#pragma GCC unroll 4
  for (int c = 0; c < kValueVecs; ++c) m[c] = lanes(v_dim - d0 - c * kW);
  __m512 acc[G][kValueVecs];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < kValueVecs; ++c) {
      acc[g][c] = _mm512_maskz_loadu_ps(m[c], out + g * ldo + d0 + c * kW);
    }
  }
  const int64_t span_dim = std::min<int64_t>(kValueVecs * kW, v_dim - d0);
  for (int64_t j = 0; j < sp.n; ++j) {
    const float* vj = sp.v + j * sp.v_stride + d0;
    if (j + kAhead < sp.n) prefetch_row(vj + kAhead * sp.v_stride, span_dim);
    __m512 vv[kValueVecs];
#pragma GCC unroll 4
    for (int c = 0; c < kValueVecs; ++c) vv[c] = _mm512_maskz_loadu_ps(m[c], vj + c * kW);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g * ldp + j]);
#pragma GCC unroll 4
      for (int c = 0; c < kValueVecs; ++c) acc[g][c] = _mm512_fmadd_ps(pg, vv[c], acc[g][c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < kValueVecs; ++c) {
      _mm512_mask_storeu_ps(out + g * ldo + d0 + c * kW, m[c], acc[g][c]);
    }
  }
}

// attend() for G query heads.
template <int G>
DUET_TARGET_AVX512 void attend_heads(const AttendShape& a, const float* q,
                                     const std::vector<KvSpan>& spans, int64_t n_ctx, float* s,
                                     float* out) {
  int64_t j0 = 0;
  for (const KvSpan& sp : spans) {
    span_scores<G>(q, a.ldq, a.k_dim, sp, a.scale, s + j0, n_ctx);
    j0 += sp.n;
  }
  for (int g = 0; g < G; ++g) ops_impl::avx512::softmax(s + g * n_ctx, n_ctx);
  for (int64_t d0 = 0; d0 < a.v_dim; d0 += kValueVecs * kW) {
    for (int g = 0; g < G; ++g) {
      std::fill_n(out + g * a.ldo + d0, std::min<int64_t>(kValueVecs * kW, a.v_dim - d0), 0.0f);
    }
    j0 = 0;
    for (const KvSpan& sp : spans) {
      span_values<G>(s + j0, n_ctx, sp, d0, a.v_dim, out, a.ldo);
      j0 += sp.n;
    }
  }
}

DUET_TARGET_AVX512 void attend_avx512(const AttendShape& a, const float* q,
                                      const std::vector<KvSpan>& spans, float* out,
                                      std::vector<float>& scores) {
  const int64_t n_ctx = n_positions(spans);
  check_shape(a, n_ctx);
  scores.resize(static_cast<size_t>(a.n_q * n_ctx));
  for (int64_t h = 0; h < a.n_q; h += kMaxHeads) {
    const float* qh = q + h * a.ldq;
    float* s = scores.data() + h * n_ctx;
    float* oh = out + h * a.ldo;
    switch (std::min<int64_t>(kMaxHeads, a.n_q - h)) {
      case 1:
        attend_heads<1>(a, qh, spans, n_ctx, s, oh);
        break;
      case 2:
        attend_heads<2>(a, qh, spans, n_ctx, s, oh);
        break;
      case 3:
        attend_heads<3>(a, qh, spans, n_ctx, s, oh);
        break;
      default:
        attend_heads<4>(a, qh, spans, n_ctx, s, oh);
        break;
    }
  }
}

}  // namespace

#pragma GCC diagnostic pop

void attend(const AttendShape& shape, const float* q, const std::vector<KvSpan>& spans, float* out,
            std::vector<float>& scores) {
  static const bool avx512 = simd::isa_supported(simd::Isa::kAvx512);
  if (avx512) return attend_avx512(shape, q, spans, out, scores);
  attend_scalar(shape, q, spans, out, scores);
}

}  // namespace duet
