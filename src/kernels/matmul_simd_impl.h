// Private to matmul.cpp: the SIMD matmul kernels, written once against a vector interface.
//
// No include guard: matmul.cpp includes this file once per instruction set, inside a namespace
// that defines
//   S                  a vector interface from simd_impl.h (simd::Avx512, simd::Avx2)
//   kMmRows, kMmTokens the register block of matmul: weight rows × tokens
//   kXwCols, kXwTokens the register block of matmul_xw: vectors of columns × tokens
// and with the macro DUET_SIMD_TARGET set to the matching target attribute.

using V = S::V;
constexpr int kW = S::kWidth;

// The prefill path converts a [kTileRows, kTileCols] tile of bf16 weights to f32 once and
// multiplies it with every token; 32 KiB of f32, which stays in L1 next to the x tile.
constexpr int64_t kTileRows = 16;
constexpr int64_t kTileCols = 512;
static_assert(kTileRows % kMmRows == 0 && kTileCols % kW == 0);

// ---- matmul: y = x · wᵀ, one dot product per (token, row), vectors along k ----

// acc[t][r] += w[r, kk : kk + n) · x[t, kk : kk + n); n == kW unless kPart.
template <int R, int T, bool kPart, typename W>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void dot_step(V (&acc)[T][R], const W* w, int64_t ldw,
                                                  const float* x, int64_t ldx, int64_t kk, int n) {
  V wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    wv[r] = kPart ? S::load_part(w + r * ldw + kk, n) : S::load(w + r * ldw + kk);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    V xv = kPart ? S::load_part(x + t * ldx + kk, n) : S::load(x + t * ldx + kk);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = S::fmadd(wv[r], xv, acc[t][r]);
  }
}

// y[t * ldy + r] (+)= Σ_{k' < k} w[r * ldw + k'] · x[t * ldx + k'] for r < R, t < T.
// Each weight vector loaded is used for all T tokens.
template <int R, int T, typename W>
DUET_SIMD_TARGET void dot_block(const W* w, int64_t ldw, const float* x, int64_t ldx, int64_t k,
                                float* y, int64_t ldy, bool accumulate) {
  V acc[T][R];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = S::zero();
  }
  int64_t kk = 0;
  for (; kk + kW <= k; kk += kW) dot_step<R, T, false>(acc, w, ldw, x, ldx, kk, kW);
  if (kk < k) dot_step<R, T, true>(acc, w, ldw, x, ldx, kk, static_cast<int>(k - kk));
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
using DotFn = void (*)(const W*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);

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

// Rows [r_begin, r_end) of y, reading weights straight from w: each weight row is read from
// memory once and multiplied with every token (decode is bound by that read).
template <typename W>
DUET_SIMD_TARGET void matmul_rows_direct(const W* w, int64_t rows, int64_t cols, const float* x,
                                         int64_t n_tokens, float* y, int64_t r_begin,
                                         int64_t r_end) {
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kMmRows) {
    int64_t nr = std::min<int64_t>(kMmRows, r_end - r0);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kMmTokens) {
      int64_t nt = std::min<int64_t>(kMmTokens, n_tokens - t0);
      dot_fn<W>(nr, nt)(w + r0 * cols, cols, x + t0 * cols, cols, cols, y + t0 * rows + r0, rows,
                        false);
    }
  }
}

// tile[i, 0 : kb) = f32(w[i * ldw + 0 : kb)) for i < mb; the tile's row stride is kTileCols.
DUET_SIMD_TARGET void widen_tile(const uint16_t* w, int64_t ldw, int64_t mb, int64_t kb,
                                 float* tile) {
  for (int64_t i = 0; i < mb; ++i) {
    const uint16_t* src = w + i * ldw;
    float* dst = tile + i * kTileCols;
    int64_t kk = 0;
    for (; kk + kW <= kb; kk += kW) S::store(dst + kk, S::load(src + kk));
    if (kk < kb) {
      int n = static_cast<int>(kb - kk);
      S::store_part(dst + kk, S::load_part(src + kk, n), n);
    }
  }
}

// Rows [r_begin, r_end) of y for many tokens: k is cut into kTileCols blocks so a weight tile
// and the matching slice of x stay in cache; bf16 tiles are widened to f32 once per tile.
template <typename W>
DUET_SIMD_TARGET void matmul_rows_tiled(const W* w, int64_t rows, int64_t cols, const float* x,
                                        int64_t n_tokens, float* y, int64_t r_begin,
                                        int64_t r_end) {
  alignas(64) float tile[kTileRows * kTileCols];  // [kTileRows, kTileCols] f32, bf16 only
  for (int64_t k0 = 0; k0 < cols; k0 += kTileCols) {
    int64_t kb = std::min(kTileCols, cols - k0);
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kTileRows) {
      int64_t mb = std::min(kTileRows, r_end - r0);
      const float* wt;
      int64_t ldw;
      if constexpr (std::is_same_v<W, float>) {
        wt = w + r0 * cols + k0;
        ldw = cols;
      } else {
        widen_tile(w + r0 * cols + k0, cols, mb, kb, tile);
        wt = tile;
        ldw = kTileCols;
      }
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kMmTokens) {
        int64_t nt = std::min<int64_t>(kMmTokens, n_tokens - t0);
        for (int64_t r = 0; r < mb; r += kMmRows) {
          int64_t nr = std::min<int64_t>(kMmRows, mb - r);
          dot_fn<float>(nr, nt)(wt + r * ldw, ldw, x + t0 * cols + k0, cols, kb,
                                y + t0 * rows + r0 + r, rows, k0 > 0);
        }
      }
    }
  }
}

