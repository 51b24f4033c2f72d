// Few-token products (decode's, below the pairs kernels' 8 tokens) with fp8 weights on CPUs with
// AVX-512 BF16 and VBMI (Zen 4, Sapphire Rapids): each 64 codes become 64 exact bf16 values in two
// vectors of words, the even-numbered codes' and the odd-numbered ones', and are multiplied with
// vdpbf16ps, 32 products an instruction, against x's even and odd columns (split once per call).
// A normal code's bf16(value × 2^-8) is its bits shifted and OR-ed with a constant (3 shifts and
// 4 bitwise instructions for the 64, no shuffle: fp8_simd::bf16_of_normal); the codes of exponent 0
// (zeros and subnormals, where that formula is wrong) send their 64 codes to two 128-entry byte
// look-ups (vpermi2b: the high and the low bytes of the value), which give every code exactly. On
// Emerald Rapids the look-ups for all codes ran at 11 GB/s a core from L2 (vpermi2b is slow on
// Intel), as fast as the memory's share of a core: one-token fp8 products were compute-bound there.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/fp8_simd_impl.h"
#include "kernels/matmul_fp8.h"
#include "kernels/matmul_impl.h"

namespace duet::fp8_impl {

#define DUET_TARGET_FP8_LUT \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16,avx512vbmi")))

namespace {

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where inlined (see simd_impl.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr int64_t kChunk = 64;  // codes a step reads per row
constexpr int kRows = 4;        // rows per tile at one token (tile_rows)
constexpr int kTokens = 3;      // tokens per tile
// Rows are prefetched from the first tile at least this far past the current one: one tile of
// 1 KB rows (4 KB) ahead left one thread reading 15-16 GB/s from memory, two tiles 19-21.
constexpr int64_t kPrefetchBytes = 8192;

// The high and low bytes of bf16(e4m3(code) × 2^-8) for the 128 codes of sign 0 (every such
// value is a bf16 exactly: at most 4 significant bits, exponents -17 to 0; 0x7f's NaN stays one).
struct Tables {
  alignas(64) std::array<uint8_t, 128> hi;
  alignas(64) std::array<uint8_t, 128> lo;
};

const Tables& tables() {
  static const Tables t = [] {
    Tables t{};
    for (int base = 0; base < 128; base += 16) {
      uint8_t codes[16];
      float v[16];
      for (int i = 0; i < 16; ++i) codes[i] = static_cast<uint8_t>(base + i);
      e4m3_values_over_256(codes, v);
      for (int i = 0; i < 16; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &v[i], 4);
        t.hi[base + i] = static_cast<uint8_t>(bits >> 24);
        t.lo[base + i] = static_cast<uint8_t>(bits >> 16);
      }
    }
    return t;
  }();
  return t;
}

struct Regs {
  __m512i hi_a, hi_b, lo_a, lo_b;  // the tables, 64 bytes a register
  __m512i sign;                    // 0x80 in every byte
  __m512i low_byte, high_byte;     // 0x00ff, 0xff00 in every word
};

DUET_TARGET_FP8_LUT Regs regs() {
  const Tables& t = tables();
  Regs r;
  r.hi_a = _mm512_load_si512(t.hi.data());
  r.hi_b = _mm512_load_si512(t.hi.data() + 64);
  r.lo_a = _mm512_load_si512(t.lo.data());
  r.lo_b = _mm512_load_si512(t.lo.data() + 64);
  r.sign = _mm512_set1_epi8(static_cast<char>(0x80));
  r.low_byte = _mm512_set1_epi16(0x00ff);
  r.high_byte = _mm512_set1_epi16(static_cast<int16_t>(0xff00));
  return r;
}

// ev word j = bf16(value of code 2j × 2^-8), od word j = that of code 2j + 1, for the 64 codes
// a (bytes past the step's k: not read): by shifts (fp8_simd::bf16_of_normal; a word of a holds
// code 2j in its low byte and 2j + 1 in its high one), or, where a code of the step has exponent
// 0, by the look-ups, exact for every code but the NaNs (read as ±480 by the shifts, NaN here).
DUET_TARGET_FP8_LUT DUET_ALWAYS_INLINE void widen_step(const Regs& g, __m512i a, __mmask64 k,
                                                       __m512i& ev, __m512i& od) {
  ev = fp8_simd::bf16_of_normal(_mm512_slli_epi16(a, 4), _mm512_slli_epi16(a, 8));
  od = fp8_simd::bf16_of_normal(_mm512_srli_epi16(a, 4), a);
  if (__builtin_expect(fp8_simd::has_exponent_0(a, k), 0)) {
    // hi | (a & sign): the code's sign into bf16's sign bit
    const __m512i hi =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(g.hi_a, a, g.hi_b), a, g.sign, 0xf8);
    const __m512i lo = _mm512_permutex2var_epi8(g.lo_a, a, g.lo_b);
    ev = _mm512_ternarylogic_epi32(lo, g.low_byte, _mm512_slli_epi16(hi, 8), 0xea);
    od = _mm512_ternarylogic_epi32(hi, g.high_byte, _mm512_srli_epi16(lo, 8), 0xea);
  }
}

DUET_TARGET_FP8_LUT DUET_ALWAYS_INLINE __mmask64 first_bytes(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
}

// y[j * ldy + i] = x[j] · w[r + i] for i < R, j < T (x's columns split, rows ldx apart: see
// split_x): per block of bc columns, R × T vector sums of pairs, multiplied by the block's scale
// into R × T totals; each row's 64 codes are widened once for all T tokens. Unless pf is null, R
// rows of codes at pf (cols apart: a later tile's) are prefetched a cache line a step, as the
// other fp8 kernels do.
template <int R, int T>
DUET_TARGET_FP8_LUT void lut_tile(const Regs& g, const uint8_t* const* wr, const float* const* sr,
                                  int64_t cols, int64_t bc, const uint16_t* x, int64_t ldx,
                                  float* y, int64_t ldy, const uint8_t* pf) {
  __m512 tot[R][T];
  fp8_simd::zero_sums(tot);
  for (int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += bc) {  // block b: no division per block
    const int64_t c1 = std::min(cols, c0 + bc);
    __m512 blk[R][T];
    fp8_simd::zero_sums(blk);
    for (int64_t c = c0; c < c1; c += kChunk) {
      const int64_t n = c1 - c;  // past the block's (or the row's) end: x zero, codes not read
      const __mmask64 k = first_bytes(n);
      __m512bh xa[T], xb[T];
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) {
        xa[j] = (__m512bh)_mm512_loadu_si512(x + j * ldx + c);
        xb[j] = (__m512bh)_mm512_loadu_si512(x + j * ldx + c + kChunk / 2);
      }
      if (pf) {
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(pf + i * cols + c), _MM_HINT_T1);
      }
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const __m512i a =
            n >= kChunk ? _mm512_loadu_si512(wr[i] + c) : _mm512_maskz_loadu_epi8(k, wr[i] + c);
        __m512i ev, od;
        widen_step(g, a, k, ev, od);
#pragma GCC unroll 8
        for (int j = 0; j < T; ++j) {
          blk[i][j] = _mm512_dpbf16_ps(blk[i][j], (__m512bh)ev, xa[j]);
          blk[i][j] = _mm512_dpbf16_ps(blk[i][j], (__m512bh)od, xb[j]);
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 s = _mm512_set1_ps(sr[i][b]);
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) tot[i][j] = _mm512_fmadd_ps(blk[i][j], s, tot[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) y[j * ldy + i] = _mm512_reduce_add_ps(tot[i][j]) * 256.0f;
}

// x's n_tokens rows (bf16, ldx apart, cols each) with each 64 columns' even-numbered ones first
// and then the odd-numbered ones, as lut_tile pairs them with the codes, into buf: rows of cols
// rounded up to 64 (zero past cols), that many apart. Returns buf's data.
DUET_TARGET_FP8_LUT const uint16_t* split_x(const uint16_t* x, int64_t ldx, int64_t n_tokens,
                                            int64_t cols, std::vector<uint16_t>& buf) {
  const int64_t ld = (cols + kChunk - 1) / kChunk * kChunk;
  if (buf.size() < static_cast<size_t>(n_tokens * ld)) buf.resize(n_tokens * ld);
  alignas(64) uint16_t even[32], odd[32];
  for (int j = 0; j < 32; ++j) {
    even[j] = static_cast<uint16_t>(2 * j);
    odd[j] = static_cast<uint16_t>(2 * j + 1);
  }
  const __m512i ie = _mm512_load_si512(even), io = _mm512_load_si512(odd);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < cols; c += kChunk) {
      const __mmask64 k = first_bytes(cols - c);  // a bit a column: 32 for x0, 32 for x1
      const __m512i x0 = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(k), x + t * ldx + c);
      const __m512i x1 =
          _mm512_maskz_loadu_epi16(static_cast<__mmask32>(k >> 32), x + t * ldx + c + 32);
      uint16_t* out = buf.data() + t * ld + c;
      _mm512_storeu_si512(out, _mm512_permutex2var_epi16(x0, ie, x1));
      _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(x0, io, x1));
    }
  }
  return buf.data();
}

