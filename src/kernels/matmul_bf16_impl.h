// Private to matmul_bf16.cpp: the kernels of matmul (y = x · wᵀ) for bf16 weights on an
// instruction set that multiplies bf16 pairs, written once against a vector interface.
//
// No include guard: matmul_bf16.cpp instantiates it once per interface that multiplies
// bf16 pairs (kernels/pairs_instances.h), with S the interface and DUET_SIMD_TARGET its target
// attribute.
//
// x comes rounded to bf16 (matmul_impl::round_x: contiguous rows, zero from cols to the row
// stride) and every product is S::dpbf16, which adds w[2i] · x[2i] + w[2i + 1] · x[2i + 1] into
// lane i of an f32 accumulator: nothing is widened, and there are half the multiply instructions
// of the f32 kernels (matmul_simd_impl.h, matmul_panel_impl.h), whose structure these follow.
// - Decode (matmul_rows_direct): dot products along k. A register block of kMmRows weight rows ×
//   kMmTokens tokens loads 2 · kW weights per vector in place, uses each for all its tokens, and
//   reduces its accumulators horizontally once at the end of k. At one token the rows are read
//   one after the other instead (dot_rows_one), with the same sums.
// - Prefill (matmul_rows_panel): outer products. A panel of kPanelRows weight rows is packed once
//   as bf16 pairs transposed as 32-bit lanes (pair p of row j in lane j of panel row p), then each
//   step loads kPanelVecs vectors of it and broadcasts one pair of x per token into accumulators
//   that hold a [tokens, rows] block of y.
// Odd k and partial vectors: weights past the end of a row load as zeros (masked loads), and x is
// zero there, so the last pair of an odd row multiplies (w, 0) by (x, 0).

using V = S::V;
constexpr int kW = S::kWidth;          // f32 accumulator lanes = bf16 pairs per vector
constexpr int kPairW = S::kPairWidth;  // bf16 elements per vector
constexpr int kMmRows = 4;             // 24 accumulators + 4 weight vectors + 1 x vector of 32 zmm
constexpr int kMmTokens = 6;
// Up to this many tokens a block of kMmRows rows runs as two halves of 2 rows, each one pass
// over k for all the tokens (up to 24 accumulators + 2 weight vectors + 1 x vector), instead of
// a pass per block of kMmTokens tokens (dot_block_halves). At 14 tokens the halves were no
// faster (cold, [32000, 1024], 2 threads, Zen 4: 8 tokens 33 against 23 GB/s, 10 32 against
// 22, 12 26 against 20, 14 18 against 18).
constexpr int kHalvesTokens = 12;
// dot_block_halves runs the two pairs in turn over rounds of columns whose x for all tokens takes
// at most this many bytes, so that x stays in L1 (32 KiB on the CPUs with vdpbf16ps) beside the
// weights: at [1024, 2048] (attention's o) and 8 tokens, in one round the x of 32 KiB came from L2
// and the product took about 1.3x as long as in passes of kMmTokens tokens.
constexpr int64_t kHalvesXBytes = 24 * 1024;
constexpr int kPanelVecs = 4;  // 24 accumulators + 4 weight vectors + 1 broadcast x
constexpr int kPanelTokens = 6;
constexpr int64_t kPanelRows = kPanelVecs * kW;
// Columns per microkernel call: 128 pairs of 64 rows, the 32 KiB of panel the f32 kernel keeps
// in L1 (not tuned: this machine lacks the instruction).
constexpr int64_t kPanelDepth = 256;
constexpr int64_t kPanelTokenGroup = 128;  // tokens that sweep a panel's columns together

#include "kernels/matmul_panel_store_impl.h"
static_assert(kPanelDepth % kPairW == 0);

using matmul_impl::EvenBlocks;

