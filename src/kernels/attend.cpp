#include "kernels/attend.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/attend_impl.h"
#include "kernels/ops_impl.h"
#include "kernels/simd_impl.h"

namespace duet {

namespace {

using attend_impl::check_shape;
using attend_impl::k_row;
using attend_impl::n_positions;
using attend_impl::out_row;
using attend_impl::q_row;
using attend_impl::v_row;
using attend_impl::visible;

// The KV element types: f32 rows are read as they are, bf16 rows (uint16_t) widened exactly.
inline float widen(float x) {
  return x;
}
inline float widen(uint16_t x) {
  return bf16_to_f32(x);
}

// Calls f(T{}) with T the span's element type: float or uint16_t (bf16).
template <typename F>
void by_dtype(const KvSpan& sp, F&& f) {
  DUET_CHECK(sp.dtype == DType::kF32 || sp.dtype == DType::kBF16,
             "attend: KV rows of dtype " << dtype_name(sp.dtype));
  if (sp.dtype == DType::kBF16) {
    f(uint16_t{});
  } else {
    f(float{});
  }
}

// s[i] = scale · q · k_i for the span's first n positions (sum in double, as
// ops_impl::scalar::dot).
template <typename T>
void scalar_scores(const float* q, const KvSpan& sp, int64_t n, int64_t k_dim, float scale,
                   float* s) {
  for (int64_t i = 0; i < n; ++i) {
    const T* k = k_row<T>(sp, i);
    double acc = 0;
    for (int64_t d = 0; d < k_dim; ++d) acc += double(q[d]) * double(widen(k[d]));
    s[i] = static_cast<float>(acc) * scale;
  }
}

// acc[:v_dim] += Σ_i p[i] · v_i over the span's first n positions.
template <typename T>
void scalar_values(const float* p, const KvSpan& sp, int64_t n, int64_t v_dim, double* acc) {
  for (int64_t i = 0; i < n; ++i) {
    const T* v = v_row<T>(sp, i);
    for (int64_t d = 0; d < v_dim; ++d) acc[d] += double(p[i]) * double(widen(v[d]));
  }
}

}  // namespace

void attend_scalar(const AttendShape& a, const float* q, const std::vector<KvSpan>& spans,
                   float* out, std::vector<float>& scores, float* lse) {
  const int64_t n_ctx = n_positions(spans);
  check_shape(a, n_ctx);
  scores.resize(static_cast<size_t>(a.n_t * a.n_q * n_ctx));
  std::vector<double> acc(static_cast<size_t>(a.v_dim));
  for (int64_t r = 0; r < a.n_t * a.n_q; ++r) {
    const float* qr = q_row(a, q, r);
    const int64_t n = visible(a, n_ctx, r);
    float* s = scores.data() + r * n_ctx;
    int64_t j = 0;
    for (const KvSpan& sp : spans) {
      const int64_t m = std::min(sp.n, n - j);
      if (m <= 0) continue;
      by_dtype(sp, [&](auto t) { scalar_scores<decltype(t)>(qr, sp, m, a.k_dim, a.scale, s + j); });
      j += m;
    }
    const float row_lse = ops_impl::scalar::softmax(s, n);
    if (lse) lse[r] = row_lse;
    std::fill(acc.begin(), acc.end(), 0.0);
    j = 0;
    for (const KvSpan& sp : spans) {
      const int64_t m = std::min(sp.n, n - j);
      if (m <= 0) continue;
      by_dtype(sp, [&](auto t) { scalar_values<decltype(t)>(s + j, sp, m, a.v_dim, acc.data()); });
      j += m;
    }
    float* o = out_row(a, out, r);
    for (int64_t d = 0; d < a.v_dim; ++d) o[d] = static_cast<float>(acc[d]);
  }
}

// GCC 12 warns about its own AVX-512 intrinsics; see simd_impl.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

using S = simd::Avx512;
using attend_impl::kAhead;
using attend_impl::kMaxRows;
using attend_impl::kPosBlock;
using attend_impl::kValueBlock;  // 64 positions' value slices: 16 KB at head_dim 128
using attend_impl::prefetch_row;
constexpr int64_t kW = S::kWidth;
constexpr int kValueVecs = 4;  // value vectors per pass: kMaxRows × 4 accumulators

// Where each query row (position i · n_q + head) reads its query and writes its scores and
// output: [n_t * n_q] pointers each.
struct RowPtrs {
  std::vector<const float*> q;
  std::vector<float*> s;
  std::vector<float*> o;
};

DUET_TARGET_AVX512 inline __mmask16 lanes(int64_t n) {
  return n >= kW ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : S::first(static_cast<int>(n));
}

// 16 KV elements as f32 lanes: f32 loaded, bf16 widened in the register (exact, so a bf16 row
// gives the same sums as an f32 row holding its widened values). The masked forms read only
// the lanes of m and zero the others.
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE __m512 load_kv(const float* p) {
  return _mm512_loadu_ps(p);
}
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE __m512 load_kv(const uint16_t* p) {
  return S::load(p);
}
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE __m512 load_kv(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE __m512 load_kv(const uint16_t* p, __mmask16 m) {
  return S::widen(_mm256_maskz_loadu_epi16(m, p));
}

// acc[jj][g] += q[g][d : d + n) · k_jj[d : d + n) for J positions and G rows; n == kW unless
// kPart (then m masks the n lanes).
template <int G, int J, bool kPart, typename T>
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE void scores_step(__m512 (&acc)[J][G], const float* const* q,
                                                       const T* k, int64_t k_stride, int64_t d,
                                                       __mmask16 m) {
  __m512 kv[J];
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
    kv[jj] = kPart ? load_kv(k + jj * k_stride + d, m) : load_kv(k + jj * k_stride + d);
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const __m512 qv = kPart ? _mm512_maskz_loadu_ps(m, q[g] + d) : _mm512_loadu_ps(q[g] + d);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) acc[jj][g] = _mm512_fmadd_ps(qv, kv[jj], acc[jj][g]);
  }
}

