// Private to matmul.cpp: the SIMD kernels of matmul_xw (y = x · w, the weight untransposed),
// written once against a vector interface.
//
// No include guard: matmul.cpp includes this file once per instruction set, inside a namespace
// that defines
//   S                  a vector interface from simd_impl.h (simd::Avx512, simd::Avx2)
//   kXwCols, kXwTokens the register block: vectors of output columns × tokens
//   kXwOneCols         the register block of one token: vectors of output columns
// and with the macro DUET_SIMD_TARGET set to the matching target attribute. It uses V and kW
// from matmul_simd_impl.h, included first.

// Vectors run along the output columns; each weight row is read once per token block.

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

// y[j] = Σ_r x[r] · w[r * ldw + j] for j < kXwOneCols · kW: axpy_block<kXwOneCols, 1>'s sums,
// each weight vector loaded by its FMA rather than all of a row's first (22-26 against 27-31 us
// for one layer's 16 heads of W_UK, deepseek_v3 small, cold; Zen 4).
template <typename W>
DUET_SIMD_TARGET void axpy_one(const W* w, int64_t ldw, int64_t n_rows, const float* x, float* y) {
  V acc[kXwOneCols];
#pragma GCC unroll 16
  for (int c = 0; c < kXwOneCols; ++c) acc[c] = S::zero();
  for (int64_t r = 0; r < n_rows; ++r) {
    const W* wr = w + r * ldw;
    const V xv = S::set1(x[r]);
#pragma GCC unroll 16
    for (int c = 0; c < kXwOneCols; ++c) acc[c] = S::fmadd(S::load(wr + c * kW), xv, acc[c]);
  }
#pragma GCC unroll 16
  for (int c = 0; c < kXwOneCols; ++c) S::store(y + c * kW, acc[c]);
}

// Columns [c_begin, c_end) of y = x · w, w [rows, cols]. One token takes kXwOneCols vectors of
// columns a pass (AVX-512: 256 columns, 512 bytes of a bf16 row), so that each weight row is
// read in one run of whole cache lines rather than in strips of kXwCols vectors, a pass each:
// MLA's q · W_UK (64 × 256 a head on the small presets, 128 × 512 on DeepSeek-V3) streams its
// rows. A column's sum is the same chain of FMAs over the rows either way.
template <typename W>
DUET_SIMD_TARGET void matmul_xw_cols(const W* w, int64_t rows, int64_t cols, const float* x,
                                     int64_t n_tokens, float* y, int64_t c_begin, int64_t c_end) {
  for (int64_t c0 = c_begin; c0 < c_end;) {
    int64_t left = c_end - c0;
    if (n_tokens == 1 && left >= kXwOneCols * kW) {
      axpy_one(w + c0, cols, rows, x, y + c0);
      c0 += kXwOneCols * kW;
      continue;
    }
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