// acc[t][r] += w[r * ldw + kk : + n) · x[t * ldx + kk : + n) for r < R, t < T; n == kPairW
// unless kPart. x is read as whole vectors: its rows are zero past cols, up to a whole vector.
template <int R, int T, bool kPart>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void dot_step(V (&acc)[T][R], const uint16_t* w, int64_t ldw,
                                                  const uint16_t* x, int64_t ldx, int64_t kk,
                                                  int n) {
  V wv[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    wv[r] = kPart ? S::load_pairs_part(w + r * ldw + kk, n) : S::load_pairs(w + r * ldw + kk);
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const V xv = S::load_pairs(x + t * ldx + kk);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[t][r] = S::dpbf16(acc[t][r], wv[r], xv);
  }
}

// y[t * ldy + r] = the sum of acc[t][r]'s lanes, for r < R, t < T.
template <int R, int T>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void store_dots(V (&acc)[T][R], float* y, int64_t ldy) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    float* yt = y + t * ldy;
    if constexpr (R == 4) {
      _mm_storeu_ps(yt, S::hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
    } else {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) yt[r] = S::hsum(acc[t][r]);
    }
  }
}

// acc[t][r] += Σ_{kk <= k' < end} w[r * ldw + k'] · x[t * ldx + k'] for r < R, t < T, over
// whole vectors and then the part of one that is left (only at the end of the rows). The same
// columns of the rows r of pf (the next block's weights, still in memory) whose bit r is set in
// pf_rows are prefetched into L2 along the way, one cache line per row and step.
template <int R, int T>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void dot_columns(V (&acc)[T][R], const uint16_t* w, int64_t ldw,
                                                     const uint16_t* x, int64_t ldx, int64_t kk,
                                                     int64_t end, const uint16_t* pf,
                                                     unsigned pf_rows) {
  if (pf_rows != 0) {
    for (; kk + kPairW <= end; kk += kPairW) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if (pf_rows >> r & 1u) {
          _mm_prefetch(reinterpret_cast<const char*>(pf + r * ldw + kk), _MM_HINT_T1);
        }
      }
      dot_step<R, T, false>(acc, w, ldw, x, ldx, kk, kPairW);
    }
  } else {
    for (; kk + kPairW <= end; kk += kPairW) dot_step<R, T, false>(acc, w, ldw, x, ldx, kk, kPairW);
  }
  if (kk < end) dot_step<R, T, true>(acc, w, ldw, x, ldx, kk, static_cast<int>(end - kk));
}

// y[t * ldy + r] = Σ_{k' < k} w[r * ldw + k'] · x[t * ldx + k'] for r < R, t < T, prefetching
// the rows of pf that pf_rows names (dot_columns).
template <int R, int T>
DUET_SIMD_TARGET void dot_block(const uint16_t* w, int64_t ldw, const uint16_t* x, int64_t ldx,
                                int64_t k, float* y, int64_t ldy, const uint16_t* pf,
                                unsigned pf_rows) {
  V acc[T][R];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = S::zero();
  }
  dot_columns(acc, w, ldw, x, ldx, 0, k, pf, pf_rows);
  store_dots(acc, y, ldy);
}

