// Private to matmul.cpp: the prefill kernel of matmul (y = x · wᵀ for many tokens), written once
// against a vector interface.
//
// No include guard: matmul.cpp includes this file once per instruction set, inside a namespace
// that defines
//   S, kW                          a vector interface from simd_impl.h and its width
//   kPanelVecs, kPanelTokens       the register block: vectors of weight rows × tokens
// and with the macro DUET_SIMD_TARGET set to the matching target attribute.
//
// Outer-product form: a panel of kPanelRows weight rows is widened to f32 and transposed once
// (panel[k][j] = w[r0 + j][k]), then every block of kPanelTokens tokens runs over it
// kPanelDepth columns at a time; each step loads kPanelVecs weight vectors, broadcasts one x
// value per token straight from x's rows, and issues kPanelVecs × kPanelTokens FMAs into
// accumulators that hold a [tokens, rows] block of y itself, so there is no horizontal sum and
// no copy of x. The kPanelDepth columns of panel (32 KiB with AVX-512) stay in L1 while a
// group of tokens streams past them.

constexpr int64_t kPanelRows = kPanelVecs * kW;
constexpr int64_t kPanelDepth = 128;       // columns per microkernel call: 32 KiB of panel in L1
constexpr int64_t kPanelTokenGroup = 128;  // tokens that sweep a panel's columns together

#include "kernels/matmul_panel_store_impl.h"
static_assert(kPanelDepth % (2 * kW) == 0);

// Rows [j0, j0 + kW) × columns [k0, k0 + kn) of panel from w, kn <= kW: a kW × kW block
// loaded row-wise (widened if bf16) and transposed in registers.
template <typename W>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void pack_block(const W* w, int64_t ldw, int64_t nr, int64_t j0,
                                                    int64_t k0, int kn, float* panel) {
  V r[kW];
#pragma GCC unroll 16
  for (int i = 0; i < kW; ++i) {
    const W* src = w + (j0 + i) * ldw + k0;
    r[i] = j0 + i >= nr ? S::zero() : kn == kW ? S::load(src) : S::load_part(src, kn);
  }
  S::transpose(r);
  for (int i = 0; i < kn; ++i) S::store(panel + (k0 + i) * kPanelRows + j0, r[i]);
}

// The same for bf16 and 2 · kW columns: the rows are loaded as kW lanes of bf16 pairs and
// transposed as 32-bit lanes, then each pair is widened into its two panel rows. Half the
// shuffles of two pack_block calls, and no per-element widening shuffle.
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void pack_block_pairs(const uint16_t* w, int64_t ldw,
                                                          int64_t nr, int64_t j0, int64_t k0,
                                                          float* panel) {
  V r[kW];
#pragma GCC unroll 16
  for (int i = 0; i < kW; ++i) {
    r[i] = j0 + i >= nr ? S::zero() : S::load_pairs(w + (j0 + i) * ldw + k0);
  }
  S::transpose(r);
#pragma GCC unroll 16
  for (int i = 0; i < kW; ++i) {
    S::store(panel + (k0 + 2 * i) * kPanelRows + j0, S::even(r[i]));
    S::store(panel + (k0 + 2 * i + 1) * kPanelRows + j0, S::odd(r[i]));
  }
}

// panel[k * kPanelRows + j] = f32(w[j * ldw + k]) for j < nr, k < kc; the rows nr.. of the
// panel are zero.
template <typename W>
DUET_SIMD_TARGET void pack_panel(const W* w, int64_t ldw, int64_t nr, int64_t kc, float* panel) {
  for (int64_t j0 = 0; j0 < kPanelRows; j0 += kW) {
    int64_t k0 = 0;
    if constexpr (std::is_same_v<W, uint16_t>) {
      for (; k0 + 2 * kW <= kc; k0 += 2 * kW) pack_block_pairs(w, ldw, nr, j0, k0, panel);
    }
    for (; k0 < kc; k0 += kW) {
      pack_block(w, ldw, nr, j0, k0, static_cast<int>(std::min<int64_t>(kW, kc - k0)), panel);
    }
  }
}

using matmul_impl::PanelPrefetch;

