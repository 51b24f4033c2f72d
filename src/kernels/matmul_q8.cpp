#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul_q8_impl.h"

#define DUET_TARGET_AVX512VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512vnni")))

// See simd_impl.h: GCC 12's AVX-512 intrinsics trip -Wuninitialized where they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace duet::matmul_q8 {

namespace {

constexpr int64_t kScaleRepeat = 8;  // Q8Rows::scales holds each group's scale 8 times

// Rows per pool task in matmul_with: few enough to spread one expert's rows over the threads.
constexpr int64_t kTaskRows = 16;
// Below this many multiply-adds a product runs on the calling thread.
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;

// ---- The vector kernels. Each K steps through a row kChunk weights (kChunk / kQ8Group groups)
// at a time: load_w reads a chunk of weights and their scales once for every token of a block,
// dot gives the chunk's integer products with a token's x as f32 lanes (8 lanes per group, each
// the exact sum of 4 products), scale the product of each lane's weight and x scales.

// The scales of groups g, g + 1 as lanes [d_g × 8, d_{g+1} × 8].
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE __m512 pair_scales(const float* s) {
  double two;
  std::memcpy(&two, s, sizeof two);
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_ps(idx, _mm512_castpd_ps(_mm512_set1_pd(two)));
}

struct Avx512Vnni {
  using VF = __m512;
  static constexpr int64_t kChunk = 64;
  struct W {
    __m512i q;
    __m512i minus_128_sum;  // per lane, -128 · the sum of its 4 weights
    VF d;
  };
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static W load_w(const int8_t* q, const float* s) {
    W w;
    w.q = _mm512_loadu_si512(q);
    const __m512i neg = _mm512_sub_epi8(_mm512_setzero_si512(), w.q);  // |q| ≤ 127: no overflow
    w.minus_128_sum =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), neg);
    w.d = pair_scales(s);
    return w;
  }
  // x comes as q_x + 128 (uint8): Σ (q_x + 128) q_w - 128 Σ q_w, exact.
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VF dot(const W& w, const int8_t* x) {
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(w.minus_128_sum, _mm512_loadu_si512(x), w.q));
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VF scale(const W& w, const float* xs) {
    return _mm512_mul_ps(w.d, _mm512_loadu_ps(xs));
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VF zero() { return _mm512_setzero_ps(); }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static VF fmadd(VF a, VF b, VF c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  DUET_TARGET_AVX512VNNI DUET_ALWAYS_INLINE static float hsum(VF v) {
    return _mm512_reduce_add_ps(v);
  }
};

struct Avx512 {
  using VF = __m512;
  static constexpr int64_t kChunk = 64;
  struct W {
    __m512i q;
    VF d;
  };
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static W load_w(const int8_t* q, const float* s) {
    return {_mm512_loadu_si512(q), pair_scales(s)};
  }
  // |x| · (w with x's signs): vpmaddubsw's pairs reach at most 2 · 127² < 2^15, never saturating.
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VF dot(const W& w, const int8_t* x) {
    const __m512i xq = _mm512_loadu_si512(x);
    const __m512i signed_w =
        _mm512_mask_sub_epi8(w.q, _mm512_movepi8_mask(xq), _mm512_setzero_si512(), w.q);
    const __m512i pairs = _mm512_maddubs_epi16(_mm512_abs_epi8(xq), signed_w);
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VF scale(const W& w, const float* xs) {
    return _mm512_mul_ps(w.d, _mm512_loadu_ps(xs));
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VF zero() { return _mm512_setzero_ps(); }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static VF fmadd(VF a, VF b, VF c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  DUET_TARGET_AVX512 DUET_ALWAYS_INLINE static float hsum(VF v) { return _mm512_reduce_add_ps(v); }
};

struct Avx2 {
  using VF = __m256;
  static constexpr int64_t kChunk = 32;
  struct W {
    __m256i q;
    VF d;
  };
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static W load_w(const int8_t* q, const float* s) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), _mm256_broadcast_ss(s)};
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VF dot(const W& w, const int8_t* x) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(xq, xq), _mm256_sign_epi8(w.q, xq));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VF scale(const W& w, const float* xs) {
    return _mm256_mul_ps(w.d, _mm256_loadu_ps(xs));
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VF zero() { return _mm256_setzero_ps(); }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static VF fmadd(VF a, VF b, VF c) {
    return _mm256_fmadd_ps(a, b, c);
  }
  DUET_TARGET_AVX2 DUET_ALWAYS_INLINE static float hsum(VF v) { return simd::Avx2::hsum(v); }
};

// A register block's operands.
struct Block {
  const int8_t* w;  // row r0's values
  const float* ws;  // row r0's scales
  const int8_t* x;  // token t0's values
  const float* xs;  // token t0's scales
  float* y;         // y of (t0, r0)
  int64_t ld, ldy;  // of the rows of w and x (q8_ld(cols)); of y
};

using BlockFn = void (*)(const Block&);
constexpr int kRows = 4;    // rows per register block
constexpr int kTokens = 4;  // tokens per register block (16 accumulators)

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

namespace avx2 {
using K = Avx2;
#define DUET_SIMD_TARGET DUET_TARGET_AVX2
#include "kernels/matmul_q8_block_impl.h"
#undef DUET_SIMD_TARGET
}  // namespace avx2

BlockFn block_fn(Kernel k, int n_rows, int n_tokens) {
  switch (k) {
    case Kernel::kAvx512Vnni:
      return avx512vnni::block_fn(n_rows, n_tokens);
    case Kernel::kAvx512:
      return avx512::block_fn(n_rows, n_tokens);
    case Kernel::kAvx2:
      return avx2::block_fn(n_rows, n_tokens);
    case Kernel::kScalar:
      break;
  }
  return nullptr;
}

void simd_rows(Kernel k, const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
               int64_t r_begin, int64_t r_end) {
  const int64_t ld = x.ld, n_groups = ld / kQ8Group, ld_xs = n_groups * kScaleRepeat;
  const auto* wq = static_cast<const int8_t*>(w.data);
  for (int64_t r = r_begin; r < r_end;) {
    const int n_rows = r_end - r >= kRows ? kRows : 1;
    for (int64_t t = 0; t < n_tokens;) {
      const int n_tok = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t));
      const Block b{wq + r * ld,
                    w.scales + r * n_groups,
                    x.q + t * ld,
                    x.scales + t * ld_xs,
                    y + t * ldy + (r - r_begin),
                    ld,
                    ldy};
      block_fn(k, n_rows, n_tok)(b);
      t += n_tok;
    }
    r += n_rows;
  }
}

