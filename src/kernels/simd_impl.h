// Private to src/kernels: the instruction sets the kernels are built for, run-time detection,
// and a thin vector interface per instruction set so one kernel body serves both.
//
// The build uses plain -O2, so every function that uses AVX2 or AVX-512 carries a target
// attribute (DUET_TARGET_AVX512BF16 / DUET_TARGET_AVX512 / DUET_TARGET_AVX2) and is only called
// after isa_supported() said yes.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace duet::simd {

enum class Isa {
  kScalar,
  kAvx2,
  kAvx512,
  // kAvx512 and vdpbf16ps: products with bf16 weights multiply x rounded to bf16, in pairs.
  kAvx512Bf16,
  // For tests: kAvx512Bf16's kernels with vdpbf16ps emulated on AVX-512F, so they run (bit for
  // bit as the instruction, short of denormals) on CPUs without it. best_isa() picks it only
  // when DUET_MATMUL_ISA=avx512bf16-emulated asks for it (the suite runs its numerics tests so
  // on every AVX-512 CPU).
  kAvx512Bf16Emulated,
};

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16:
      return "avx512bf16";
    case Isa::kAvx512Bf16Emulated:
      return "avx512bf16-emulated";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      return "scalar";
  }
  return "?";
}

inline bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16:
      return isa_supported(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
    case Isa::kAvx512Bf16Emulated:
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kScalar:
      return true;
  }
  return false;
}

// Whether isa multiplies bf16 pairs (vdpbf16ps or its emulation).
inline bool has_dpbf16(Isa isa) {
  return isa == Isa::kAvx512Bf16 || isa == Isa::kAvx512Bf16Emulated;
}

// The instruction set the kernels use: `requested` if that names one (as isa_name spells it) the
// CPU runs, else (null or empty) the widest it runs, never the emulation. Throws duet::Error on
// any other name.
Isa choose_isa(const char* requested);

// How far ahead, in bytes, the kernels of one-token products (decode of one sequence; a routed
// expert's single row) prefetch the weights they stream through (0: no prefetch, the hardware's
// own alone). `requested` is the text of DUET_ONE_TOKEN_PREFETCH (a count of bytes, 0 to 65536),
// or null or empty for this CPU's default: kOneTokenPrefetchIntel on Intel's CPUs, none on the
// others. Throws duet::Error on any other text.
// Why by vendor: a one-token kernel's rows are chains of dependent multiply-adds, and Intel's
// cores stream such a loop from memory well below a plain read's pace unless told to fetch ahead
// (Emerald Rapids, bf16, cold, 2 threads: 0.58-0.74 of a read without, 0.84-1.08 with, 4 KiB
// ahead; decode of one sequence 1.33x as fast). On Zen 4 the same loops read 0.95-1.0 of a read
// by themselves, and prefetching there cost int8 decode 5-6 %.
constexpr int64_t kOneTokenPrefetchIntel = 4096;
int64_t choose_one_token_prefetch(const char* requested, bool intel);

// choose_one_token_prefetch(getenv("DUET_ONE_TOKEN_PREFETCH"), this CPU is Intel's), decided once.
int64_t one_token_prefetch_bytes();

// How far ahead, in bytes, the same kernels also prefetch their weights into L2 (a second stream
// of prefetches, further on than the first's into L1; 0: none). `requested` is the text of
// DUET_ONE_TOKEN_PREFETCH_L2 (0 to 65536), or null or empty for this CPU's default:
// kOneTokenPrefetchL2Intel on Intel's CPUs, none on the others. Throws duet::Error on any other
// text.
// Why: the prefetches into L1 alone keep too few of a core's reads in flight to stream at a plain
// read's pace (each holds one of the core's few L1 fill buffers until its line arrives); those
// into L2 queue further out (Emerald Rapids VM, 2 threads, cold steps, decode of one sequence
// alternating step by step with and without, qwen3_moe small: int4 0.87-1.00 of the time, median
// 0.94; int8 0.80-1.03, median 0.88; bf16 0.89-1.05, median 0.94; README, "One sequence on
// Intel: a second prefetch").
constexpr int64_t kOneTokenPrefetchL2Intel = 16384;
int64_t choose_one_token_prefetch_l2(const char* requested, bool intel);

// choose_one_token_prefetch_l2(getenv("DUET_ONE_TOKEN_PREFETCH_L2"), this CPU is Intel's),
// decided once.
int64_t one_token_prefetch_l2_bytes();

// choose_isa(getenv("DUET_MATMUL_ISA")), decided once: the widest instruction set this CPU
// runs, unless the variable names another to compare with.
Isa best_isa();

