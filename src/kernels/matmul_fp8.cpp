#include "kernels/matmul_fp8.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/fp8_rows.h"
#include "kernels/fp8_simd_impl.h"
#include "kernels/matmul_impl.h"

namespace duet {

using fp8_impl::scale_row;

namespace {

int64_t scale_cols(const Matrix& w) {
  return (w.cols + w.f8.block_cols - 1) / w.f8.block_cols;
}

const uint8_t* code_row(const Matrix& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + r * w.cols;
}

// The code and scale rows of rows [r, r + R), with one division (a tile's rows may cross a block).
template <int R>
inline void tile_rows(const Matrix& w, int64_t r, const uint8_t** wr, const float** sr) {
  const int64_t n_cb = scale_cols(w), br = w.f8.block_rows;
  int64_t q = (w.f8.row0 + r) / br, rem = (w.f8.row0 + r) % br;
  for (int i = 0; i < R; ++i) {
    wr[i] = code_row(w, r + i);
    sr[i] = w.f8.scale_inv + q * n_cb;
    if (++rem == br) {
      rem = 0;
      ++q;
    }
  }
}

}  // namespace

float fp8_weight(const Matrix& w, int64_t r, int64_t c) {
  return e4m3_to_f32(code_row(w, r)[c]) * scale_row(w, r)[c / w.f8.block_cols];
}

void dequantize_fp8(const Matrix& w, float* out) {
  DUET_CHECK(w.dtype == DType::kF8E4M3, "dequantize_fp8: dtype " << dtype_name(w.dtype));
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = fp8_weight(w, r, c);
}

namespace fp8_impl {

void matmul_rows_scalar(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t r_begin, int64_t r_end, bool /*tiled*/) {
  const int64_t bc = w.f8.block_cols;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const uint8_t* wr = code_row(w, r);
    const float* sr = scale_row(w, r);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x.row(t, w.cols);
      double acc = 0;
      for (int64_t c0 = 0; c0 < w.cols; c0 += bc) {
        double block = 0;
        for (int64_t c = c0; c < std::min(w.cols, c0 + bc); ++c)
          block += double(e4m3_to_f32(wr[c])) * double(xt[c]);
        acc += block * double(sr[c0 / bc]);
      }
      y[t * ldy + (r - r_begin)] = static_cast<float>(acc);
    }
  }
}

void matmul_xw_cols_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y,
                           int64_t c_begin, int64_t c_end) {
  std::vector<double> acc(static_cast<size_t>(c_end - c_begin));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t r = 0; r < w.rows; ++r) {
      const double xv = x[t * w.rows + r];
      for (int64_t c = c_begin; c < c_end; ++c)
        acc[c - c_begin] += xv * double(fp8_weight(w, r, c));
    }
    for (int64_t c = c_begin; c < c_end; ++c)
      y[t * w.cols + c] = static_cast<float>(acc[c - c_begin]);
  }
}

// GCC 12 warns about its own AVX-512 intrinsics; see simd_impl.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

constexpr int64_t kW = 16;
constexpr int kRows = 4;        // weight rows per register tile
constexpr int kTokens = 3;      // tokens per register tile: 2 × 12 accumulators, 3 x, 4 w
constexpr int64_t kChunk = 32;  // tokens whose x rows stay in L2 while a row range streams by

// The cache line at column c of R rows of codes from pf, ld bytes apart, into L2.
template <int R>
inline void prefetch_lines(const uint8_t* pf, int64_t ld, int64_t c) {
  for (int i = 0; i < R; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(pf + i * ld + c), _MM_HINT_T1);
}

DUET_TARGET_AVX512 inline __mmask16 first(int64_t n) {
  return static_cast<__mmask16>(n >= kW ? 0xffffu : (1u << n) - 1u);
}

using fp8_simd::widen;  // 16 codes' values × 2^-8