// ---- matmul_xw: y = x · w, vectors along the output columns ----

// y[t * ldy + c * kW + j] = Σ_r x[t * ldx + r] · w[r * ldw + c * kW + j] for t < T, c < C,
// j < kW (j < last in the final vector when kPart).
template <int C, int T, bool kPart, typename W>
DUET_SIMD_TARGET void axpy_block(const W* w, int64_t ldw, int64_t n_rows, const float* x,
                                 int64_t ldx, float* y, int64_t ldy, int last) {
  V acc[T][C];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[t][c] = S::zero();
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    const W* wr = w + r * ldw;
    V wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      wv[c] = (kPart && c == C - 1) ? S::load_part(wr + c * kW, last) : S::load(wr + c * kW);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      V xv = S::set1(x[t * ldx + r]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[t][c] = S::fmadd(wv[c], xv, acc[t][c]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      float* yc = y + t * ldy + c * kW;
      if (kPart && c == C - 1) {
        S::store_part(yc, acc[t][c], last);
      } else {
        S::store(yc, acc[t][c]);
      }
    }
  }
}

template <typename W>
using AxpyFn = void (*)(const W*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int);

template <typename W, int... I>
constexpr std::array<AxpyFn<W>, sizeof...(I)> make_axpy_table(std::integer_sequence<int, I...>) {
  return {&axpy_block<I / kXwTokens + 1, I % kXwTokens + 1, false, W>...};
}

template <typename W, int... I>
constexpr std::array<AxpyFn<W>, sizeof...(I)> make_axpy_part_table(
    std::integer_sequence<int, I...>) {
  return {&axpy_block<1, I + 1, true, W>...};
}

// The block kernel for nc <= kXwCols full vectors, or (part) one partial vector, and
// nt <= kXwTokens tokens.
template <typename W>
AxpyFn<W> axpy_fn(int64_t nc, int64_t nt, bool part) {
  static constexpr auto kTable =
      make_axpy_table<W>(std::make_integer_sequence<int, kXwCols * kXwTokens>{});
  static constexpr auto kPartTable =
      make_axpy_part_table<W>(std::make_integer_sequence<int, kXwTokens>{});
  if (part) return kPartTable[static_cast<size_t>(nt - 1)];
  return kTable[static_cast<size_t>((nc - 1) * kXwTokens + (nt - 1))];
}

// Columns [c_begin, c_end) of y = x · w, w [rows, cols].
template <typename W>
DUET_SIMD_TARGET void matmul_xw_cols(const W* w, int64_t rows, int64_t cols, const float* x,
                                     int64_t n_tokens, float* y, int64_t c_begin, int64_t c_end) {
  for (int64_t c0 = c_begin; c0 < c_end;) {
    int64_t left = c_end - c0;
    bool part = left < kW;
    int64_t nc = part ? 1 : std::min<int64_t>(kXwCols, left / kW);
    int last = part ? static_cast<int>(left) : kW;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kXwTokens) {
      int64_t nt = std::min<int64_t>(kXwTokens, n_tokens - t0);
      axpy_fn<W>(nc, nt, part)(w + c0, cols, rows, x + t0 * rows, rows, y + t0 * cols + c0, cols,
                               last);
    }
    c0 += part ? left : nc * kW;
  }
}

// ---- entry points for matmul.cpp; w is f32 or bf16 (checked by the caller) ----

DUET_SIMD_TARGET void matmul_rows(const Matrix& w, const float* x, int64_t n_tokens, float* y,
                                  int64_t r_begin, int64_t r_end, bool tiled) {
  if (w.dtype == DType::kBF16) {
    const auto* wp = static_cast<const uint16_t*>(w.data);
    if (tiled) {
      matmul_rows_tiled(wp, w.rows, w.cols, x, n_tokens, y, r_begin, r_end);
    } else {
      matmul_rows_direct(wp, w.rows, w.cols, x, n_tokens, y, r_begin, r_end);
    }
  } else {
    const auto* wp = static_cast<const float*>(w.data);
    if (tiled) {
      matmul_rows_tiled(wp, w.rows, w.cols, x, n_tokens, y, r_begin, r_end);
    } else {
      matmul_rows_direct(wp, w.rows, w.cols, x, n_tokens, y, r_begin, r_end);
    }
  }
}

DUET_SIMD_TARGET void matmul_xw_range(const Matrix& w, const float* x, int64_t n_tokens, float* y,
                                      int64_t c_begin, int64_t c_end) {
  if (w.dtype == DType::kBF16) {
    matmul_xw_cols(static_cast<const uint16_t*>(w.data), w.rows, w.cols, x, n_tokens, y, c_begin,
                   c_end);
  } else {
    matmul_xw_cols(static_cast<const float*>(w.data), w.rows, w.cols, x, n_tokens, y, c_begin,
                   c_end);
  }
}