// The instruction set of products with bf16 weights and of attention, given `best` (best_isa's
// choice), whether DUET_MATMUL_ISA `requested` it, and whether the CPU is Intel's: `best`, except
// kAvx512 in place of a kAvx512Bf16 chosen by default on Intel's CPUs. Products with fp8 weights
// keep `best` (the pair kernels, and the byte look-ups at few tokens).
// Why by vendor: there vdpbf16ps issues once every 2-2.6 cycles where vfmadd231ps issues twice a
// cycle (Emerald Rapids, 20 independent chains: 0.73-0.96 ns against 0.19 ns an instruction), so
// pairs of bf16 make 12-16 multiply-adds a cycle and f32 FMAs on widened weights 32: prefill of
// bf16 weights ran a median 1.22x as fast on the f32 kernels (13 alternating pairs, 0.96-1.82),
// 32-sequence decode up to 1.2x, one and 8 sequences level (qwen3_moe small). fp8's look-ups at
// one sequence, bound by memory, read 1.3-1.5x faster than its f32 path there, so fp8 keeps them.
// On Zen 4 the pair kernels measured the faster when they were written; its vdpbf16ps was not
// timed this way.
Isa choose_bf16_isa(Isa best, bool requested, bool intel);

// choose_bf16_isa(best_isa(), DUET_MATMUL_ISA set, this CPU is Intel's), decided once.
Isa bf16_isa();

}  // namespace duet::simd

#define DUET_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16")))
#define DUET_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define DUET_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define DUET_ALWAYS_INLINE inline __attribute__((always_inline))

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() (`__m512 __Y = __Y;`), which
// -Wuninitialized reports wherever they are inlined under a target attribute. The warning is
// silenced where the intrinsics are inlined, i.e. in these vector interfaces.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace duet::simd {

// 16 f32 lanes. bf16 is widened by shifting into the high half (no avx512_bf16 needed).
struct Avx512 {
  using V = __m512;
  static constexpr int kWidth = 16;

  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static __mmask16 first(int n) {
    return static_cast<__mmask16>((1u << n) - 1u);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V zero() { return _mm512_setzero_ps(); }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V set1(float v) { return _mm512_set1_ps(v); }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V load(const float* p) { return _mm512_loadu_ps(p); }
  // bf16 → f32: zero-extend to 32 bits, shift into the high half. (A masked vpermw does it in
  // one instruction, but LLVM's Ice Lake model counts two port-5 uops, and it was no faster.)
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V load(const uint16_t* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 2 · kWidth bf16 as kWidth lanes of pairs (element 2i in the low half of lane i), unwidened;
  // even() / odd() widen the elements 2i / 2i + 1 of each lane.
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V load_pairs(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(p));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V even(V pairs) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(pairs), 16));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V odd(V pairs) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(pairs), _mm512_set1_epi32(int(0xFFFF0000u))));
  }
  // The first n < kWidth elements; the other lanes are 0 and nothing past p + n is read.
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V load_part(const float* p, int n) {
    return _mm512_maskz_loadu_ps(first(n), p);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V load_part(const uint16_t* p, int n) {
    return widen(_mm256_maskz_loadu_epi16(first(n), p));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static void store_part(float* p, V v, int n) {
    _mm512_mask_storeu_ps(p, first(n), v);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V fmadd(V a, V b, V c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V add(V a, V b) { return _mm512_add_ps(a, b); }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static float hsum(V v) { return _mm512_reduce_add_ps(v); }
  // {Σa, Σb, Σc, Σd} with one shared reduction tree.
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static __m128 hsum4(V a, V b, V c, V d) {
    V ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    V cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    // Each 128-bit lane now holds partial {a, b, c, d}.
    V s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  }
  // r[i][j] ↔ r[j][i]: a 16 × 16 block transposed in registers (4 rounds of 16 shuffles).
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static void transpose(V (&r)[kWidth]) {
    V a[16], b[16], e[16];
    #pragma GCC unroll 16
    for (int i = 0; i < 8; ++i) {  // a[2i], a[2i+1]: rows 2i, 2i+1 interleaved per 128-bit lane
      a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    #pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {  // lane L of b[4i + c]: rows 4i..4i+3 of column 4L + c
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const __m512d lo = _mm512_castps_pd(a[4 * i + h]), hi = _mm512_castps_pd(a[4 * i + h + 2]);
        b[4 * i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi));
        b[4 * i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi));
      }
    }
    #pragma GCC unroll 16
    for (int c = 0; c < 4; ++c) {  // lanes {0, 2} and {1, 3} of b[c], b[4+c]; b[8+c], b[12+c]
      e[4 * c] = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88);
      e[4 * c + 1] = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xdd);
      e[4 * c + 2] = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
      e[4 * c + 3] = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xdd);
    }
    #pragma GCC unroll 16
    for (int c = 0; c < 4; ++c) {  // column 4L + c: lane L of b[c], b[4+c], b[8+c], b[12+c]
      r[c] = _mm512_shuffle_f32x4(e[4 * c], e[4 * c + 2], 0x88);
      r[4 + c] = _mm512_shuffle_f32x4(e[4 * c + 1], e[4 * c + 3], 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(e[4 * c], e[4 * c + 2], 0xdd);
      r[12 + c] = _mm512_shuffle_f32x4(e[4 * c + 1], e[4 * c + 3], 0xdd);
    }
  }
};