// 16 codes' values × 2^-120 in three integer instructions: the sign-extended code shifted left by
// 20 puts E4M3's exponent and mantissa where an f32's low exponent bits and high mantissa bits
// are (bit 31 keeps the sign), so each code reads as an f32 of the same bits with 120 less
// exponent bias; subnormal codes land on f32 subnormals, exactly. (widen's f16 conversion costs
// more than the rest of a one-token step.) Multiplied by x × kShiftX, the products are the true
// ones × 2^-56: normal unless |x| < 2^-61.
DUET_TARGET_AVX512 inline __m512 widen_shift(__m128i codes) {
  const __m512i v = _mm512_slli_epi32(_mm512_cvtepi8_epi32(codes), 20);
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0x87f00000u))));
}
constexpr float kShiftX = 0x1p64f;    // what x must be multiplied by for widen_shift
constexpr float kShiftSum = 0x1p56f;  // what a block's sum is multiplied by, before its scale

// How tile() widens: widen (values × 2^-8, x as it is) or widen_shift (x × kShiftX).
enum class Widen { kF16, kShift };

// y[t * ldy + i] = x[t] · w[r + i] for i < R, t < T: per block, R × T vector partial sums,
// multiplied by the block's scale into R × T totals. The loops over R and T are unrolled so the
// sums stay in registers (-O2 leaves them in memory otherwise: 6x slower). Unless pf is null,
// the R rows of codes at pf (the next tile's, cols bytes apart) are prefetched along the way: a
// row of a few KB is too short for the hardware prefetcher.
// blk[i][j] += the products of columns [c, c + 16) of rows wr[i] and x rows xt[j]: whole
// vectors, or the columns k has (masked loads, the rest zero).
template <int R, int T, Widen kWiden>
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE void step(const uint8_t* const* wr, const float* const* xt,
                                                int64_t c, __mmask16 k, __m512 (&blk)[R][T]) {
  __m512 xv[T];
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j)
    xv[j] = k == 0 ? _mm512_loadu_ps(xt[j] + c) : _mm512_maskz_loadu_ps(k, xt[j] + c);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const __m128i codes = k == 0 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[i] + c))
                                 : _mm_maskz_loadu_epi8(k, wr[i] + c);
    const __m512 wv = kWiden == Widen::kShift ? widen_shift(codes) : widen(codes);
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) blk[i][j] = _mm512_fmadd_ps(wv, xv[j], blk[i][j]);
  }
}

template <int R, int T, Widen kWiden>
DUET_TARGET_AVX512 void tile(const Matrix& w, int64_t r, const float* const* xt, float* y,
                             int64_t ldy, const uint8_t* pf) {
  const int64_t cols = w.cols, bc = w.f8.block_cols;
  const uint8_t* wr[R];
  const float* sr[R];
  tile_rows<R>(w, r, wr, sr);
  __m512 tot[R][T];
  fp8_simd::zero_sums(tot);
  for (int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += bc) {  // block b: no division per block
    const int64_t c1 = std::min(cols, c0 + bc);
    __m512 blk[R][T];
    fp8_simd::zero_sums(blk);
    // Whole vectors with plain loads (the byte load folds into the widening), a cache line of
    // codes per row at a time, then the ragged end masked.
    const int64_t c_full = c0 + (c1 - c0) / kW * kW;
    int64_t c = c0;
    for (; c + 4 * kW <= c_full; c += 4 * kW) {
      if (pf) prefetch_lines<R>(pf, cols, c);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) step<R, T, kWiden>(wr, xt, c + u * kW, 0, blk);
    }
    for (; c < c1; c += kW) {
      if (pf) prefetch_lines<R>(pf, cols, c);
      if (c < c_full) {
        step<R, T, kWiden>(wr, xt, c, 0, blk);
      } else {
        step<R, T, kWiden>(wr, xt, c, first(c1 - c), blk);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 s = _mm512_set1_ps(sr[i][b]);
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) {
        // Scaled back to the true sum first: the scale times 2^56 could overflow.
        const __m512 sum = kWiden == Widen::kShift
                               ? _mm512_mul_ps(blk[i][j], _mm512_set1_ps(kShiftSum))
                               : blk[i][j];
        tot[i][j] = _mm512_fmadd_ps(sum, s, tot[i][j]);
      }
    }
  }
  const float unit = kWiden == Widen::kShift ? 1.0f : 256.0f;
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) y[j * ldy + i] = _mm512_reduce_add_ps(tot[i][j]) * unit;
}

