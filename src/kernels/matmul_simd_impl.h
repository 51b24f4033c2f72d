// Private to matmul.cpp: the SIMD kernels of matmul (y = x · wᵀ), written once against a vector
// interface.
//
// No include guard: matmul.cpp includes this file once per instruction set, inside a namespace
// that defines
//   S                  a vector interface from simd_impl.h (simd::Avx512, simd::Avx2)
//   kMmRows, kMmTokens the register block: weight rows × tokens
// and with the macro DUET_SIMD_TARGET set to the matching target attribute.
//
// Every kernel takes dot products along k: a register block keeps kMmRows × kMmTokens vector
// accumulators, loads (and for bf16 widens) each weight vector once for all the block's tokens,
// and reduces the accumulators horizontally once at the end of k. The weights are read in their
// stored layout; at most a small block of them is widened into an aligned f32 buffer just before
// it is used, so there is no repacking pass over a matrix.

using V = S::V;
constexpr int kW = S::kWidth;

// acc[t][r] += w[r, kk : kk + n) · x[t, kk : kk + n); n == kW unless kPart.
template <int R, int T, bool kPart, typename W>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void dot_step(V (&acc)[T][R], const W* w, int64_t ldw,
                                                  const float* const (&x)[T], int64_t kk, int n) {
  V wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    wv[r] = kPart ? S::load_part(w + r * ldw + kk, n) : S::load(w + r * ldw + kk);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    V xv = kPart ? S::load_part(x[t] + kk, n) : S::load(x[t] + kk);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = S::fmadd(wv[r], xv, acc[t][r]);
  }
}

// Prefetches (into L2) the cache line of pf[r * ldw + kk] for r < R, once per line.
template <int R, typename W>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void prefetch_step(const W* pf, int64_t ldw, int64_t kk) {
  if ((kk * static_cast<int64_t>(sizeof(W))) % 64 != 0) return;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    _mm_prefetch(reinterpret_cast<const char*>(pf + r * ldw + kk), _MM_HINT_T1);
}

// y[t * ldy + r] (+)= Σ_{k' < k} w[r * ldw + k'] · x[t][k'] for r < R, t < T.
// Each weight vector loaded is used for all T tokens. Unless pf is null, the same columns of the
// R rows at pf (the next block's weights, still in memory) are prefetched along the way, so
// memory is read while this block computes.
template <int R, int T, typename W>
DUET_SIMD_TARGET void dot_block(const W* w, int64_t ldw, const float* const* xrows, int64_t k,
                                float* y, int64_t ldy, bool accumulate, const W* pf) {
  V acc[T][R];
  const float* x[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    x[t] = xrows[t];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = S::zero();
  }
  int64_t kk = 0;
  if (pf) {
    for (; kk + kW <= k; kk += kW) {
      prefetch_step<R>(pf, ldw, kk);
      dot_step<R, T, false>(acc, w, ldw, x, kk, kW);
    }
  } else {
    for (; kk + kW <= k; kk += kW) dot_step<R, T, false>(acc, w, ldw, x, kk, kW);
  }
  if (kk < k) dot_step<R, T, true>(acc, w, ldw, x, kk, static_cast<int>(k - kk));
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    float* yt = y + t * ldy;
    if constexpr (R == 4) {
      __m128 s = S::hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
      if (accumulate) s = _mm_add_ps(s, _mm_loadu_ps(yt));
      _mm_storeu_ps(yt, s);
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) yt[r] = (accumulate ? yt[r] : 0.0f) + S::hsum(acc[t][r]);
    }
  }
}

template <typename W>
using DotFn = void (*)(const W*, int64_t, const float* const*, int64_t, float*, int64_t, bool,
                       const W*);

template <typename W, int... I>
constexpr std::array<DotFn<W>, sizeof...(I)> make_dot_table(std::integer_sequence<int, I...>) {
  return {&dot_block<I / kMmTokens + 1, I % kMmTokens + 1, W>...};
}