// 8 f32 lanes. Partial bf16 loads go through a zero-padded copy (AVX2 has no 16-bit masks).
struct Avx2 {
  using V = __m256;
  static constexpr int kWidth = 8;

  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static __m256i first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V zero() { return _mm256_setzero_ps(); }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V set1(float v) { return _mm256_set1_ps(v); }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V load(const float* p) { return _mm256_loadu_ps(p); }
  // bf16 → f32: the 8 values broadcast to both 128-bit lanes (a plain load), then one byte
  // shuffle puts values 0-3 (low lane) and 4-7 (high lane) into the high halves of zeroed lanes.
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V load(const uint16_t* p) {
    const __m256i ctrl =
        _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1,
                         -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(h, ctrl));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V load_pairs(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V even(V pairs) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(pairs), 16));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V odd(V pairs) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_castps_si256(pairs), _mm256_set1_epi32(int(0xFFFF0000u))));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V load_part(const float* p, int n) {
    return _mm256_maskload_ps(p, first(n));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V load_part(const uint16_t* p, int n) {
    uint16_t tmp[kWidth] = {};
    std::memcpy(tmp, p, static_cast<size_t>(n) * sizeof(uint16_t));
    return load(tmp);
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static void store_part(float* p, V v, int n) {
    _mm256_maskstore_ps(p, first(n), v);
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V fmadd(V a, V b, V c) {
    return _mm256_fmadd_ps(a, b, c);
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static V add(V a, V b) { return _mm256_add_ps(a, b); }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static __m128 hsum4(V a, V b, V c, V d) {
    V h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  }
  // r[i][j] ↔ r[j][i]: an 8 × 8 block transposed in registers.
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static void transpose(V (&r)[kWidth]) {
    V a[8], b[8];
    #pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    #pragma GCC unroll 16
    for (int i = 0; i < 2; ++i) {  // lane L of b[4i + c]: rows 4i..4i+3 of column 4L + c
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const __m256d lo = _mm256_castps_pd(a[4 * i + h]), hi = _mm256_castps_pd(a[4 * i + h + 2]);
        b[4 * i + 2 * h] = _mm256_castpd_ps(_mm256_unpacklo_pd(lo, hi));
        b[4 * i + 2 * h + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(lo, hi));
      }
    }
    #pragma GCC unroll 16
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
    }
  }
};

// Avx512 for kernels that multiply bf16 pairs: lane i of a vector of pairs holds bf16 elements
// 2i (low half) and 2i + 1 (high half). Avx512Bf16 and Avx512Bf16Emulated add dpbf16.
struct Avx512Pairs : Avx512 {
  static constexpr int kPairWidth = 2 * kWidth;  // bf16 elements per vector

  // The first n < kPairWidth bf16 as pairs; the other elements are 0 and nothing past p + n is
  // read.
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V load_pairs_part(const uint16_t* p, int n) {
    const auto mask = static_cast<__mmask32>((uint64_t{1} << n) - 1u);
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, p));
  }
  // The pair p[0], p[1] in every lane.
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V set1_pair(const uint16_t* p) {
    int32_t pair;
    std::memcpy(&pair, p, sizeof pair);
    return _mm512_castsi512_ps(_mm512_set1_epi32(pair));
  }
};

// acc + a · b over bf16 pairs: lane i gains a[2i + 1] · b[2i + 1] + a[2i] · b[2i] (vdpbf16ps).
struct Avx512Bf16 : Avx512Pairs {
  DUET_TARGET_AVX512BF16 DUET_ALWAYS_INLINE static V dpbf16(V acc, V a, V b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  }
};

// The same on AVX-512F, for tests on CPUs without vdpbf16ps. Intel documents the instruction as
// two fused multiply-adds per lane rounded to nearest even, the odd elements' product first:
// acc += a[2i + 1] · b[2i + 1], then acc += a[2i] · b[2i]. bf16 widens to f32 exactly, so two
// FMAs in that order give its result bit for bit, with one exception: the instruction treats
// denormal inputs as zero and flushes denormal results (and ignores MXCSR), where these FMAs keep
// them (MXCSR's default). Data without denormals gives the same bits.
struct Avx512Bf16Emulated : Avx512Pairs {
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static V dpbf16(V acc, V a, V b) {
    acc = _mm512_fmadd_ps(odd(a), odd(b), acc);
    return _mm512_fmadd_ps(even(a), even(b), acc);
  }
};

}  // namespace duet::simd

#pragma GCC diagnostic pop