// y[t * ldy + j] (+)= Σ_k x[t][k0 + k] · f32(panel[k * ldp + j]) for t < T, k < kc,
// j < nr (the lanes at or past nr are not stored); panel holds kPanelRows readable lanes per
// column, f32 or bf16 (widened in registers). Along the way the cache lines of pf are
// prefetched (PanelPrefetch: weights to come, still in memory).
template <int T, typename W>
DUET_SIMD_TARGET void panel_block(const float* const* x, int64_t k0, int64_t kc, const W* panel,
                                  int64_t ldp, float* y, int64_t ldy, int64_t nr, bool accumulate,
                                  PanelPrefetch pf) {
  V acc[T][kPanelVecs];
  const float* xt[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    xt[t] = x[t] + k0;
#pragma GCC unroll 8
    for (int v = 0; v < kPanelVecs; ++v) acc[t][v] = S::zero();
  }
  int64_t pf_due = 0;  // pf.lines per step, counted in kc-ths of a line
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    if (pf.p) {
      for (pf_due += pf.lines; pf_due >= kc; pf_due -= kc, pf.p += 64) {
        _mm_prefetch(pf.p, _MM_HINT_T0);
      }
    }
    V wv[kPanelVecs];
#pragma GCC unroll 8
    for (int v = 0; v < kPanelVecs; ++v) wv[v] = S::load(panel + k * ldp + v * kW);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const V xv = S::set1(xt[t][k]);
#pragma GCC unroll 8
      for (int v = 0; v < kPanelVecs; ++v) acc[t][v] = S::fmadd(wv[v], xv, acc[t][v]);
    }
  }
  store_panel_block(acc, y, ldy, nr, accumulate);
}

template <typename W>
using PanelFn = void (*)(const float* const*, int64_t, int64_t, const W*, int64_t, float*, int64_t,
                         int64_t, bool, PanelPrefetch);

template <typename W, int... I>
constexpr std::array<PanelFn<W>, sizeof...(I)> make_panel_table(std::integer_sequence<int, I...>) {
  return {&panel_block<I + 1, W>...};
}

// The block kernel for 1 <= nt <= kPanelTokens tokens.
template <typename W = float>
PanelFn<W> panel_fn(int64_t nt) {
  static constexpr auto kTable =
      make_panel_table<W>(std::make_integer_sequence<int, kPanelTokens>{});
  return kTable[static_cast<size_t>(nt - 1)];
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens; x[t] is the
// row of token t (cols f32). For each panel of weight rows, all its column blocks are packed
// once, then the tokens run over it kPanelTokenGroup at a time: a group's rows of x (512 KiB at
// 1024 columns) and of y stay in L2 across the column blocks, and the packed panel (256 KiB)
// beside them. Within a group the tokens are cut into the fewest blocks of at most
// kPanelTokens, of sizes differing by at most one (a block of one token has too few
// accumulators to hide the FMA latency). The next panel's weights are prefetched while this
// one computes.
template <typename W>
DUET_SIMD_TARGET void matmul_rows_panel(const W* w, int64_t cols, const float* const* x,
                                        int64_t n_tokens, float* y, int64_t ldy, int64_t r_begin,
                                        int64_t r_end) {
  thread_local std::vector<float> panel_buf;
  float* panel = aligned_floats(panel_buf, cols * kPanelRows);  // [cols, kPanelRows] f32
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kPanelRows) {
    const int64_t nr = std::min(kPanelRows, r_end - r0);
    for (int64_t k0 = 0; k0 < cols; k0 += kPanelDepth) {
      pack_panel(w + r0 * cols + k0, cols, nr, std::min(kPanelDepth, cols - k0),
                 panel + k0 * kPanelRows);
    }
    if (r0 + kPanelRows < r_end) {
      prefetch_rows(w + (r0 + kPanelRows) * cols, cols,
                    std::min(kPanelRows, r_end - r0 - kPanelRows), cols);
    }
    for (int64_t g0 = 0; g0 < n_tokens; g0 += kPanelTokenGroup) {
      const matmul_impl::EvenBlocks tb(std::min(kPanelTokenGroup, n_tokens - g0), kPanelTokens);
      float* yg = y + g0 * ldy + (r0 - r_begin);
      for (int64_t k0 = 0; k0 < cols; k0 += kPanelDepth) {
        const int64_t kc = std::min(kPanelDepth, cols - k0);
        for (int64_t b = 0; b < tb.n; ++b) {
          const int64_t t0 = tb.begin(b);
          panel_fn(tb.size(b))(x + g0 + t0, k0, kc, panel + k0 * kPanelRows, kPanelRows,
                               yg + t0 * ldy, ldy, nr, k0 > 0, PanelPrefetch{});
        }
      }
    }
  }
}

