// Private to attend_pairs.cpp: attention over bf16 K/V rows with products of bf16 pairs, written
// once against a vector interface.
//
// No include guard: attend_pairs.cpp instantiates it once per interface that multiplies
// bf16 pairs (kernels/pairs_instances.h), with S the interface and DUET_SIMD_TARGET its target
// attribute.
//
// The numerics are FlashAttention's on bf16 inputs: each query row is rounded to bf16 once, so
// q · k is a sum of exact products of bf16 pairs (adjacent dims) in f32; the softmax runs in f32
// on those scores; its probabilities are rounded to bf16, so p · V is a sum of exact products of
// pairs too, the pairs being positions (2m, 2m + 1): their value rows are interleaved element by
// element in registers (vpunpck{l,h}wd), which leaves each accumulator's
// lanes holding dims in the order
//   lo: dims 8c + i of 128-bit lane c (i < 4),   hi: dims 8c + 4 + i,
// put back in order once per row at the end. Against the f32 kernels (attend.cpp), half the
// multiply instructions and no widening of the rows.
//
// A row's result does not depend on the rows it runs with, on how many positions a block of
// causal rows holds past its own, nor on where the spans cut the positions: the pairs are
// positions (2m, 2m + 1), and a row's probability for a position it does not see is 0.

using V = __m512;

constexpr int kPairW = S::kPairWidth;  // bf16 elements per vector: 32
constexpr int kSliceVecs = 2;          // 32-dim chunks of values per pass: 4 accumulators per row

// The mask of the first n (clamped to [0, 32]) bf16 elements of a vector.
DUET_SIMD_TARGET DUET_ALWAYS_INLINE __mmask32 pair_lanes(int64_t n) {
  return n >= kPairW ? ~__mmask32{0} : n <= 0 ? __mmask32{0} : (__mmask32{1} << n) - 1u;
}

DUET_SIMD_TARGET DUET_ALWAYS_INLINE V load_bf16(const uint16_t* p, __mmask32 m) {
  return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, p));
}

// acc[jj][g] = Σ over k_dim of q[g] · k_jj, in pairs, for J positions from k and G rows (q rows
// rounded and zero-padded to whole vectors), then the scores stored as attend_impl::store_scores.
template <int G, int J>
DUET_SIMD_TARGET void scores_block(const uint16_t* const* q, float* const* s, int64_t j,
                                   int64_t k_dim, const uint16_t* k, int64_t k_stride,
                                   float scale) {
  V acc[J][G];
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[jj][g] = S::zero();
  }
  for (int64_t d = 0; d < k_dim; d += kPairW) {
    const __mmask32 m = pair_lanes(k_dim - d);
    V kv[J];
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) kv[jj] = load_bf16(k + jj * k_stride + d, m);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const V qv = S::load_pairs(q[g] + d);
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) acc[jj][g] = S::dpbf16(acc[jj][g], qv, kv[jj]);
    }
  }
  attend_impl::store_scores<G, J>(acc, s, j, scale);
}

// scores_block<·, J> for every row, kMaxRows at a time.
template <int J>
DUET_SIMD_TARGET void scores_rows(const uint16_t* const* q, float* const* s, int64_t n_rows,
                                  int64_t j, int64_t k_dim, const uint16_t* k, int64_t k_stride,
                                  float scale) {
  constexpr int kR = attend_impl::kMaxRows;
  int64_t r = 0;
  for (; r + kR <= n_rows; r += kR) scores_block<kR, J>(q + r, s + r, j, k_dim, k, k_stride, scale);
  switch (n_rows - r) {
    case 1:
      scores_block<1, J>(q + r, s + r, j, k_dim, k, k_stride, scale);
      break;
    case 2:
      scores_block<2, J>(q + r, s + r, j, k_dim, k, k_stride, scale);
      break;
    case 3:
      scores_block<3, J>(q + r, s + r, j, k_dim, k, k_stride, scale);
      break;
    default:
      break;
  }
}

// s[r][j0 + j] for the span's positions j and every row, kPosBlock positions at a time, with
// the prefetches of the f32 kernel (attend.cpp: span_scores); value rows too where v_dim_ahead
// is not 0 (attend_impl::values_ahead).
DUET_SIMD_TARGET void span_scores(const uint16_t* const* q, float* const* s, int64_t n_rows,
                                  int64_t k_dim, const KvSpan& sp, const KvSpan* next, int64_t j0,
                                  float scale, int64_t v_dim_ahead) {
  using attend_impl::k_row;
  using attend_impl::kAhead;
  using attend_impl::v_row;
  constexpr int kJ = attend_impl::kPosBlock;
  if (next) {
    for (int64_t i = 0; i < std::min(kAhead, next->n); ++i) {
      attend_impl::prefetch_row(k_row<uint16_t>(*next, i), k_dim);
      if (v_dim_ahead) attend_impl::prefetch_row(v_row<uint16_t>(*next, i), v_dim_ahead);
    }
  }
  int64_t j = 0;
  for (; j + kJ <= sp.n; j += kJ) {
    const uint16_t* kj = k_row<uint16_t>(sp, j);
    for (int64_t i = kAhead; i < kAhead + kJ && j + i < sp.n; ++i) {
      attend_impl::prefetch_row(kj + i * sp.k_stride, k_dim);
      if (v_dim_ahead) attend_impl::prefetch_row(v_row<uint16_t>(sp, j + i), v_dim_ahead);
    }
    scores_rows<kJ>(q, s, n_rows, j0 + j, k_dim, kj, sp.k_stride, scale);
  }
  for (; j < sp.n; ++j) {
    scores_rows<1>(q, s, n_rows, j0 + j, k_dim, k_row<uint16_t>(sp, j), 0, scale);
  }
}

