#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul_q8_impl.h"
#include "kernels/quantize.h"

#define DUET_TARGET_AVX512VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512vnni")))
// AVX2 with F16C, for the weights' f16 scales (every AVX2 CPU has F16C).
#define DUET_TARGET_AVX2_F16C __attribute__((target("avx2,fma,f16c")))

// See simd_impl.h: GCC 12's AVX-512 intrinsics trip -Wuninitialized where they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace duet::matmul_q8 {

namespace {

constexpr int64_t kSuper = kQ8Align;  // columns per superblock: 4 groups
constexpr int64_t kSuperBytes = 512;  // bytes of a block's kQ8 superblock: 8 steps of 64
constexpr int kSteps = 8;             // vectors of x per superblock (of kQ8 weights; kQ4: 4)
constexpr int kLanes = 16;            // (row, group) pairs per block's superblock
constexpr int64_t kPrefetchBytes = 8192;  // how far ahead the blocks prefetch their weights

// Rows per pool task in matmul_with: few enough to spread one expert's rows over the threads.
constexpr int64_t kTaskRows = 16;
// Below this many multiply-adds a product runs on the calling thread.
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;

// ---- The vector kernels. Each K has, for one block of 4 rows and one superblock:
//   VI init(corr)             the int32 accumulator's start (VNNI: -128 · Σ q_x per group)
//   W prep(w)                 one step's 64 weight bytes, loaded once for all tokens
//   VI dot(acc, w, x)         acc + the step's byte products, 4 per lane (x: 16 bytes)
//   VF row_factors(wd)        the block's 4 row factors D, each in its row's 4 lanes
//   VF finish(acc, ws, dw, xs, f)  f + acc · (s_w · D) · d_x, per lane (ws: the 16 f16 scales
//                             s_w; dw: row_factors; s_w · D is exact, D a power of two)
//   reduce(f, out)            out[r] = the sum of row r's 4 lanes
// and for kQ4 weights, whose bytes are u = q + 8 in [0, 15] on every kernel (u · x pairs reach
// 2 · 15 · 127 < 2^15, so vpmaddubsw takes them unsigned without saturating):
//   VI init_u4(corr)          -8 · Σ q_x per group (corr / 16, exact)
//   unpack_u4(w, lo, hi)      64 bytes of nibbles: steps k (low) and k + 4 (high), as bytes
//   VI dot_u(acc, u, x)       acc + the step's products of unsigned weight bytes
// and, where kHigh16 (the VNNI kernels: vpdpbusd sums its 4 byte products into 32 bits, so 16 · u
// up to 240 cannot saturate, where vpmaddubsw's pairs would):
//   unpack_u4_high16(w, lo, hi16)  as unpack_u4, but the high nibbles left in place (16 · u), so
//                             unpacking takes no shift (on Intel's cores shifts of 512 bits share
//                             the one port that runs vpdpbusd)
//   VI zero_i()               0
//   VI add_high16(acc, hi16)  acc + hi16 / 16 (exact: hi16's sums are 16 · integers)

// v held in a register from here on: GCC would otherwise fold its load into each of its uses,
// loading it again for each (int4's unpacking: twice), which slowed the one-token blocks by about
// a tenth on Zen 4 (README, "Loads at one token").
template <typename V>
DUET_ALWAYS_INLINE void in_register(V& v) {
  asm("" : "+x"(v));
}

// Without VNNI: |x| · (w with x's signs) by vpmaddubsw, whose pairs reach at most 2 · 127² < 2^15
// (never saturating), then vpmaddwd by ones.
struct Avx512 {
  static constexpr bool kHigh16 = false;
  using VI = __m512i;
  using VF = __m512;
  using W = __m512i;
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VI init(const int32_t*) {
    return _mm512_setzero_si512();
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static W prep(const uint8_t* w) {
    return _mm512_xor_si512(_mm512_loadu_si512(w), _mm512_set1_epi8(char(0x80)));  // q
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VI dot(VI acc, W w, const int8_t* x) {
    const __m512i xb = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    const __m512i signed_w =
        _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(xb), _mm512_setzero_si512(), w);
    const __m512i pairs = _mm512_maddubs_epi16(_mm512_abs_epi8(xb), signed_w);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VI init_u4(const int32_t* corr) {
    return _mm512_srai_epi32(_mm512_loadu_si512(corr), 4);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static void unpack_u4(const uint8_t* w, W& lo, W& hi) {
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    __m512i v = _mm512_loadu_si512(w);
    in_register(v);
    lo = _mm512_and_si512(v, nibble);
    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VI dot_u(VI acc, W u, const int8_t* x) {
    const __m512i xb = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    const __m512i pairs = _mm512_maddubs_epi16(u, xb);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VF zero() { return _mm512_setzero_ps(); }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VF row_factors(const float* wd) {
    const __m512i lane_row = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(lane_row, _mm512_castps128_ps512(_mm_loadu_ps(wd)));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VF finish(VI acc, const uint16_t* ws, VF dw,
                                                         const float* xs, VF f) {
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws)));
    const __m512 d = _mm512_mul_ps(_mm512_mul_ps(s, dw), _mm512_loadu_ps(xs));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), d, f);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static void reduce(VF f, float* out) {
    f = _mm512_add_ps(f, _mm512_shuffle_ps(f, f, 0xb1));
    f = _mm512_add_ps(f, _mm512_shuffle_ps(f, f, 0x4e));
    alignas(64) float tmp[16];
    _mm512_store_ps(tmp, f);
    for (int r = 0; r < 4; ++r) out[r] = tmp[4 * r];
  }
};

// With VNNI: vpdpbusd takes the weights' bytes unsigned (q + 128) against x's signed bytes,
// started from -128 · Σ q_x per group; the rest as without.
struct Avx512Vnni : Avx512 {
  static constexpr bool kHigh16 = true;
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VI init(const int32_t* corr) {
    return _mm512_loadu_si512(corr);
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static W prep(const uint8_t* w) {
    return _mm512_loadu_si512(w);
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VI dot(VI acc, W w, const int8_t* x) {
    const __m512i xb = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    return _mm512_dpbusd_epi32(acc, w, xb);
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VI dot_u(VI acc, W u, const int8_t* x) {
    return dot(acc, u, x);
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static void unpack_u4_high16(const uint8_t* w, W& lo,
                                                                         W& hi16) {
    __m512i v = _mm512_loadu_si512(w);
    in_register(v);
    lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    hi16 = _mm512_and_si512(v, _mm512_set1_epi8(char(0xf0)));
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VI zero_i() { return _mm512_setzero_si512(); }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VI add_high16(VI acc, VI hi16) {
    return _mm512_add_epi32(acc, _mm512_srai_epi32(hi16, 4));
  }
};

// The same in two 32-byte halves (rows 0-1, rows 2-3).
struct Avx2 {
  static constexpr bool kHigh16 = false;
  struct VI {
    __m256i h[2];
  };
  struct VF {
    __m256 h[2];
  };
  using W = VI;
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI init(const int32_t*) {
    return {{_mm256_setzero_si256(), _mm256_setzero_si256()}};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static W prep(const uint8_t* w) {
    const __m256i bias = _mm256_set1_epi8(char(0x80));
    const auto* p = reinterpret_cast<const __m256i*>(w);
    return {{_mm256_xor_si256(_mm256_loadu_si256(p), bias),
             _mm256_xor_si256(_mm256_loadu_si256(p + 1), bias)}};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI dot(VI acc, const W& w, const int8_t* x) {
    const __m256i xb =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    const __m256i ax = _mm256_sign_epi8(xb, xb);
    for (int i = 0; i < 2; ++i) {
      const __m256i pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w.h[i], xb));
      acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    }
    return acc;
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI init_u4(const int32_t* corr) {
    const auto* p = reinterpret_cast<const __m256i*>(corr);
    return {{_mm256_srai_epi32(_mm256_loadu_si256(p), 4),
             _mm256_srai_epi32(_mm256_loadu_si256(p + 1), 4)}};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static void unpack_u4(const uint8_t* w, W& lo, W& hi) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    const auto* p = reinterpret_cast<const __m256i*>(w);
    for (int i = 0; i < 2; ++i) {
      __m256i v = _mm256_loadu_si256(p + i);
      in_register(v);
      lo.h[i] = _mm256_and_si256(v, nibble);
      hi.h[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    }
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI dot_u(VI acc, const W& u, const int8_t* x) {
    const __m256i xb =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    for (int i = 0; i < 2; ++i) {
      const __m256i pairs = _mm256_maddubs_epi16(u.h[i], xb);
      acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    }
    return acc;
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VF zero() {
    return {{_mm256_setzero_ps(), _mm256_setzero_ps()}};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VF row_factors(const float* wd) {
    return {{_mm256_set_m128(_mm_set1_ps(wd[1]), _mm_set1_ps(wd[0])),
             _mm256_set_m128(_mm_set1_ps(wd[3]), _mm_set1_ps(wd[2]))}};
  }
  DUET_TARGET_AVX2_F16C DUET_ALWAYS_INLINE static VF finish(const VI& acc, const uint16_t* ws,
                                                            const VF& dw, const float* xs, VF f) {
    for (int i = 0; i < 2; ++i) {
      const __m256 s =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + 8 * i)));
      const __m256 d = _mm256_mul_ps(_mm256_mul_ps(s, dw.h[i]), _mm256_loadu_ps(xs + 8 * i));
      f.h[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc.h[i]), d, f.h[i]);
    }
    return f;
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static void reduce(VF f, float* out) {
    for (int i = 0; i < 2; ++i) {
      __m256 v = _mm256_add_ps(f.h[i], _mm256_shuffle_ps(f.h[i], f.h[i], 0xb1));
      v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0x4e));
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, v);
      out[2 * i] = tmp[0];
      out[2 * i + 1] = tmp[4];
    }
  }
};

// AVX-VNNI: the VEX vpdpbusd on ymm registers (Alder Lake and later client CPUs); F16C for
// Avx2's finish.
#define DUET_TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

// With AVX-VNNI: Avx512Vnni's scheme (the weights' bytes unsigned against x's signed bytes,
// started from -128 · Σ q_x) in Avx2's two 32-byte halves; finish and reduce as Avx2's. dot is
// Avx2Vnni's (VEX vpdpbusd) or Avx2VnniEvex's (its EVEX encoding, for tests and benchmarks on
// CPUs without AVX-VNNI); the two compute the same bits.
struct Avx2VnniBase : Avx2 {
  static constexpr bool kHigh16 = true;
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI init(const int32_t* corr) {
    const auto* p = reinterpret_cast<const __m256i*>(corr);
    return {{_mm256_loadu_si256(p), _mm256_loadu_si256(p + 1)}};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static W prep(const uint8_t* w) {
    const auto* p = reinterpret_cast<const __m256i*>(w);
    return {{_mm256_loadu_si256(p), _mm256_loadu_si256(p + 1)}};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static __m256i broadcast(const int8_t* x) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static void unpack_u4_high16(const uint8_t* w, W& lo,
                                                                   W& hi16) {
    const auto* p = reinterpret_cast<const __m256i*>(w);
    for (int i = 0; i < 2; ++i) {
      __m256i v = _mm256_loadu_si256(p + i);
      in_register(v);
      lo.h[i] = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
      hi16.h[i] = _mm256_and_si256(v, _mm256_set1_epi8(char(0xf0)));
    }
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI zero_i() {
    return {{_mm256_setzero_si256(), _mm256_setzero_si256()}};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI add_high16(VI acc, const VI& hi16) {
    for (int i = 0; i < 2; ++i) {
      acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_srai_epi32(hi16.h[i], 4));
    }
    return acc;
  }
};

struct Avx2Vnni : Avx2VnniBase {
  DUET_TARGET_AVXVNNI DUET_ALWAYS_INLINE static VI dot(VI acc, const W& w, const int8_t* x) {
    const __m256i xb = broadcast(x);
    for (int i = 0; i < 2; ++i) acc.h[i] = _mm256_dpbusd_avx_epi32(acc.h[i], w.h[i], xb);
    return acc;
  }
  DUET_TARGET_AVXVNNI DUET_ALWAYS_INLINE static VI dot_u(VI acc, const W& u, const int8_t* x) {
    return dot(acc, u, x);
  }
};

// The EVEX encoding written out, not _mm256_dpbusd_epi32: that intrinsic needs the block compiled
// for AVX-512 VL, and GCC then encodes other instructions as EVEX too and uses 32 registers and
// AVX-512's shuffles. Written so, the block is Avx2Vnni's code instruction for instruction, only
// vpdpbusd encoded otherwise, and its timings stand in for Avx2Vnni's.
struct Avx2VnniEvex : Avx2VnniBase {
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI dot(VI acc, const W& w, const int8_t* x) {
    const __m256i xb = broadcast(x);
    for (int i = 0; i < 2; ++i) {
      asm("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc.h[i]) : "x"(w.h[i]), "x"(xb));
    }
    return acc;
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VI dot_u(VI acc, const W& u, const int8_t* x) {
    return dot(acc, u, x);
  }
};

// A register block's operands: one block of 4 weight rows, up to kTokens tokens; or n_blocks
// consecutive whole blocks, run one after the other in one call (for few tokens, where a
// block's work is short).
struct Block {
  const uint8_t* w;      // the block's values (kQ8 or kQ4, as the block function)
  const uint16_t* ws;    // the block's f16 group scales
  const float* wd;       // the block's 4 row factors (of the 4 rows, whichever are stored)
  const int8_t* x;       // token t0's values
  const float* xs;       // token t0's scales
  const int32_t* corr;   // token t0's corrections
  float* y;              // y of (t0, first row stored)
  int64_t ld, ldy;       // of the rows of x (q8_ld(cols)); of y
  int r_first, r_count;  // the block's rows stored: [r_first, r_first + r_count)
  int64_t n_blocks;      // blocks from w on; when above 1, whole ones (r_first 0, r_count 4)
  int64_t pf_one;        // bytes ahead that one-token blocks prefetch their weights, 0: none
  int64_t pf_l2;         // bytes ahead that they also prefetch them into L2, 0: none
};

using BlockFn = void (*)(const Block&);
constexpr int kTokens = 4;  // tokens per register block

namespace avx512vnni {
using K = Avx512Vnni;
#define DUET_SIMD_TARGET DUET_TARGET_AVX512VNNI
#include "kernels/matmul_q8_block_impl.h"
#undef DUET_SIMD_TARGET
}  // namespace avx512vnni

namespace avx512 {
using K = Avx512;
#define DUET_SIMD_TARGET DUET_TARGET_AVX512
#include "kernels/matmul_q8_block_impl.h"
#undef DUET_SIMD_TARGET
}  // namespace avx512

namespace avx2vnni {
using K = Avx2Vnni;
#define DUET_SIMD_TARGET DUET_TARGET_AVXVNNI
#include "kernels/matmul_q8_block_impl.h"
#undef DUET_SIMD_TARGET
}  // namespace avx2vnni

namespace avx2vnni_evex {  // runs where AVX-512 VNNI and VL do (kernel_supported)
using K = Avx2VnniEvex;
#define DUET_SIMD_TARGET DUET_TARGET_AVX2_F16C
#include "kernels/matmul_q8_block_impl.h"
#undef DUET_SIMD_TARGET
}  // namespace avx2vnni_evex

namespace avx2 {
using K = Avx2;
#define DUET_SIMD_TARGET DUET_TARGET_AVX2_F16C
#include "kernels/matmul_q8_block_impl.h"
#undef DUET_SIMD_TARGET
}  // namespace avx2

BlockFn block_fn(Kernel k, DType dtype, int n_tokens) {
  switch (k) {
    case Kernel::kAvx512Vnni:
      return avx512vnni::block_fn(dtype, n_tokens);
    case Kernel::kAvx512:
      return avx512::block_fn(dtype, n_tokens);
    case Kernel::kAvx2Vnni:
      return avx2vnni::block_fn(dtype, n_tokens);
    case Kernel::kAvx2VnniEvex:
      return avx2vnni_evex::block_fn(dtype, n_tokens);
    case Kernel::kAvx2:
      return avx2::block_fn(dtype, n_tokens);
    case Kernel::kScalar:
      break;
  }
  return nullptr;
}

void simd_rows(Kernel k, const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
               int64_t r_begin, int64_t r_end) {
  const int64_t ld = x.ld, n_super = ld / kSuper;
  const int64_t block_bytes = kQ8BlockRows * ld / (w.dtype == DType::kQ4 ? 2 : 1);
  const auto* wq = static_cast<const uint8_t*>(w.data);
  // A product of one token streams its weights from memory (a few tokens' last block of one
  // reads them from the cache after the blocks before it: no prefetch there).
  const int64_t pf_one = n_tokens == 1 ? simd::one_token_prefetch_bytes() : 0;
  const int64_t pf_l2 = n_tokens == 1 ? simd::one_token_prefetch_l2_bytes() : 0;
  for (int64_t rb = r_begin / kQ8BlockRows, n_blocks; rb * kQ8BlockRows < r_end; rb += n_blocks) {
    const int64_t r0 = rb * kQ8BlockRows;
    const int r_first = static_cast<int>(std::max(r0, r_begin) - r0);
    const int r_count = static_cast<int>(std::min(r0 + kQ8BlockRows, r_end) - r0) - r_first;
    // Up to kTokens tokens: the whole blocks from here on in one call.
    const bool whole = r_first == 0 && r_count == kQ8BlockRows;
    n_blocks = whole && n_tokens <= kTokens ? (r_end - r0) / kQ8BlockRows : 1;
    for (int64_t t = 0; t < n_tokens;) {
      const int n_tok = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t));
      const Block b{wq + rb * block_bytes,
                    w.scales + rb * n_super * kLanes,
                    w.row_scales + r0,
                    x.q + t * ld,
                    x.scales + t * n_super * kLanes,
                    x.corr + t * n_super * kLanes,
                    y + t * ldy + (r0 + r_first - r_begin),
                    ld,
                    ldy,
                    r_first,
                    r_count,
                    n_blocks,
                    pf_one,
                    pf_l2};
      block_fn(k, w.dtype, n_tok)(b);
      t += n_tok;
    }
  }
}

void scalar_rows(const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
                 int64_t r_begin, int64_t r_end) {
  const int64_t n_groups = x.ld / kQ8Group;
  for (int64_t r = r_begin; r < r_end; ++r) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      double acc = 0;
      for (int64_t g = 0; g < n_groups; ++g) {
        int32_t sum = 0;
        for (int64_t k = g * kQ8Group; k < (g + 1) * kQ8Group; ++k)
          sum += q8_value(w, r, k) * x_value(x, t, k);
        acc +=
            double(q8_group_scale(w, r, g * kQ8Group)) * double(x_scale(x, t, g * kQ8Group)) * sum;
      }
      // The weights' scales are D · s exactly (D a power of two): D applied once.
      y[t * ldy + (r - r_begin)] = static_cast<float>(double(q8_row_scale(w, r)) * acc);
    }
  }
}

// Where element k of a row of x sits in Q8Rows::q.
int64_t x_offset(int64_t k) {
  return k / kSuper * kSuper + (k % kQ8Group) / 4 * 16 + (k % kSuper) / kQ8Group * 4 + k % 4;
}

void check_q8(const char* op, const Matrix& w) {
  DUET_CHECK(
      is_int_quantized(w.dtype) && (w.rows * w.cols == 0 || (w.data && w.scales && w.row_scales)),
      op << ": weights " << dtype_name(w.dtype) << " [" << w.rows << ", " << w.cols << "] at "
         << w.data << ", scales at " << w.scales << ", row scales at " << w.row_scales);
}

}  // namespace

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kScalar:
      return "scalar";
    case Kernel::kAvx2:
      return "avx2";
    case Kernel::kAvx512:
      return "avx512";
    case Kernel::kAvx512Vnni:
      return "avx512vnni";
    case Kernel::kAvx2Vnni:
      return "avx2vnni";
    case Kernel::kAvx2VnniEvex:
      return "avx2vnni-evex";
  }
  return "?";
}

bool kernel_supported(Kernel k) {
  switch (k) {
    case Kernel::kScalar:
      return true;
    case Kernel::kAvx2:
      return simd::isa_supported(simd::Isa::kAvx2) && __builtin_cpu_supports("f16c");
    case Kernel::kAvx512:
      return simd::isa_supported(simd::Isa::kAvx512);
    case Kernel::kAvx512Vnni:
      return simd::isa_supported(simd::Isa::kAvx512) && __builtin_cpu_supports("avx512vnni");
    case Kernel::kAvx2Vnni:  // Avx2's code but for dot
      return kernel_supported(Kernel::kAvx2) && __builtin_cpu_supports("avxvnni");
    case Kernel::kAvx2VnniEvex:
      return kernel_supported(Kernel::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

Kernel kernel_for(simd::Isa isa) {
  if (isa == simd::Isa::kAvx2 && kernel_supported(Kernel::kAvx2Vnni)) return Kernel::kAvx2Vnni;
  switch (isa) {
    case simd::Isa::kScalar:
      return Kernel::kScalar;
    case simd::Isa::kAvx2:
      return kernel_supported(Kernel::kAvx2) ? Kernel::kAvx2 : Kernel::kScalar;
    case simd::Isa::kAvx512:
    case simd::Isa::kAvx512Bf16:
    case simd::Isa::kAvx512Bf16Emulated:
      return kernel_supported(Kernel::kAvx512Vnni) ? Kernel::kAvx512Vnni : Kernel::kAvx512;
  }
  return Kernel::kScalar;
}

std::vector<Kernel> simd_kernels() {
  std::vector<Kernel> ks;
  for (Kernel k : {Kernel::kAvx512Vnni, Kernel::kAvx512, Kernel::kAvx2Vnni, Kernel::kAvx2VnniEvex,
                   Kernel::kAvx2}) {
    if (kernel_supported(k)) ks.push_back(k);
  }
  return ks;
}

int x_value(const Q8Rows& x, int64_t t, int64_t k) {
  return x.q[t * x.ld + x_offset(k)];
}

float x_scale(const Q8Rows& x, int64_t t, int64_t k) {
  return x.scales[(t * (x.ld / kSuper) + k / kSuper) * kLanes + (k % kSuper) / kQ8Group];
}

namespace {

// One group of x: its n ≤ kQ8Group values from src quantized (zero past n), q_x written to dst
// 4 bytes at a time, 16 bytes apart (x_offset's layout, dst at the group's first 4 bytes); d_x
// and Σ q_x returned. quantize_group and quantize_group_avx512 give the same bits.
void quantize_group(const float* src, int64_t n, int8_t* dst, float& d, int32_t& sum) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(src[i]));
  d = amax / 127.0f;
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  sum = 0;
  for (int64_t i = 0; i < kQ8Group; ++i) {
    const float v = i < n ? std::clamp(round_even(src[i] * inv), -127.0f, 127.0f) : 0;
    dst[i / 4 * 16 + i % 4] = static_cast<int8_t>(v);
    sum += static_cast<int32_t>(v);
  }
}

// round(v · inv) to nearest even, clamped to ±127, as int32.
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE __m512i quantize16(__m512 v, __m512 inv) {
  v = _mm512_roundscale_ps(_mm512_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtps_epi32(v);
}

DUET_TARGET_AVX512 void quantize_group_avx512(const float* src, int64_t n, int8_t* dst, float& d,
                                              int32_t& sum) {
  const auto mask = [](int64_t m) {
    return m >= 16 ? __mmask16(0xffff) : m <= 0 ? __mmask16(0) : __mmask16((1u << m) - 1);
  };
  const __m512 a = _mm512_maskz_loadu_ps(mask(n), src);
  const __m512 b = _mm512_maskz_loadu_ps(mask(n - 16), src + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  d = amax / 127.0f;
  const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  const __m512i qa = quantize16(a, inv), qb = quantize16(b, inv);
  sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  alignas(16) int32_t dw[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(dw), _mm512_cvtepi32_epi8(qa));
  _mm_store_si128(reinterpret_cast<__m128i*>(dw + 4), _mm512_cvtepi32_epi8(qb));
  for (int k = 0; k < 8; ++k) std::memcpy(dst + 16 * k, &dw[k], 4);
}

}  // namespace

const Q8Rows& quantize_x(XRows x, int64_t cols, int64_t n_tokens, Buffer& buf, Kernel k) {
  DUET_CHECK(!x.bf16 && !x.q8, "quantize_x: x must be f32 rows");
  DUET_CHECK(kernel_supported(k), "quantize_x: kernel " << kernel_name(k) << " not supported");
  const bool avx512 = k == Kernel::kAvx512 || k == Kernel::kAvx512Vnni;
  const int64_t ld = q8_ld(cols), n_super = ld / kSuper;
  buf.q.resize(static_cast<size_t>(n_tokens * ld));
  buf.scales.resize(static_cast<size_t>(n_tokens * n_super * kLanes));
  buf.corr.resize(buf.scales.size());
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* row = x.row(t, cols);
    int8_t* q = buf.q.data() + t * ld;
    float* s = buf.scales.data() + t * n_super * kLanes;
    int32_t* corr = buf.corr.data() + t * n_super * kLanes;
    for (int64_t g = 0; g < ld / kQ8Group; ++g) {
      const int64_t k0 = g * kQ8Group, n = std::clamp<int64_t>(cols - k0, 0, kQ8Group);
      float d;
      int32_t sum;
      int8_t* dst = q + x_offset(k0);
      if (avx512) {
        quantize_group_avx512(row + k0, n, dst, d, sum);
      } else {
        quantize_group(row + k0, n, dst, d, sum);
      }
      const int64_t lane0 = (g / 4) * kLanes + g % 4;  // lane 4r + j of the superblock g / 4
      for (int64_t r = 0; r < kQ8BlockRows; ++r) {
        s[lane0 + 4 * r] = d;
        corr[lane0 + 4 * r] = -128 * sum;
      }
    }
  }
  buf.rows = Q8Rows{buf.q.data(), buf.scales.data(), buf.corr.data(), ld};
  return buf.rows;
}

void rows_with(Kernel k, const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
               int64_t r_begin, int64_t r_end) {
  check_q8("q8 rows", w);
  DUET_CHECK(kernel_supported(k), "q8 kernel " << kernel_name(k) << " not supported by this CPU");
  DUET_CHECK(x.ld == q8_ld(w.cols),
             "q8 rows: x quantized for ld " << x.ld << ", weights of " << w.cols << " cols");
  if (n_tokens == 0 || r_begin == r_end) return;
  if (k == Kernel::kScalar) {
    scalar_rows(w, x, n_tokens, y, ldy, r_begin, r_end);
  } else {
    simd_rows(k, w, x, n_tokens, y, ldy, r_begin, r_end);
  }
}

void rows_from_f32(Kernel k, const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                   int64_t r_begin, int64_t r_end) {
  if (x.q8) {
    rows_with(k, w, *x.q8, n_tokens, y, ldy, r_begin, r_end);
    return;
  }
  thread_local Buffer buf;
  rows_with(k, w, quantize_x(x, w.cols, n_tokens, buf, k), n_tokens, y, ldy, r_begin, r_end);
}

void matmul_with(Kernel k, ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens,
                 float* y) {
  check_q8("matmul", w);
  if (n_tokens == 0 || w.rows == 0) return;
  thread_local Buffer buf;
  const Q8Rows& xq = quantize_x(x, w.cols, n_tokens, buf, k);
  if (w.rows * w.cols * n_tokens < kMinParallelMacs) {
    rows_with(k, w, xq, n_tokens, y, w.rows, 0, w.rows);
    return;
  }
  pool.parallel_for(
      w.rows,
      [&](int64_t begin, int64_t end) {
        rows_with(k, w, xq, n_tokens, y + begin, w.rows, begin, end);
      },
      kTaskRows);
}

}  // namespace duet::matmul_q8

#pragma GCC diagnostic pop