template <int R, Widen kWiden>
DUET_TARGET_AVX512 void tile_tokens(const Matrix& w, int64_t r, const float* const* xt, int n,
                                    float* y, int64_t ldy, const uint8_t* pf) {
  switch (n) {
    case 1:
      return tile<R, 1, kWiden>(w, r, xt, y, ldy, pf);
    case 2:
      return tile<R, 2, kWiden>(w, r, xt, y, ldy, pf);
    default:
      return tile<R, 3, kWiden>(w, r, xt, y, ldy, pf);
  }
}

// The row kernels' loops over row tiles and blocks of tokens, widening as kWiden says.
template <Widen kWiden>
DUET_TARGET_AVX512 void tiles(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                              int64_t r_begin, int64_t r_end) {
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kChunk) {
    const matmul_impl::EvenBlocks tb(std::min(kChunk, n_tokens - t0), kTokens);
    for (int64_t r = r_begin; r < r_end;) {
      const bool full = r_end - r >= kRows;
      // The next tile's rows, while the first token block reads these (past r_end they are
      // another thread's or past the matrix: prefetches never fault).
      const uint8_t* next = code_row(w, r + (full ? kRows : 1));
      for (int64_t b = 0; b < tb.n; ++b) {
        const uint8_t* pf = b == 0 ? next : nullptr;
        const int64_t t = t0 + tb.begin(b);
        const int n = static_cast<int>(tb.size(b));
        const float* xt[kTokens];
        for (int j = 0; j < n; ++j) xt[j] = x.row(t + j, w.cols);
        float* yt = y + t * ldy + (r - r_begin);
        if (full) {
          tile_tokens<kRows, kWiden>(w, r, xt, n, yt, ldy, pf);
        } else {
          tile_tokens<1, kWiden>(w, r, xt, n, yt, ldy, pf);
        }
      }
      r += full ? kRows : 1;
    }
  }
}

}  // namespace

namespace {

// From this many tokens on (batched decode, prefill) rows are widened once into f32 and
// multiplied by the f32 kernels, rather than widened again for every block of kTokens tokens.
constexpr int64_t kWidenOnceTokens = 4;
constexpr int64_t kWidenRows = 32;  // rows widened at a time: 32 × cols f32 stay in L2

// out[nr, cols] f32 = rows [r, r + nr) of w, each weight its code's value × its block's scale.
DUET_TARGET_AVX512 void dequantize_rows(const Matrix& w, int64_t r, int64_t nr, float* out) {
  const int64_t cols = w.cols, bc = w.f8.block_cols;
  for (int64_t i = 0; i < nr; ++i) {
    const uint8_t* wr[1];
    const float* sr[1];
    tile_rows<1>(w, r + i, wr, sr);
    float* o = out + i * cols;
    for (int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += bc) {
      const __m512 s = _mm512_set1_ps(sr[0][b]);
      const int64_t c1 = std::min(cols, c0 + bc);
      for (int64_t c = c0; c < c1; c += kW) {
        const __mmask16 k = first(c1 - c);
        const __m512 v = _mm512_mul_ps(widen(_mm_maskz_loadu_epi8(k, wr[0] + c)), s);
        _mm512_mask_storeu_ps(o + c, k, _mm512_mul_ps(v, _mm512_set1_ps(256.0f)));
      }
    }
  }
}

}  // namespace