using TileFn = void (*)(const Regs&, const uint8_t* const*, const float* const*, int64_t, int64_t,
                        const uint16_t*, int64_t, float*, int64_t, const uint8_t*);

// The tile for nr rows and nt tokens (1 to kTokens): 4 rows at one token, 2 rows (or 1, for the
// last) from two on, so that the sums, totals, x's pairs and the tables fit in 32 registers.
TileFn tile_fn(int nr, int nt) {
  static constexpr TileFn kOneRow[kTokens] = {&lut_tile<1, 1>, &lut_tile<1, 2>, &lut_tile<1, 3>};
  static constexpr TileFn kTwoRows[kTokens] = {&lut_tile<2, 1>, &lut_tile<2, 2>, &lut_tile<2, 3>};
  DUET_CHECK(nt >= 1 && nt <= kTokens && (nr == 1 || nr == 2 || (nr == kRows && nt == 1)),
             "fp8 lut tile: " << nr << " rows, " << nt << " tokens");
  if (nr == kRows) return &lut_tile<kRows, 1>;
  return nr == 2 ? kTwoRows[nt - 1] : kOneRow[nt - 1];
}

// Rows per tile for blocks of at most nt tokens.
constexpr int tile_rows(int64_t nt) {
  return nt == 1 ? kRows : 2;
}

