// One-token products with fp8 weights on CPUs with AVX-512 BF16 and VBMI (Zen 4, Sapphire Rapids):
// each 64 codes become 64 exact bf16 values by two 128-entry byte look-ups (vpermi2b: the high and
// the low bytes of code → bf16(value × 2^-8), the sign OR-ed into the high byte) and two byte
// interleavings, and are multiplied with vdpbf16ps, 32 products an instruction: 7 instructions
// for 64 weights where widening to f32 takes 16 (matmul_fp8.cpp's shift path). The interleaving
// works within 128-bit lanes, so the two vectors hold codes {0-7, 16-23, 32-39, 48-55} and
// {8-15, 24-31, 40-47, 56-63} of the 64; x's bf16 pairs are permuted alike (two vpermt2w per 64
// columns, shared by a tile's 4 rows).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul_fp8.h"

namespace duet::fp8_impl {

#define DUET_TARGET_FP8_LUT \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16,avx512vbmi")))

namespace {

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where inlined (see simd_impl.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr int64_t kChunk = 64;  // codes a step reads per row
constexpr int kRows = 4;        // rows per tile
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
  __m512i first, second;           // x's permutations (words of two registers of x)
};

DUET_TARGET_FP8_LUT Regs regs() {
  const Tables& t = tables();
  Regs r;
  r.hi_a = _mm512_load_si512(t.hi.data());
  r.hi_b = _mm512_load_si512(t.hi.data() + 64);
  r.lo_a = _mm512_load_si512(t.lo.data());
  r.lo_b = _mm512_load_si512(t.lo.data() + 64);
  r.sign = _mm512_set1_epi8(static_cast<char>(0x80));
  // Word j of the first vector: x element 16 · (j / 8) + j % 8; of the second, 8 more.
  alignas(64) uint16_t first[32], second[32];
  for (int j = 0; j < 32; ++j) {
    first[j] = static_cast<uint16_t>(16 * (j / 8) + j % 8);
    second[j] = static_cast<uint16_t>(first[j] + 8);
  }
  r.first = _mm512_load_si512(first);
  r.second = _mm512_load_si512(second);
  return r;
}

DUET_TARGET_FP8_LUT DUET_ALWAYS_INLINE __mmask64 first_bytes(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
}

// y[i] = x · w[r + i] for i < R: per block of bc columns, R vector sums of pairs, multiplied by
// the block's scale into R totals. Unless pf is null, R rows of codes at pf (cols apart: the next
// tile's, or a later one's) are prefetched a cache line a step, as the other fp8 kernels do.
template <int R>
DUET_TARGET_FP8_LUT void lut_tile(const Regs& g, const uint8_t* const* wr, const float* const* sr,
                                  int64_t cols, int64_t bc, const uint16_t* x, float* y,
                                  const uint8_t* pf) {
  __m512 tot[R];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) tot[i] = _mm512_setzero_ps();
  for (int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += bc) {  // block b: no division per block
    const int64_t c1 = std::min(cols, c0 + bc);
    __m512 blk[R];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) blk[i] = _mm512_setzero_ps();
    for (int64_t c = c0; c < c1; c += kChunk) {
      const int64_t n = c1 - c;  // past the block's (or the row's) end: zero codes and x
      const __mmask64 k = first_bytes(n);
      const __m512i x0 = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(k), x + c);
      const __m512i x1 = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(k >> 32), x + c + 32);
      const __m512bh xa = (__m512bh)_mm512_permutex2var_epi16(x0, g.first, x1);
      const __m512bh xb = (__m512bh)_mm512_permutex2var_epi16(x0, g.second, x1);
      if (pf) {
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(pf + i * cols + c), _MM_HINT_T1);
      }
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const __m512i a =
            n >= kChunk ? _mm512_loadu_si512(wr[i] + c) : _mm512_maskz_loadu_epi8(k, wr[i] + c);
        // hi | (a & sign): the code's sign into bf16's sign bit
        const __m512i hi =
            _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(g.hi_a, a, g.hi_b), a, g.sign, 0xf8);
        const __m512i lo = _mm512_permutex2var_epi8(g.lo_a, a, g.lo_b);
        blk[i] = _mm512_dpbf16_ps(blk[i], (__m512bh)_mm512_unpacklo_epi8(lo, hi), xa);
        blk[i] = _mm512_dpbf16_ps(blk[i], (__m512bh)_mm512_unpackhi_epi8(lo, hi), xb);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) tot[i] = _mm512_fmadd_ps(blk[i], _mm512_set1_ps(sr[i][b]), tot[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) y[i] = _mm512_reduce_add_ps(tot[i]) * 256.0f;
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

DUET_TARGET_FP8_LUT void matmul_row_lut(const Matrix& w, const uint16_t* x, float* y,
                                        int64_t r_begin, int64_t r_end) {
  DUET_CHECK(lut_applies(w), "fp8 lut: block_cols " << w.f8.block_cols);
  const Regs g = regs();
  const int64_t cols = w.cols, bc = w.f8.block_cols;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const int64_t ahead = std::max<int64_t>(1, (kPrefetchBytes / cols + kRows - 1) / kRows) * kRows;
  for (int64_t r = r_begin; r < r_end;) {
    const bool full = r_end - r >= kRows;
    const int nr = full ? kRows : 1;
    const uint8_t* wr[kRows];
    const float* sr[kRows];
    for (int i = 0; i < nr; ++i) {
      wr[i] = codes + (r + i) * cols;
      sr[i] = scale_row(w, r + i);
    }
    // The rows `ahead` past these (past r_end another task's or past the matrix: prefetches never
    // fault); the ones between were prefetched by earlier tiles.
    const uint8_t* pf = codes + (r + ahead) * cols;
    if (full) {
      lut_tile<kRows>(g, wr, sr, cols, bc, x, y + (r - r_begin), pf);
    } else {
      lut_tile<1>(g, wr, sr, cols, bc, x, y + (r - r_begin), pf);
    }
    r += nr;
  }
}

}  // namespace duet::fp8_impl