DUET_TARGET_AVX512 void matmul_rows_avx512(const Matrix& w, XRows x, int64_t n_tokens, float* y,
                                           int64_t ldy, int64_t r_begin, int64_t r_end,
                                           bool /*tiled*/) {
  DUET_CHECK(w.f8.block_cols % kW == 0, "fp8 matmul: block_cols " << w.f8.block_cols);
  // Batch-invariant products sum every row in one order whatever the token count: never widen
  // once for some counts only.
  if (n_tokens >= kWidenOnceTokens && !matmul_batch_invariant()) {
    thread_local std::vector<float> buf;
    float* wf = matmul_impl::aligned_floats(buf, kWidenRows * w.cols);  // [kWidenRows, cols]
    for (int64_t r = r_begin; r < r_end; r += kWidenRows) {
      const int64_t nr = std::min(kWidenRows, r_end - r);
      dequantize_rows(w, r, nr, wf);
      matmul_impl::matmul_rows_with(simd::Isa::kAvx512, matmul_impl::Path::kAuto,
                                    Matrix{DType::kF32, nr, w.cols, wf}, x, n_tokens,
                                    y + (r - r_begin), ldy, 0, nr);
    }
    return;
  }
  tiles<Widen::kF16>(w, x, n_tokens, y, ldy, r_begin, r_end);
}

DUET_TARGET_AVX512 void matmul_rows_shift_avx512(const Matrix& w, XRows x, int64_t n_tokens,
                                                 float* y, int64_t ldy, int64_t r_begin,
                                                 int64_t r_end) {
  DUET_CHECK(w.f8.block_cols % kW == 0, "fp8 matmul: block_cols " << w.f8.block_cols);
  tiles<Widen::kShift>(w, x, n_tokens, y, ldy, r_begin, r_end);
}

DUET_TARGET_AVX512 void matmul_xw_cols_avx512(const Matrix& w, const float* x, int64_t n_tokens,
                                              float* y, int64_t c_begin, int64_t c_end) {
  DUET_CHECK(w.f8.block_cols % kW == 0 && c_begin % kW == 0,
             "fp8 matmul_xw: block_cols " << w.f8.block_cols << " c_begin " << c_begin);
  const int64_t bc = w.f8.block_cols;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* yt = y + t * w.cols;
    for (int64_t c = c_begin; c < c_end; c += kW)
      _mm512_mask_storeu_ps(yt + c, first(c_end - c), _mm512_setzero_ps());
    for (int64_t r = 0; r < w.rows; ++r) {
      const float xv = x[t * w.rows + r] * 256.0f;
      const uint8_t* wr = code_row(w, r);
      const float* sr = scale_row(w, r);
      for (int64_t c = c_begin; c < c_end;) {  // block by block: one scale each
        const int64_t b = c / bc, c_stop = std::min(c_end, (b + 1) * bc);
        const __m512 a = _mm512_set1_ps(xv * sr[b]);
        for (; c < c_stop; c += kW) {
          const __mmask16 k = first(c_stop - c);
          const __m512 v = widen(_mm_maskz_loadu_epi8(k, wr + c));
          _mm512_mask_storeu_ps(yt + c, k, _mm512_fmadd_ps(a, v, _mm512_maskz_loadu_ps(k, yt + c)));
        }
      }
    }
  }
}

DUET_TARGET_AVX512 void e4m3_values_over_2_120(const uint8_t codes[16], float out[16]) {
  _mm512_storeu_ps(out, widen_shift(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
}

DUET_TARGET_AVX512 void e4m3_values_over_256(const uint8_t codes[16], float out[16]) {
  _mm512_storeu_ps(out, widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
}

// AVX2 (with F16C, which every AVX2 CPU has): the same kernel on 8 lanes. Sixteen ymm registers
// hold 2 rows × 2 tokens of block and total sums; a block's ragged end (only the matrix's last
// block has one) goes through zero-padded copies, AVX2 having no masked byte loads.
#define DUET_TARGET_AVX2_F16C __attribute__((target("avx2,fma,f16c")))

namespace {

constexpr int kRows2 = 2;
constexpr int kTokens2 = 2;

DUET_TARGET_AVX2_F16C inline __m256 widen8(const uint8_t* codes) {
  const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  const __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(c), 7);
  return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0xbfff))));
}