// acc[g][d0 + ...] (the lo/hi order above) += Σ p[g][j] · v_j[d0 + ...] over the positions
// [jb, je) in pairs from jb (even), for kSliceVecs chunks of 32 dims from d0 and G rows; rows[j]
// is position j's value row, wherever the spans put it. p rows are bf16 with a 0 past their end;
// a pair's missing second row (an odd n_ctx's last position) is zeros. With prefetch_dim, the
// first prefetch_dim elements of the rows kAhead positions on are prefetched.
template <int G>
DUET_SIMD_TARGET void values_block(const uint16_t* const* p, float* const* acc_rows,
                                   const uint16_t* const* rows, int64_t n_ctx, int64_t jb,
                                   int64_t je, int64_t d0, int64_t v_dim, int64_t prefetch_dim) {
  using attend_impl::kAhead;
  __mmask32 m[kSliceVecs];
#pragma GCC unroll 2
  for (int c = 0; c < kSliceVecs; ++c) m[c] = pair_lanes(v_dim - d0 - c * kPairW);
  V acc[G][2 * kSliceVecs];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < 2 * kSliceVecs; ++c) acc[g][c] = S::load(acc_rows[g] + d0 + c * S::kWidth);
  }
  for (int64_t j = jb; j < je; j += 2) {
    const uint16_t* v0 = rows[j] + d0;
    const bool pair = j + 1 < je;
    const uint16_t* v1 = pair ? rows[j + 1] + d0 : nullptr;
    if (prefetch_dim) {
      for (int64_t i = j + kAhead; i < std::min(j + 2 + kAhead, n_ctx); ++i) {
        attend_impl::prefetch_row(rows[i], prefetch_dim);
      }
    }
    V lo[kSliceVecs], hi[kSliceVecs];
#pragma GCC unroll 2
    for (int c = 0; c < kSliceVecs; ++c) {
      const __m512i a = _mm512_castps_si512(load_bf16(v0 + c * kPairW, m[c]));
      const __m512i b =
          pair ? _mm512_castps_si512(load_bf16(v1 + c * kPairW, m[c])) : _mm512_setzero_si512();
      lo[c] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(a, b));
      hi[c] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(a, b));
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const V pg = S::set1_pair(p[g] + j);
#pragma GCC unroll 2
      for (int c = 0; c < kSliceVecs; ++c) {
        acc[g][2 * c] = S::dpbf16(acc[g][2 * c], lo[c], pg);
        acc[g][2 * c + 1] = S::dpbf16(acc[g][2 * c + 1], hi[c], pg);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < 2 * kSliceVecs; ++c) S::store(acc_rows[g] + d0 + c * S::kWidth, acc[g][c]);
  }
}

// values_block for every row and slice over positions [0, n_ctx), attend_impl::kValueBlock
// positions at a time: their value rows stay in cache across the rows and slices, so each is
// read from memory once. Pairs are positions (2m, 2m + 1) whatever the spans, so that a paged
// store (a span per block) sums in the order a contiguous one does.
DUET_SIMD_TARGET void values(const uint16_t* const* p, float* const* acc, int64_t n_rows,
                             const uint16_t* const* rows, int64_t n_ctx, int64_t v_dim) {
  constexpr int kR = attend_impl::kMaxRows;
  for (int64_t jb = 0; jb < n_ctx; jb += attend_impl::kValueBlock) {
    const int64_t je = std::min(n_ctx, jb + attend_impl::kValueBlock);
    for (int64_t d0 = 0; d0 < v_dim; d0 += kSliceVecs * kPairW) {
      const int64_t pf = d0 == 0 ? v_dim : 0;  // by the first pass over a position
      int64_t r = 0;
      for (; r + kR <= n_rows; r += kR) {
        values_block<kR>(p + r, acc + r, rows, n_ctx, jb, je, d0, v_dim, r == 0 ? pf : 0);
      }
      const int64_t pf_r = r == 0 ? pf : 0;
      switch (n_rows - r) {
        case 1:
          values_block<1>(p + r, acc + r, rows, n_ctx, jb, je, d0, v_dim, pf_r);
          break;
        case 2:
          values_block<2>(p + r, acc + r, rows, n_ctx, jb, je, d0, v_dim, pf_r);
          break;
        case 3:
          values_block<3>(p + r, acc + r, rows, n_ctx, jb, je, d0, v_dim, pf_r);
          break;
        default:
          break;
      }
    }
  }
}