// One token: the block's rows one after the other, each whole before the next, so that the
// weights stream through memory in order and the hardware prefetches them by itself; no
// software prefetch. dot_block<R, 1> reads its R rows side by side (R streams 2 KB apart at 1024
// columns, the next block prefetched): from memory it read 0.63-0.86 of a plain read of the
// same bytes, this 0.95-1.0, on 1 and 2 threads, in huge pages, in 4 KiB ones and in a file's
// mapping (Zen 4); in decode the routed experts' products read 23-24.5 -> 27.5 GB/s. The sums
// are dot_block<R, 1>'s bit for bit: each row's accumulator runs over k in the same order, and
// the rows are reduced together as there. With pf > 0 every vector's cache line pf bytes further
// on in the rows is prefetched (simd::one_token_prefetch_bytes: Intel's cores stream this chain
// of dependent vdpbf16ps from memory well below a plain read's pace by themselves), and with
// pf_l2 > 0 the line pf_l2 bytes on into L2 (simd::one_token_prefetch_l2_bytes).
template <int R>
DUET_SIMD_TARGET void dot_rows_one(const uint16_t* w, int64_t ldw, const uint16_t* x, int64_t k,
                                   float* y, int64_t pf, int64_t pf_l2) {
  V acc[1][R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const uint16_t* wr = w + r * ldw;
    V a = S::zero();
    int64_t kk = 0;
    if (pf > 0 || pf_l2 > 0) {
      for (; kk + kPairW <= k; kk += kPairW) {
        if (pf > 0) _mm_prefetch(reinterpret_cast<const char*>(wr + kk) + pf, _MM_HINT_T0);
        if (pf_l2 > 0) _mm_prefetch(reinterpret_cast<const char*>(wr + kk) + pf_l2, _MM_HINT_T1);
        a = S::dpbf16(a, S::load_pairs(wr + kk), S::load_pairs(x + kk));
      }
    } else {
      for (; kk + kPairW <= k; kk += kPairW) {
        a = S::dpbf16(a, S::load_pairs(wr + kk), S::load_pairs(x + kk));
      }
    }
    if (kk < k) {
      a = S::dpbf16(a, S::load_pairs_part(wr + kk, static_cast<int>(k - kk)),
                    S::load_pairs(x + kk));
    }
    acc[0][r] = a;
  }
  store_dots(acc, y, 0);
}

using DotFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t,
                       const uint16_t*, unsigned);

template <int... I>
constexpr std::array<DotFn, sizeof...(I)> make_dot_table(std::integer_sequence<int, I...>) {
  return {&dot_block<I / kMmTokens + 1, I % kMmTokens + 1>...};
}

// The block kernel for nr <= kMmRows rows and nt <= kMmTokens tokens.
inline DotFn dot_fn(int64_t nr, int64_t nt) {
  static constexpr auto kTable =
      make_dot_table(std::make_integer_sequence<int, kMmRows * kMmTokens>{});
  return kTable[static_cast<size_t>((nr - 1) * kMmTokens + (nt - 1))];
}

// Rows 0 and 1 of w × T tokens over columns [k0, k0 + n) (the last columns of the rows if
// k0 + n == k, else a whole number of vectors), continuing the accumulators in sums[t][r] (k0 >
// 0) or starting them, and storing them back there; prefetching as dot_columns.
template <int T>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void dot_pair(const uint16_t* w, int64_t ldw, const uint16_t* x,
                                                  int64_t ldx, int64_t k0, int64_t n,
                                                  const uint16_t* pf, unsigned pf_rows,
                                                  float (*sums)[2][kW]) {
  V a[T][2];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    a[t][0] = k0 > 0 ? S::load(sums[t][0]) : S::zero();
    a[t][1] = k0 > 0 ? S::load(sums[t][1]) : S::zero();
  }
  dot_columns(a, w, ldw, x, ldx, k0, k0 + n, pf, pf_rows);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    S::store(sums[t][0], a[t][0]);
    S::store(sums[t][1], a[t][1]);
  }
}