// s[g][j + jj] = scale · q[g] · k_jj for J positions from k and G rows. Each key vector is
// loaded once for the G rows, each query vector once for the J positions.
template <int G, int J, typename T>
DUET_TARGET_AVX512 void scores_block(const float* const* q, float* const* s, int64_t j,
                                     int64_t k_dim, const T* k, int64_t k_stride, float scale) {
  __m512 acc[J][G];
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[jj][g] = S::zero();
  }
  int64_t d = 0;
  for (; d + kW <= k_dim; d += kW) scores_step<G, J, false>(acc, q, k, k_stride, d, 0);
  if (d < k_dim) scores_step<G, J, true>(acc, q, k, k_stride, d, lanes(k_dim - d));
  attend_impl::store_scores<G, J>(acc, s, j, scale);
}

// scores_block<·, J> for every row, kMaxRows at a time: the J keys stay in L1 across the rows.
template <int J, typename T>
DUET_TARGET_AVX512 void scores_rows(const RowPtrs& rows, int64_t n_rows, int64_t j, int64_t k_dim,
                                    const T* k, int64_t k_stride, float scale) {
  int64_t r = 0;
  for (; r + kMaxRows <= n_rows; r += kMaxRows) {
    scores_block<kMaxRows, J>(&rows.q[r], &rows.s[r], j, k_dim, k, k_stride, scale);
  }
  switch (n_rows - r) {
    case 1:
      scores_block<1, J>(&rows.q[r], &rows.s[r], j, k_dim, k, k_stride, scale);
      break;
    case 2:
      scores_block<2, J>(&rows.q[r], &rows.s[r], j, k_dim, k, k_stride, scale);
      break;
    case 3:
      scores_block<3, J>(&rows.q[r], &rows.s[r], j, k_dim, k, k_stride, scale);
      break;
    default:
      break;
  }
}