// out[0 : v_dim) = acc's sums in dim order (the lo/hi order above undone, 32 dims at a time).
DUET_SIMD_TARGET void store_in_order(const float* acc, int64_t v_dim, float* out) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t d = 0; d < v_dim; d += kPairW) {
    const V lo = S::load(acc + d), hi = S::load(acc + d + S::kWidth);
    const int64_t n = v_dim - d;
    _mm512_mask_storeu_ps(out + d, S::first(static_cast<int>(std::min<int64_t>(n, S::kWidth))),
                          _mm512_permutex2var_ps(lo, first, hi));
    if (n > S::kWidth) {
      _mm512_mask_storeu_ps(out + d + S::kWidth,
                            S::first(static_cast<int>(std::min<int64_t>(n - S::kWidth, S::kWidth))),
                            _mm512_permutex2var_ps(lo, second, hi));
    }
  }
}

DUET_SIMD_TARGET void attend(const AttendShape& a, const float* q, const std::vector<KvSpan>& spans,
                             float* out, std::vector<float>& scores, float* lse) {
  const int64_t n_ctx = attend_impl::n_positions(spans);
  attend_impl::check_shape(a, n_ctx);
  const int64_t n_rows = a.n_t * a.n_q;
  const int64_t k_ld = (a.k_dim + kPairW - 1) / kPairW * kPairW;  // q rows, zero-padded
  const int64_t p_ld = n_ctx + 2;  // probability rows, a 0 past the end for a last odd pair
  const int64_t acc_ld = (a.v_dim + kSliceVecs * kPairW - 1) / (kSliceVecs * kPairW) * kSliceVecs *
                         kPairW;  // whole slices
  scores.resize(static_cast<size_t>(n_rows * n_ctx));
  thread_local std::vector<uint16_t> q_buf, p_buf;  // [n_rows, k_ld], [n_rows, p_ld] bf16
  thread_local std::vector<float> acc_buf;          // [n_rows, acc_ld] f32
  thread_local std::vector<const uint16_t*> q_rows, p_rows;
  thread_local std::vector<float*> s_rows, acc_rows;
  q_buf.resize(static_cast<size_t>(n_rows * k_ld));
  p_buf.resize(static_cast<size_t>(n_rows * p_ld));
  acc_buf.assign(static_cast<size_t>(n_rows * acc_ld), 0.0f);
  q_rows.resize(static_cast<size_t>(n_rows));
  p_rows.resize(q_rows.size());
  s_rows.resize(q_rows.size());
  acc_rows.resize(q_rows.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    matmul_impl::round_row(attend_impl::q_row(a, q, r), a.k_dim, q_buf.data() + r * k_ld, k_ld);
    q_rows[r] = q_buf.data() + r * k_ld;
    p_rows[r] = p_buf.data() + r * p_ld;
    s_rows[r] = scores.data() + r * n_ctx;
    acc_rows[r] = acc_buf.data() + r * acc_ld;
  }
  const int64_t v_ahead = attend_impl::values_ahead(spans, n_ctx, a.v_dim);
  int64_t j0 = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const KvSpan* next = i + 1 < spans.size() ? &spans[i + 1] : nullptr;
    span_scores(q_rows.data(), s_rows.data(), n_rows, a.k_dim, spans[i], next, j0, a.scale,
                v_ahead);
    j0 += spans[i].n;
  }
  // Positions a row must not see get probability 0: its sums gain exactly 0 from them.
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t n = attend_impl::visible(a, n_ctx, r);
    const float row_lse = ops_impl::avx512::softmax(s_rows[r], n);
    if (lse) lse[r] = row_lse;
    std::fill(s_rows[r] + n, s_rows[r] + n_ctx, 0.0f);
    matmul_impl::round_row(s_rows[r], n_ctx, p_buf.data() + r * p_ld, p_ld);
  }
  thread_local std::vector<const uint16_t*> v_rows;  // [n_ctx] each position's value row
  v_rows.resize(static_cast<size_t>(n_ctx));
  j0 = 0;
  for (const KvSpan& sp : spans) {
    for (int64_t i = 0; i < sp.n; ++i) v_rows[j0 + i] = attend_impl::v_row<uint16_t>(sp, i);
    j0 += sp.n;
  }
  values(p_rows.data(), acc_rows.data(), n_rows, v_rows.data(), n_ctx, a.v_dim);
  for (int64_t r = 0; r < n_rows; ++r) {
    store_in_order(acc_rows[r], a.v_dim, attend_impl::out_row(a, out, r));
  }
}