// The block kernel for nr <= kMmRows rows and nt <= kMmTokens tokens.
template <typename W>
DotFn<W> dot_fn(int64_t nr, int64_t nt) {
  static constexpr auto kTable =
      make_dot_table<W>(std::make_integer_sequence<int, kMmRows * kMmTokens>{});
  return kTable[static_cast<size_t>((nr - 1) * kMmTokens + (nt - 1))];
}

// n_tokens cut into register blocks of at most kMmTokens (matmul_impl::EvenBlocks).
struct TokenBlocks : matmul_impl::EvenBlocks {
  explicit TokenBlocks(int64_t n_tokens) : EvenBlocks(n_tokens, kMmTokens) {}
};

using matmul_impl::aligned_floats;
using matmul_impl::padded_ld;

// dst[i * ldd + 0 : n) = f32(src[i * lds + 0 : n)) for i < m: a weight tile widened (bf16) or
// copied (f32), or rows of x copied, into an aligned, padded buffer.
template <typename W>
DUET_SIMD_TARGET void pack_rows(const W* src, int64_t lds, int64_t m, int64_t n, float* dst,
                                int64_t ldd) {
  for (int64_t i = 0; i < m; ++i) {
    const W* s = src + i * lds;
    float* d = dst + i * ldd;
    int64_t kk = 0;
    for (; kk + kW <= n; kk += kW) S::store(d + kk, S::load(s + kk));
    if (kk < n) {
      const int part = static_cast<int>(n - kk);
      S::store_part(d + kk, S::load_part(s + kk, part), part);
    }
  }
}

// Prefetches (into L2) the cache lines of rows [0, m) × columns [0, n) of w.
template <typename W>
DUET_SIMD_TARGET void prefetch_rows(const W* w, int64_t ldw, int64_t m, int64_t n) {
  constexpr int64_t kPerLine = 64 / sizeof(W);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < n; kk += kPerLine) {
      _mm_prefetch(reinterpret_cast<const char*>(w + i * ldw + kk), _MM_HINT_T1);
    }
  }
}

