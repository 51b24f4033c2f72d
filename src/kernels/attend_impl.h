// Private to src/kernels: what the attention kernels share (attend.cpp's f32 kernels and
// attend_pairs.cpp's bf16-pair ones): the shape's rows, the prefetch distance, and the score
// rows' reduction.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/attend.h"
#include "kernels/simd_impl.h"

namespace duet::attend_impl {

constexpr int kMaxRows = 4;   // query rows per pass over the keys (accumulators per position)
constexpr int kPosBlock = 4;  // positions per pass over a query: kMaxRows × 4 accumulators
constexpr int64_t kValueBlock = 64;  // positions whose value rows serve every row before the next
constexpr int64_t kAhead = 16;       // positions prefetched ahead, into L2

inline int64_t n_positions(const std::vector<KvSpan>& spans) {
  int64_t n = 0;
  for (const KvSpan& s : spans) n += s.n;
  return n;
}

inline void check_shape(const AttendShape& a, int64_t n_ctx) {
  DUET_CHECK(a.n_q >= 1 && a.k_dim >= 1 && a.v_dim >= 1 && a.ldq >= a.k_dim && a.ldo >= a.v_dim &&
                 a.n_t >= 1 && n_ctx >= a.n_t,
             "attend: n_q " << a.n_q << " k_dim " << a.k_dim << " v_dim " << a.v_dim << " ldq "
                            << a.ldq << " ldo " << a.ldo << " n_t " << a.n_t << " positions "
                            << n_ctx);
}

// Positions that query row r (= position i · n_q + head) sees.
inline int64_t visible(const AttendShape& a, int64_t n_ctx, int64_t r) {
  return n_ctx - a.n_t + 1 + r / a.n_q;
}

inline const float* q_row(const AttendShape& a, const float* q, int64_t r) {
  return q + r / a.n_q * a.ldq_t + r % a.n_q * a.ldq;
}

inline float* out_row(const AttendShape& a, float* out, int64_t r) {
  return out + r / a.n_q * a.ldo_t + r % a.n_q * a.ldo;
}

template <typename T>
const T* k_row(const KvSpan& sp, int64_t i) {
  return static_cast<const T*>(sp.k) + i * sp.k_stride;
}

template <typename T>
const T* v_row(const KvSpan& sp, int64_t i) {
  return static_cast<const T*>(sp.v) + i * sp.v_stride;
}

// Prefetches the cache lines of row[0, n) into L2.
template <typename T>
DUET_TARGET_AVX512 inline void prefetch_row(const T* row, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(T)); b += 64)
    _mm_prefetch(bytes + b, _MM_HINT_T1);
}

// Elements of each value row to prefetch beside its key in the scores' pass (0: none): all of
// them where the value rows are apart from the keys (not MLA's shared latents) and total at most
// kValuesAheadBytes, so that the values' pass finds them in L2; at longer contexts they would
// leave it before their pass, which prefetches its own rows kAhead positions ahead. One decode
// head of qwen3_moe `small` at 160 positions, bf16 rows, cold, 4 heads on one thread (Zen 4):
// 28.9-29.3 us instead of 30.0-31.1 (the f32 kernel: 31.7-32.6 instead of 34.4-34.9).
constexpr int64_t kValuesAheadBytes = int64_t{128} << 10;

inline int64_t values_ahead(const std::vector<KvSpan>& spans, int64_t n_ctx, int64_t v_dim) {
  if (spans.empty() || spans[0].v == spans[0].k) return 0;
  const int64_t bytes = n_ctx * v_dim * static_cast<int64_t>(dtype_size(spans[0].dtype));
  return bytes <= kValuesAheadBytes ? v_dim : 0;
}

// s[g][j + jj] = scale · (the sum of acc[jj][g]'s lanes) for J positions and G rows. One
// reduction tree for every G (each lane's sum is independent of the others): a row's scores do
// not depend on which rows it was grouped with.
template <int G, int J>
DUET_TARGET_AVX512 DUET_ALWAYS_INLINE void store_scores(__m512 (&acc)[J][G], float* const* s,
                                                        int64_t j, float scale) {
  using S = simd::Avx512;
  const __m512 z = S::zero();
  __m128 sums[J];  // [jj] the rows' scores of position j + jj: lane g is row g's
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
    sums[jj] =
        _mm_mul_ps(S::hsum4(acc[jj][0], G > 1 ? acc[jj][G > 1 ? 1 : 0] : z,
                            G > 2 ? acc[jj][G > 2 ? 2 : 0] : z, G > 3 ? acc[jj][G > 3 ? 3 : 0] : z),
                   _mm_set1_ps(scale));
  }
  if constexpr (J == 4) {  // transposed, each row's four scores are one store
    _MM_TRANSPOSE4_PS(sums[0], sums[1], sums[2], sums[3]);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) _mm_storeu_ps(s[g] + j, sums[g]);
  } else {
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      alignas(16) float v[4];
      _mm_store_ps(v, sums[jj]);
      for (int g = 0; g < G; ++g) s[g][j + jj] = v[g];
    }
  }
}

// attend over bf16 rows on an instruction set that multiplies bf16 pairs (simd::has_dpbf16):
// q and the probabilities rounded to bf16, products of pairs summed in f32 (attend_pairs.cpp).
void attend_pairs(simd::Isa isa, const AttendShape& shape, const float* q,
                  const std::vector<KvSpan>& spans, float* out, std::vector<float>& scores,
                  float* lse);

}  // namespace duet::attend_impl