// dst[k * kPanelRows + j] = f32(src[k * Matrix::kPanelRows + j0 + j]) for k < kc, j < nr
// (nr <= kPanelRows, j0 + nr <= Matrix::kPanelRows); lanes nr.. of dst are zero. One column
// block of a packed panel (Matrix::panels) widened (bf16) or copied (f32) for panel_block:
// a straight copy, with no transposition, when nr spans the kernel's whole panel.
template <typename W>
DUET_SIMD_TARGET void widen_panel_chunk(const W* src, int64_t j0, int64_t nr, int64_t kc,
                                        float* dst) {
  static_assert(Matrix::kPanelRows % kPanelRows == 0);
  if (nr == kPanelRows) {
    for (int64_t k = 0; k < kc; ++k) {
#pragma GCC unroll 8
      for (int v = 0; v < kPanelVecs; ++v) {
        S::store(dst + k * kPanelRows + v * kW,
                 S::load(src + k * Matrix::kPanelRows + j0 + v * kW));
      }
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    for (int v = 0; v < kPanelVecs; ++v) {
      const int64_t n = std::clamp<int64_t>(nr - v * kW, 0, kW);
      const W* s = src + k * Matrix::kPanelRows + j0 + v * kW;
      S::store(dst + k * kPanelRows + v * kW, n == kW ? S::load(s)
                                              : n > 0 ? S::load_part(s, static_cast<int>(n))
                                                      : S::zero());
    }
  }
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens, from w's
// packed panels (Matrix::panels, w's dtype W, cols columns); x[t] is the row of token t. The
// same outer-product microkernels as matmul_rows_panel without its per-call transposition,
// kPanelDepth columns at a time (contiguous in memory, read front to back). For few token
// blocks (up to kWidenInRegisterBlocks) and for f32 the microkernels read the panel where it is,
// widening bf16 in registers; for more, each column block is widened once into an L1 buffer
// that every token block reads. The token blocks share out the prefetch of the column block
// kPanelPrefetchBlocks ahead (PanelPrefetch::share). Issued by the first block alone, those 256
// prefetches (bf16) stalled its loads: spread out, a 32000 × 1024 product at 32 tokens on
// 2 threads went from 114–140 to 131–172 GFLOP/s (medians of 60 calls, cold, alternating runs),
// and a batch-32 decode step of the small model from 247–275 to 279–296 tokens/s.
constexpr int64_t kPanelPrefetchBlocks = 1;

template <typename W>
DUET_SIMD_TARGET void matmul_rows_packed(const W* panels, int64_t cols, const float* const* x,
                                         int64_t n_tokens, float* y, int64_t ldy, int64_t r_begin,
                                         int64_t r_end) {
  constexpr int64_t kP = Matrix::kPanelRows;
  thread_local std::vector<float> chunk_buf;
  float* chunk = aligned_floats(chunk_buf, kPanelDepth * kPanelRows);  // [kPanelDepth, kPanelRows]
  for (int64_t r0 = r_begin; r0 < r_end;) {
    const int64_t j0 = r0 % kP;
    const int64_t nr = std::min({kPanelRows, kP - j0, r_end - r0});
    const W* panel = panels + (r0 - j0) * cols;  // [cols, kP]
    for (int64_t g0 = 0; g0 < n_tokens; g0 += kPanelTokenGroup) {
      const matmul_impl::EvenBlocks tb(std::min(kPanelTokenGroup, n_tokens - g0), kPanelTokens);
      // In place: the microkernel's kPanelRows lanes lie inside the stored panel.
      const bool in_place =
          j0 + kPanelRows <= kP && (std::is_same_v<W, float> || tb.n <= kWidenInRegisterBlocks);
      float* yg = y + g0 * ldy + (r0 - r_begin);
      for (int64_t k0 = 0; k0 < cols; k0 += kPanelDepth) {
        const int64_t kc = std::min(kPanelDepth, cols - k0);
        const char* pf =
            reinterpret_cast<const char*>(panel + (k0 + kPanelPrefetchBlocks * kPanelDepth) * kP);
        if (!in_place) widen_panel_chunk(panel + k0 * kP, j0, nr, kc, chunk);
        for (int64_t b = 0; b < tb.n; ++b) {
          const int64_t t0 = tb.begin(b);
          const PanelPrefetch block_pf = PanelPrefetch::share(
              pf, kPanelDepth * kP * static_cast<int64_t>(sizeof(W)), b, tb.n);
          if (in_place) {
            panel_fn<W>(tb.size(b))(x + g0 + t0, k0, kc, panel + k0 * kP + j0, kP, yg + t0 * ldy,
                                    ldy, nr, k0 > 0, block_pf);
          } else {
            panel_fn(tb.size(b))(x + g0 + t0, k0, kc, chunk, kPanelRows, yg + t0 * ldy, ldy, nr,
                                 k0 > 0, block_pf);
          }
        }
      }
    }
    r0 += nr;
  }
}