// dot_block<kMmRows, T> for kMmTokens < T <= kHalvesTokens, the same sums bit for bit: rows
// [0, 2) and then [2, 4), each pair in one pass over k for all T tokens, so that every weight is
// read once, in step with the arithmetic; the pairs' accumulators wait in memory and the four
// rows are reduced together as in dot_block. (dot_block with T beyond kMmTokens would need more
// accumulators than there are registers; run per block of kMmTokens tokens, its passes read the
// block's weights from memory in the first and from L1 in the others, while nothing streams in:
// at 8 tokens the output head's [32000, 1024], cold, read 23-26 GB/s that way and 29-33 this
// way on 2 threads, 14-15 against 20-22 on one; Zen 4.) Each pair prefetches its rows of pf
// that pf_rows names, as dot_block does.
template <int T>
DUET_SIMD_TARGET void dot_block_halves(const uint16_t* w, int64_t ldw, const uint16_t* x,
                                       int64_t ldx, int64_t k, float* y, int64_t ldy,
                                       const uint16_t* pf, unsigned pf_rows) {
  static_assert(kMmRows == 4 && T <= kHalvesTokens);
  // Columns per round of the two pairs: the T tokens' x of a round stays in L1.
  constexpr int64_t kRound = std::max<int64_t>(kPairW, kHalvesXBytes / (2 * T) / kPairW * kPairW);
  alignas(64) float sums[2][T][2][kW];  // [pair][token][row of the pair] accumulators
  for (int64_t k0 = 0; k0 < k; k0 += kRound) {
    const int64_t n = std::min(kRound, k - k0);
    dot_pair<T>(w, ldw, x, ldx, k0, n, pf, pf_rows & 3u, sums[0]);
    dot_pair<T>(w + 2 * ldw, ldw, x, ldx, k0, n, pf + 2 * ldw, pf_rows >> 2 & 3u, sums[1]);
  }
  V acc[T][kMmRows];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 4
    for (int r = 0; r < kMmRows; ++r) acc[t][r] = S::load(sums[r / 2][t][r % 2]);
  }
  store_dots(acc, y, ldy);
}

template <int... I>
constexpr std::array<DotFn, sizeof...(I)> make_halves_table(std::integer_sequence<int, I...>) {
  return {&dot_block_halves<kMmTokens + 1 + I>...};
}

// dot_block_halves for kMmTokens < nt <= kHalvesTokens tokens.
inline DotFn halves_fn(int64_t nt) {
  static constexpr auto kTable =
      make_halves_table(std::make_integer_sequence<int, kHalvesTokens - kMmTokens>{});
  return kTable[static_cast<size_t>(nt - kMmTokens - 1)];
}

using DotOneFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t,
                          int64_t);

// dot_rows_one for nr <= kMmRows rows.
inline DotOneFn dot_one_fn(int64_t nr) {
  static_assert(kMmRows == 4);
  static constexpr DotOneFn kTable[kMmRows] = {&dot_rows_one<1>, &dot_rows_one<2>, &dot_rows_one<3>,
                                               &dot_rows_one<4>};
  return kTable[static_cast<size_t>(nr - 1)];
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens, reading the
// weights in place (decode, and the few rows a routed expert gets in a batch): a block of
// kMmRows rows is read from memory once, while the next block is prefetched, and serves every
// block of tokens from L1. One token reads the rows in order (dot_rows_one): the same bits.
DUET_SIMD_TARGET void matmul_rows_direct(const uint16_t* w, int64_t cols, const uint16_t* x,
                                         int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
                                         int64_t r_begin, int64_t r_end) {
  if (n_tokens == 1) {
    // Past r_end the prefetches reach another thread's rows or past the matrix: never a fault.
    const int64_t pf = simd::one_token_prefetch_bytes();
    const int64_t pf_l2 = simd::one_token_prefetch_l2_bytes();
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kMmRows) {
      const int64_t nr = std::min<int64_t>(kMmRows, r_end - r0);
      dot_one_fn(nr)(w + r0 * cols, cols, x, cols, y + (r0 - r_begin), pf, pf_l2);
    }
    return;
  }
  const EvenBlocks tb(n_tokens, kMmTokens);
  const bool halves = n_tokens > kMmTokens && n_tokens <= kHalvesTokens;
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kMmRows) {
    const int64_t nr = std::min<int64_t>(kMmRows, r_end - r0);
    // Past r_end the next block is another thread's or past the matrix: prefetches never fault.
    const uint16_t* next = w + (r0 + kMmRows) * cols;
    if (halves && nr == kMmRows) {
      halves_fn(n_tokens)(w + r0 * cols, cols, x, ldx, cols, y + (r0 - r_begin), ldy, next, ~0u);
      continue;
    }
    // The passes over the block's blocks of tokens share out the next block's prefetch, a row
    // each in turn (pass b the rows r with r % tb.n == b), so that it streams in through all of
    // them rather than in a burst during the first, which leaves memory idle during the others.
    // Cold, 2 threads, Zen 4: 16 tokens 16-20 -> 20-23 GB/s, 32 tokens on the output head's
    // [32000, 1024] 10.5-10.8 -> 12.4-12.7.
    for (int64_t b = 0; b < tb.n; ++b) {
      const int64_t t0 = tb.begin(b);
      unsigned pf_rows = 0;
      for (int r = b; r < kMmRows; r += static_cast<int>(tb.n)) pf_rows |= 1u << r;
      dot_fn(nr, tb.size(b))(w + r0 * cols, cols, x + t0 * ldx, ldx, cols,
                             y + t0 * ldy + (r0 - r_begin), ldy, next, pf_rows);
    }
  }
}