template <int R, int T>
DUET_TARGET_AVX2_F16C void tile8(const Matrix& w, int64_t r, const float* const* xt, float* y,
                                 int64_t ldy, const uint8_t* pf) {
  const int64_t cols = w.cols, bc = w.f8.block_cols;
  const uint8_t* wr[R];
  const float* sr[R];
  tile_rows<R>(w, r, wr, sr);
  __m256 tot[R][T];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) tot[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += bc) {  // block b: no division per block
    const int64_t c1 = std::min(cols, c0 + bc);
    __m256 blk[R][T];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) blk[i][j] = _mm256_setzero_ps();
    for (int64_t c = c0; c < c1; c += 8) {
      const int64_t n = std::min<int64_t>(8, c1 - c);
      if (pf && c % 64 == 0) prefetch_lines<R>(pf, cols, c);
      alignas(32) float xpad[T][8] = {};
      alignas(16) uint8_t wpad[R][8] = {};
      __m256 xv[T];
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) {
        if (n < 8) std::copy(xt[j] + c, xt[j] + c + n, xpad[j]);
        xv[j] = n < 8 ? _mm256_load_ps(xpad[j]) : _mm256_loadu_ps(xt[j] + c);
      }
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        if (n < 8) std::copy(wr[i] + c, wr[i] + c + n, wpad[i]);
        const __m256 wv = widen8(n < 8 ? wpad[i] : wr[i] + c);
#pragma GCC unroll 8
        for (int j = 0; j < T; ++j) blk[i][j] = _mm256_fmadd_ps(wv, xv[j], blk[i][j]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m256 sv = _mm256_set1_ps(sr[i][b]);
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) tot[i][j] = _mm256_fmadd_ps(blk[i][j], sv, tot[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, tot[i][j]);
      float sum = 0;
      for (float v : lanes) sum += v;
      y[j * ldy + i] = sum * 256.0f;
    }
  }
}

template <int R>
DUET_TARGET_AVX2_F16C void tile8_tokens(const Matrix& w, int64_t r, const float* const* xt, int n,
                                        float* y, int64_t ldy, const uint8_t* pf) {
  if (n == 1) return tile8<R, 1>(w, r, xt, y, ldy, pf);
  tile8<R, 2>(w, r, xt, y, ldy, pf);
}

}  // namespace

DUET_TARGET_AVX2_F16C void matmul_rows_avx2(const Matrix& w, XRows x, int64_t n_tokens, float* y,
                                            int64_t ldy, int64_t r_begin, int64_t r_end,
                                            bool /*tiled*/) {
  DUET_CHECK(w.f8.block_cols % 8 == 0, "fp8 matmul: block_cols " << w.f8.block_cols);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kChunk) {
    const matmul_impl::EvenBlocks tb(std::min(kChunk, n_tokens - t0), kTokens2);
    for (int64_t r = r_begin; r < r_end;) {
      const bool full = r_end - r >= kRows2;
      const uint8_t* next = code_row(w, r + (full ? kRows2 : 1));  // prefetched, as above
      for (int64_t b = 0; b < tb.n; ++b) {
        const uint8_t* pf = b == 0 ? next : nullptr;
        const int64_t t = t0 + tb.begin(b);
        const int n = static_cast<int>(tb.size(b));
        const float* xt[kTokens2];
        for (int j = 0; j < n; ++j) xt[j] = x.row(t + j, w.cols);
        float* yt = y + t * ldy + (r - r_begin);
        if (full) {
          tile8_tokens<kRows2>(w, r, xt, n, yt, ldy, pf);
        } else {
          tile8_tokens<1>(w, r, xt, n, yt, ldy, pf);
        }
      }
      r += full ? kRows2 : 1;
    }
  }
}

#pragma GCC diagnostic pop

namespace {

bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c");
  return yes;
}

}  // namespace

RowsFn rows_fn(simd::Isa isa) {
  if (isa == simd::Isa::kScalar) return &matmul_rows_scalar;
  if (isa == simd::Isa::kAvx2) return has_f16c() ? &matmul_rows_avx2 : &matmul_rows_scalar;
  if (simd::has_dpbf16(isa)) return pairs_rows_fn(isa);
  return &matmul_rows_avx512;
}

XwColsFn xw_cols_fn(simd::Isa isa) {
  return isa == simd::Isa::kScalar || isa == simd::Isa::kAvx2 ? &matmul_xw_cols_scalar
                                                              : &matmul_xw_cols_avx512;
}

}  // namespace fp8_impl

}  // namespace duet