// x's rows as pointers: the gathered list itself, or (contiguous rows) a list on the calling
// thread, valid until its next call.
inline const float* const* row_pointers(const XRows& x, int64_t cols, int64_t n_tokens) {
  if (x.rows) return x.rows;
  thread_local std::vector<const float*> rows;
  rows.resize(static_cast<size_t>(n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) rows[static_cast<size_t>(t)] = x.row(t, cols);
  return rows.data();
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), reading weights straight
// from w, for few tokens (decode, and the few rows a routed expert gets in a batch). A block of
// kMmRows weight rows is read from memory once, while the next block is prefetched. For up to
// kWidenInRegisterBlocks blocks of kMmTokens tokens each weight vector is widened in registers
// by each block, from L1 after the first. For more, a bf16 block is widened once into an
// aligned f32 copy that every token block reads. With more than one block x must be aligned
// rows (a vector load across two cache lines costs two): unless it is (see direct_x), it is
// copied into an aligned buffer first; a single block reads x where it is.
// Token blocks (of kMmTokens) up to which the direct path widens bf16 weights in registers
// rather than into an f32 copy. At 8 tokens (a batch-8 decode step's dense layers) widening into
// a copy first left one thread reading 2048 × 1024 weights at 4.2–4.7 GB/s, in registers
// 6.1–6.3 GB/s (BM_MatmulBf16, cold); from 3 blocks the FMAs dominate and the copy pays off.
constexpr int64_t kWidenInRegisterBlocks = 2;

template <typename W>
DUET_SIMD_TARGET void matmul_rows_direct(const W* w, int64_t cols, XRows x, int64_t n_tokens,
                                         float* y, int64_t ldy, int64_t r_begin, int64_t r_end) {
  thread_local std::vector<float> x_buf, w_buf;
  const TokenBlocks tb(n_tokens);
  if (tb.n > 1 && !matmul_impl::aligned_rows(x, cols)) {
    const int64_t ldx = padded_ld(cols);
    float* xa = aligned_floats(x_buf, n_tokens * ldx);  // [n_tokens, ldx] f32
    for (int64_t t = 0; t < n_tokens; ++t) pack_rows(x.row(t, cols), 0, 1, cols, xa + t * ldx, ldx);
    x = XRows(xa, ldx);
  }
  const float* const* xr = row_pointers(x, cols, n_tokens);
  const bool widen_once = std::is_same_v<W, uint16_t> && tb.n > kWidenInRegisterBlocks;
  const int64_t ldwf = padded_ld(cols);
  float* wf = widen_once ? aligned_floats(w_buf, kMmRows * ldwf) : nullptr;  // [kMmRows, ldwf]
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kMmRows) {
    const int64_t nr = std::min<int64_t>(kMmRows, r_end - r0);
    // Past r_end the next block is another thread's or past the matrix: prefetches never fault.
    const W* next = w + (r0 + kMmRows) * cols;
    if (widen_once) {
      pack_rows(w + r0 * cols, cols, nr, cols, wf, ldwf);
      prefetch_rows(next, cols, std::min<int64_t>(kMmRows, r_end - r0 - kMmRows), cols);
      for (int64_t b = 0; b < tb.n; ++b) {
        const int64_t t0 = tb.begin(b);
        dot_fn<float>(nr, tb.size(b))(wf, ldwf, xr + t0, cols, y + t0 * ldy + (r0 - r_begin),
                                      ldy, false, nullptr);
      }
    } else {
      for (int64_t b = 0; b < tb.n; ++b) {
        const int64_t t0 = tb.begin(b);
        dot_fn<W>(nr, tb.size(b))(w + r0 * cols, cols, xr + t0, cols,
                                  y + t0 * ldy + (r0 - r_begin), ldy, false,
                                  b == 0 ? next : nullptr);
      }
    }
  }
}

// matmul_rows_panel: the product for many tokens (prefill).
#include "kernels/matmul_panel_impl.h"

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end); w is f32 or bf16 and
// w.cols > 0 (checked by the caller). From w's panels where it has them, from
// matmul_impl::kPanelMinTokens tokens on; else `tiled` picks the path.
DUET_SIMD_TARGET void matmul_rows(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                                  int64_t r_begin, int64_t r_end, bool tiled) {
  if (w.panels && n_tokens >= matmul_impl::kPanelMinTokens) {
    const float* const* xr = row_pointers(x, w.cols, n_tokens);
    if (w.dtype == DType::kBF16) {
      matmul_rows_packed(static_cast<const uint16_t*>(w.panels), w.cols, xr, n_tokens, y, ldy,
                         r_begin, r_end);
    } else {
      matmul_rows_packed(static_cast<const float*>(w.panels), w.cols, xr, n_tokens, y, ldy, r_begin,
                         r_end);
    }
    return;
  }
  if (w.dtype == DType::kBF16) {
    const auto* wp = static_cast<const uint16_t*>(w.data);
    if (tiled) {
      matmul_rows_panel(wp, w.cols, row_pointers(x, w.cols, n_tokens), n_tokens, y, ldy, r_begin,
                        r_end);
    } else {
      matmul_rows_direct(wp, w.cols, x, n_tokens, y, ldy, r_begin, r_end);
    }
  } else {
    const auto* wp = static_cast<const float*>(w.data);
    if (tiled) {
      matmul_rows_panel(wp, w.cols, row_pointers(x, w.cols, n_tokens), n_tokens, y, ldy, r_begin,
                        r_end);
    } else {
      matmul_rows_direct(wp, w.cols, x, n_tokens, y, ldy, r_begin, r_end);
    }
  }
}