// Pairs [k0 / 2, k0 / 2 + (kn + 1) / 2) of panel rows × lanes [j0, j0 + kW) from columns
// [k0, k0 + kn) of w, kn == kPairW unless kPart: kW weight rows loaded as lanes of pairs (zero
// past kn, and rows at or past nr zero) and transposed as 32-bit lanes. (Two functions, so that
// whole blocks keep r in registers: a store loop of variable length puts it on the stack.)
template <bool kPart>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void pack_pairs(const uint16_t* w, int64_t ldw, int64_t nr,
                                                    int64_t j0, int64_t k0, int kn, float* panel) {
  V r[kW];
#pragma GCC unroll 16
  for (int i = 0; i < kW; ++i) {
    const uint16_t* src = w + (j0 + i) * ldw + k0;
    r[i] = j0 + i >= nr ? S::zero() : kPart ? S::load_pairs_part(src, kn) : S::load_pairs(src);
  }
  S::transpose(r);
  const int n_pairs = kPart ? (kn + 1) / 2 : kW;
#pragma GCC unroll 16
  for (int p = 0; p < n_pairs; ++p) S::store(panel + (k0 / 2 + p) * kPanelRows + j0, r[p]);
}

// Lane j of panel row p = the bf16 pair w[j * ldw + 2p], w[j * ldw + 2p + 1] (as the low and high
// half of 32 bits) for j < kPanelRows, p < (kc + 1) / 2; zero for j >= nr and columns >= kc.
DUET_SIMD_TARGET void pack_panel(const uint16_t* w, int64_t ldw, int64_t nr, int64_t kc,
                                 float* panel) {
  for (int64_t j0 = 0; j0 < kPanelRows; j0 += kW) {
    int64_t k0 = 0;
    for (; k0 + kPairW <= kc; k0 += kPairW) pack_pairs<false>(w, ldw, nr, j0, k0, kPairW, panel);
    if (k0 < kc) pack_pairs<true>(w, ldw, nr, j0, k0, static_cast<int>(kc - k0), panel);
  }
}

// y[t * ldy + j] (+)= Σ_{k < kc} x[t * ldx + k0 + k] · w[j][k0 + k] for t < T, j < nr (the lanes
// at or past nr are not stored), from the panel of columns [k0, k0 + kc). An odd kc reads one x
// past k0 + kc, which is zero (the end of the row).
template <int T>
DUET_SIMD_TARGET void panel_block(const uint16_t* x, int64_t ldx, int64_t k0, int64_t kc,
                                  const float* panel, float* y, int64_t ldy, int64_t nr,
                                  bool accumulate) {
  V acc[T][kPanelVecs];
  const uint16_t* xt[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    xt[t] = x + t * ldx + k0;
#pragma GCC unroll 8
    for (int v = 0; v < kPanelVecs; ++v) acc[t][v] = S::zero();
  }
  const int64_t n_pairs = (kc + 1) / 2;
#pragma GCC unroll 2
  for (int64_t p = 0; p < n_pairs; ++p) {
    V wv[kPanelVecs];
#pragma GCC unroll 8
    for (int v = 0; v < kPanelVecs; ++v) wv[v] = S::load(panel + p * kPanelRows + v * kW);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const V xv = S::set1_pair(xt[t] + 2 * p);
#pragma GCC unroll 8
      for (int v = 0; v < kPanelVecs; ++v) acc[t][v] = S::dpbf16(acc[t][v], wv[v], xv);
    }
  }
  store_panel_block(acc, y, ldy, nr, accumulate);
}