#pragma GCC diagnostic pop

}  // namespace

bool lut_supported() {
  static const bool yes = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512vbmi") &&
                          __builtin_cpu_supports("avx512bw");
  return yes;
}

bool lut_applies(const Matrix& w) {
  return w.f8.block_cols % kChunk == 0;
}

bool lut_serves(simd::Isa isa, const Matrix& w, int64_t n_tokens) {
  return isa == simd::Isa::kAvx512Bf16 && n_tokens < matmul_impl::kFp8PairsMinTokens &&
         !matmul_batch_invariant() && lut_supported() && lut_applies(w);
}

DUET_TARGET_FP8_LUT void matmul_rows_lut(const Matrix& w, const uint16_t* x, int64_t ldx,
                                         int64_t n_tokens, float* y, int64_t ldy, int64_t r_begin,
                                         int64_t r_end) {
  DUET_CHECK(lut_applies(w) && n_tokens >= 1,
             "fp8 lut: block_cols " << w.f8.block_cols << ", " << n_tokens << " tokens");
  const Regs g = regs();
  const int64_t cols = w.cols, bc = w.f8.block_cols;
  thread_local std::vector<uint16_t> x_buf;
  x = split_x(x, ldx, n_tokens, cols, x_buf);
  ldx = (cols + kChunk - 1) / kChunk * kChunk;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const matmul_impl::EvenBlocks tb(n_tokens, kTokens);
  const int rows = tile_rows(tb.size(0));  // the largest block's
  const int64_t ahead = std::max<int64_t>(1, (kPrefetchBytes / cols + rows - 1) / rows) * rows;
  for (int64_t r = r_begin; r < r_end;) {
    const int nr = r_end - r >= rows ? rows : 1;
    const uint8_t* wr[kRows];
    const float* sr[kRows];
    for (int i = 0; i < nr; ++i) {
      wr[i] = codes + (r + i) * cols;
      sr[i] = scale_row(w, r + i);
    }
    for (int64_t b = 0; b < tb.n; ++b) {
      const int64_t t = tb.begin(b);
      // The rows `ahead` past these (past r_end another task's or past the matrix: prefetches
      // never fault), with the first block of tokens; the ones between came with earlier tiles.
      const uint8_t* pf = b == 0 ? codes + (r + ahead) * cols : nullptr;
      tile_fn(nr, static_cast<int>(tb.size(b)))(g, wr, sr, cols, bc, x + t * ldx, ldx,
                                                y + t * ldy + (r - r_begin), ldy, pf);
    }
    r += nr;
  }
}

}  // namespace duet::fp8_impl