// s[r][j0 + j] = scale · q[r] · k_j for the span's positions j and every row, kPosBlock
// positions at a time. The first kAhead keys of the next span (null: none; of the same dtype)
// are prefetched first: a paged KV cache hands out a span per block of 16 positions, and the
// prefetch inside a span alone never reached the next block. Where v_dim_ahead is not 0, the
// first v_dim_ahead elements of each value row are prefetched beside its key
// (attend_impl::values_ahead).
template <typename T>
DUET_TARGET_AVX512 void span_scores(const RowPtrs& rows, int64_t n_rows, int64_t k_dim,
                                    const KvSpan& sp, const KvSpan* next, int64_t j0, float scale,
                                    int64_t v_dim_ahead) {
  if (next) {
    for (int64_t i = 0; i < std::min(kAhead, next->n); ++i) {
      prefetch_row(k_row<T>(*next, i), k_dim);
      if (v_dim_ahead) prefetch_row(v_row<T>(*next, i), v_dim_ahead);
    }
  }
  int64_t j = 0;
  for (; j + kPosBlock <= sp.n; j += kPosBlock) {
    const T* kj = k_row<T>(sp, j);
    for (int64_t i = kAhead; i < kAhead + kPosBlock && j + i < sp.n; ++i) {
      prefetch_row(kj + i * sp.k_stride, k_dim);
      if (v_dim_ahead) prefetch_row(v_row<T>(sp, j + i), v_dim_ahead);
    }
    scores_rows<kPosBlock>(rows, n_rows, j0 + j, k_dim, kj, sp.k_stride, scale);
  }
  for (; j < sp.n; ++j) {
    scores_rows<1>(rows, n_rows, j0 + j, k_dim, k_row<T>(sp, j), 0, scale);
  }
}

// o[g][d0 + :kValueVecs·kW] += Σ_j p[g][j0 + j] · v_j[d0 + ...] over the span's positions
// [jb, je), for g < G; lanes at or past v_dim are neither read nor written.
template <int G, typename T>
DUET_TARGET_AVX512 void values_block(float* const* p, float* const* o, const KvSpan& sp, int64_t j0,
                                     int64_t jb, int64_t je, int64_t d0, int64_t v_dim,
                                     bool prefetch) {
  __mmask16 m[kValueVecs];
#pragma GCC unroll 4
  for (int c = 0; c < kValueVecs; ++c) m[c] = lanes(v_dim - d0 - c * kW);
  __m512 acc[G][kValueVecs];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < kValueVecs; ++c) {
      acc[g][c] = _mm512_maskz_loadu_ps(m[c], o[g] + d0 + c * kW);
    }
  }
  const int64_t span_dim = std::min<int64_t>(kValueVecs * kW, v_dim - d0);
  for (int64_t j = jb; j < je; ++j) {
    const T* vj = v_row<T>(sp, j) + d0;
    if (prefetch && j + kAhead < sp.n) prefetch_row(vj + kAhead * sp.v_stride, span_dim);
    __m512 vv[kValueVecs];
#pragma GCC unroll 4
    for (int c = 0; c < kValueVecs; ++c) vv[c] = load_kv(vj + c * kW, m[c]);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g][j0 + j]);
#pragma GCC unroll 4
      for (int c = 0; c < kValueVecs; ++c) acc[g][c] = _mm512_fmadd_ps(pg, vv[c], acc[g][c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < kValueVecs; ++c) {
      _mm512_mask_storeu_ps(o[g] + d0 + c * kW, m[c], acc[g][c]);
    }
  }
}

// values_block for every row over the span, kValueBlock positions at a time so that their value
// slices stay in L1 across the rows; the next span's first kAhead value slices prefetched first,
// as in span_scores.
template <typename T>
DUET_TARGET_AVX512 void span_values(const RowPtrs& rows, int64_t n_rows, const KvSpan& sp,
                                    const KvSpan* next, int64_t j0, int64_t d0, int64_t v_dim) {
  if (next) {
    const int64_t span_dim = std::min<int64_t>(kValueVecs * kW, v_dim - d0);
    for (int64_t i = 0; i < std::min(kAhead, next->n); ++i) {
      prefetch_row(v_row<T>(*next, i) + d0, span_dim);
    }
  }
  for (int64_t jb = 0; jb < sp.n; jb += kValueBlock) {
    const int64_t je = std::min(sp.n, jb + kValueBlock);
    int64_t r = 0;
    for (; r + kMaxRows <= n_rows; r += kMaxRows) {
      values_block<kMaxRows, T>(&rows.s[r], &rows.o[r], sp, j0, jb, je, d0, v_dim, r == 0);
    }
    const bool first = r == 0;
    switch (n_rows - r) {
      case 1:
        values_block<1, T>(&rows.s[r], &rows.o[r], sp, j0, jb, je, d0, v_dim, first);
        break;
      case 2:
        values_block<2, T>(&rows.s[r], &rows.o[r], sp, j0, jb, je, d0, v_dim, first);
        break;
      case 3:
        values_block<3, T>(&rows.s[r], &rows.o[r], sp, j0, jb, je, d0, v_dim, first);
        break;
      default:
        break;
    }
  }
}