using PanelFn = void (*)(const uint16_t*, int64_t, int64_t, int64_t, const float*, float*, int64_t,
                         int64_t, bool);

template <int... I>
constexpr std::array<PanelFn, sizeof...(I)> make_panel_table(std::integer_sequence<int, I...>) {
  return {&panel_block<I + 1>...};
}

// The block kernel for 1 <= nt <= kPanelTokens tokens.
inline PanelFn panel_fn(int64_t nt) {
  static constexpr auto kTable = make_panel_table(std::make_integer_sequence<int, kPanelTokens>{});
  return kTable[static_cast<size_t>(nt - 1)];
}

// Prefetches (into L2) the cache lines of rows [0, m) × columns [0, n) of w.
DUET_SIMD_TARGET void prefetch_rows(const uint16_t* w, int64_t ldw, int64_t m, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < n; kk += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(w + i * ldw + kk), _MM_HINT_T1);
    }
  }
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens (prefill). For
// each panel of weight rows, all its column blocks are packed once, then the tokens run over it
// kPanelTokenGroup at a time, so a group's rows of x and y stay in L2 across the column blocks;
// within a group, blocks of at most kPanelTokens tokens. The next panel's weights are prefetched
// while this one computes.
DUET_SIMD_TARGET void matmul_rows_panel(const uint16_t* w, int64_t cols, const uint16_t* x,
                                        int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
                                        int64_t r_begin, int64_t r_end) {
  thread_local std::vector<float> panel_buf;
  // [(cols + 1) / 2, kPanelRows] bf16 pairs
  float* panel = matmul_impl::aligned_floats(panel_buf, (cols + 1) / 2 * kPanelRows);
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kPanelRows) {
    const int64_t nr = std::min(kPanelRows, r_end - r0);
    for (int64_t k0 = 0; k0 < cols; k0 += kPanelDepth) {
      pack_panel(w + r0 * cols + k0, cols, nr, std::min(kPanelDepth, cols - k0),
                 panel + k0 / 2 * kPanelRows);
    }
    if (r0 + kPanelRows < r_end) {
      prefetch_rows(w + (r0 + kPanelRows) * cols, cols,
                    std::min(kPanelRows, r_end - r0 - kPanelRows), cols);
    }
    for (int64_t g0 = 0; g0 < n_tokens; g0 += kPanelTokenGroup) {
      const EvenBlocks tb(std::min(kPanelTokenGroup, n_tokens - g0), kPanelTokens);
      float* yg = y + g0 * ldy + (r0 - r_begin);
      for (int64_t k0 = 0; k0 < cols; k0 += kPanelDepth) {
        const int64_t kc = std::min(kPanelDepth, cols - k0);
        for (int64_t b = 0; b < tb.n; ++b) {
          const int64_t t0 = tb.begin(b);
          panel_fn(tb.size(b))(x + (g0 + t0) * ldx, ldx, k0, kc, panel + k0 / 2 * kPanelRows,
                               yg + t0 * ldy, ldy, nr, k0 > 0);
        }
      }
    }
  }
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end); w is bf16 with w.cols > 0 and
// x rounded (XRows::rounded), both checked by the caller.
DUET_SIMD_TARGET void matmul_rows(const Matrix& w, const XRows& x, int64_t n_tokens, float* y,
                                  int64_t ldy, int64_t r_begin, int64_t r_end, bool tiled) {
  const auto* wp = static_cast<const uint16_t*>(w.data);
  if (tiled) {
    matmul_rows_panel(wp, w.cols, x.bf16, x.ld, n_tokens, y, ldy, r_begin, r_end);
  } else {
    matmul_rows_direct(wp, w.cols, x.bf16, x.ld, n_tokens, y, ldy, r_begin, r_end);
  }
}