void scalar_rows(const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
                 int64_t r_begin, int64_t r_end) {
  const int64_t ld = x.ld, n_groups = ld / kQ8Group;
  const int32_t x_offset = x.offset ? 128 : 0;
  const auto* wq = static_cast<const int8_t*>(w.data);
  for (int64_t r = r_begin; r < r_end; ++r) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      double acc = 0;
      for (int64_t g = 0; g < n_groups; ++g) {
        int32_t sum = 0;
        for (int64_t k = g * kQ8Group; k < (g + 1) * kQ8Group; ++k) {
          const int32_t xq =
              x.offset ? int32_t(uint8_t(x.q[t * ld + k])) - x_offset : int32_t(x.q[t * ld + k]);
          sum += int32_t(wq[r * ld + k]) * xq;
        }
        acc += double(w.scales[r * n_groups + g]) *
               double(x.scales[t * n_groups * kScaleRepeat + g * kScaleRepeat]) * sum;
      }
      y[t * ldy + (r - r_begin)] = static_cast<float>(acc);
    }
  }
}

void check_q8(const char* op, const Matrix& w) {
  DUET_CHECK(w.dtype == DType::kQ8 && (w.rows * w.cols == 0 || (w.data && w.scales)),
             op << ": weights " << dtype_name(w.dtype) << " [" << w.rows << ", " << w.cols
                << "] at " << w.data << ", scales at " << w.scales);
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
  }
  return "?";
}