DUET_TARGET_AVX512 void attend_avx512(const AttendShape& a, const float* q,
                                      const std::vector<KvSpan>& spans, float* out,
                                      std::vector<float>& scores, float* lse) {
  const int64_t n_ctx = n_positions(spans);
  check_shape(a, n_ctx);
  const int64_t n_rows = a.n_t * a.n_q;
  scores.resize(static_cast<size_t>(n_rows * n_ctx));
  thread_local RowPtrs rows;
  rows.q.resize(static_cast<size_t>(n_rows));
  rows.s.resize(static_cast<size_t>(n_rows));
  rows.o.resize(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    rows.q[r] = q_row(a, q, r);
    rows.s[r] = scores.data() + r * n_ctx;
    rows.o[r] = out_row(a, out, r);
  }
  const int64_t v_ahead = attend_impl::values_ahead(spans, n_ctx, a.v_dim);
  int64_t j0 = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const KvSpan& sp = spans[i];
    const KvSpan* next = i + 1 < spans.size() ? &spans[i + 1] : nullptr;
    by_dtype(sp, [&](auto t) {
      span_scores<decltype(t)>(rows, n_rows, a.k_dim, sp, next, j0, a.scale, v_ahead);
    });
    j0 += sp.n;
  }
  // Keys a row must not see get probability 0: its output gains exactly 0 · v from them.
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t n = visible(a, n_ctx, r);
    const float row_lse = ops_impl::avx512::softmax(rows.s[r], n);
    if (lse) lse[r] = row_lse;
    std::fill(rows.s[r] + n, rows.s[r] + n_ctx, 0.0f);
  }
  for (int64_t d0 = 0; d0 < a.v_dim; d0 += kValueVecs * kW) {
    for (int64_t r = 0; r < n_rows; ++r) {
      std::fill_n(rows.o[r] + d0, std::min<int64_t>(kValueVecs * kW, a.v_dim - d0), 0.0f);
    }
    j0 = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      const KvSpan& sp = spans[i];
      const KvSpan* next = i + 1 < spans.size() ? &spans[i + 1] : nullptr;
      by_dtype(sp,
               [&](auto t) { span_values<decltype(t)>(rows, n_rows, sp, next, j0, d0, a.v_dim); });
      j0 += sp.n;
    }
  }
}

}  // namespace

#pragma GCC diagnostic pop

void attend_with(simd::Isa isa, const AttendShape& shape, const float* q,
                 const std::vector<KvSpan>& spans, float* out, std::vector<float>& scores,
                 float* lse) {
  const bool bf16_rows = std::all_of(spans.begin(), spans.end(),
                                     [](const KvSpan& sp) { return sp.dtype == DType::kBF16; });
  if (simd::has_dpbf16(isa) && bf16_rows) {
    return attend_impl::attend_pairs(isa, shape, q, spans, out, scores, lse);
  }
  static const bool avx512 = simd::isa_supported(simd::Isa::kAvx512);
  if (avx512 && isa != simd::Isa::kScalar) {
    return attend_avx512(shape, q, spans, out, scores, lse);
  }
  attend_scalar(shape, q, spans, out, scores, lse);
}

void attend(const AttendShape& shape, const float* q, const std::vector<KvSpan>& spans, float* out,
            std::vector<float>& scores, float* lse) {
  attend_with(simd::bf16_isa(), shape, q, spans, out, scores, lse);
}

}  // namespace duet