bool kernel_supported(Kernel k) {
  switch (k) {
    case Kernel::kScalar:
      return true;
    case Kernel::kAvx2:
      return simd::isa_supported(simd::Isa::kAvx2);
    case Kernel::kAvx512:
      return simd::isa_supported(simd::Isa::kAvx512);
    case Kernel::kAvx512Vnni:
      return simd::isa_supported(simd::Isa::kAvx512) && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

Kernel kernel_for(simd::Isa isa) {
  switch (isa) {
    case simd::Isa::kScalar:
      return Kernel::kScalar;
    case simd::Isa::kAvx2:
      return Kernel::kAvx2;
    case simd::Isa::kAvx512:
    case simd::Isa::kAvx512Bf16:
    case simd::Isa::kAvx512Bf16Emulated:
      return kernel_supported(Kernel::kAvx512Vnni) ? Kernel::kAvx512Vnni : Kernel::kAvx512;
  }
  return Kernel::kScalar;
}

std::vector<Kernel> simd_kernels() {
  std::vector<Kernel> ks;
  for (Kernel k : {Kernel::kAvx512Vnni, Kernel::kAvx512, Kernel::kAvx2}) {
    if (kernel_supported(k)) ks.push_back(k);
  }
  return ks;
}

const Q8Rows& quantize_x(Kernel k, XRows x, int64_t cols, int64_t n_tokens, Buffer& buf) {
  DUET_CHECK(!x.bf16 && !x.q8, "quantize_x: x must be f32 rows");
  const int64_t ld = q8_ld(cols), n_groups = ld / kQ8Group;
  buf.q.resize(static_cast<size_t>(n_tokens * ld + 64));
  buf.scales.resize(static_cast<size_t>(n_tokens * n_groups * kScaleRepeat));
  const bool offset = k == Kernel::kAvx512Vnni;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* row = x.row(t, cols);
    int8_t* q = buf.q.data() + t * ld;
    float* s = buf.scales.data() + t * n_groups * kScaleRepeat;
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t k0 = g * kQ8Group, n = std::clamp<int64_t>(cols - k0, 0, kQ8Group);
      float amax = 0.0f;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(row[k0 + i]));
      const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
      std::fill_n(s + g * kScaleRepeat, kScaleRepeat, d);
      for (int64_t i = 0; i < kQ8Group; ++i) {
        const float v = i < n ? std::clamp(std::nearbyint(row[k0 + i] * inv), -127.0f, 127.0f) : 0;
        const int32_t qi = static_cast<int32_t>(v) + (offset ? 128 : 0);
        q[k0 + i] = static_cast<int8_t>(static_cast<uint8_t>(qi));
      }
    }
  }
  buf.rows = Q8Rows{buf.q.data(), buf.scales.data(), ld, offset};
  return buf.rows;
}

void rows_with(Kernel k, const Matrix& w, const Q8Rows& x, int64_t n_tokens, float* y, int64_t ldy,
               int64_t r_begin, int64_t r_end) {
  check_q8("q8 rows", w);
  DUET_CHECK(kernel_supported(k), "q8 kernel " << kernel_name(k) << " not supported by this CPU");
  // The scalar kernel reads x either way.
  DUET_CHECK(
      x.ld == q8_ld(w.cols) && (k == Kernel::kScalar || x.offset == (k == Kernel::kAvx512Vnni)),
      "q8 rows: x quantized for ld " << x.ld << (x.offset ? " offset" : "") << ", weights "
                                     << w.cols << " cols on " << kernel_name(k));
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
  rows_with(k, w, quantize_x(k, x, w.cols, n_tokens, buf), n_tokens, y, ldy, r_begin, r_end);
}

void matmul_with(Kernel k, ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens,
                 float* y) {
  check_q8("matmul", w);
  if (n_tokens == 0 || w.rows == 0) return;
  thread_local Buffer buf;
  const Q8Rows& xq = quantize_x(k, x, w.cols, n_tokens, buf);
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
