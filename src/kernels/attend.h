// Attention of a few query heads over one sequence's cached keys and values, reading the KV
// rows in place from the spans a KV store hands out (no copy, no call per position).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace duet {

namespace simd {
enum class Isa;  // kernels/simd_impl.h
}

// n consecutive positions whose rows sit at fixed strides (in elements), as a KV store holds
// them, in f32 or bf16 (widened to f32 as they are loaded; no copy of the rows is made).
struct KvSpan {
  const void* k = nullptr;  // key of the span's position i at k + i * k_stride elements
  const void* v = nullptr;  // value of position i at v + i * v_stride (may equal k, as in MLA)
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  int64_t n = 0;
  DType dtype = DType::kF32;  // of the k and v rows: kF32 or kBF16
};

struct AttendShape {
  int64_t n_q = 0;     // query heads sharing the keys and values (a GQA group; MLA: any heads)
  int64_t k_dim = 0;   // elements of each query and key used
  int64_t v_dim = 0;   // elements of each value used
  int64_t ldq = 0;     // floats between the query heads' rows (>= k_dim)
  int64_t ldo = 0;     // floats between the output heads' rows (>= v_dim)
  float scale = 1.0f;  // applied to q · k before the softmax
  // Causal prefill: n_t query positions, the spans' last n_t positions in order; position i of
  // them (0-based) sees only the first n_ctx - n_t + 1 + i positions. Its n_q heads' rows start
  // at q + i * ldq_t and out + i * ldo_t. They share every K/V row read (fewer passes over them).
  int64_t n_t = 1;
  int64_t ldq_t = 0;  // floats between consecutive positions' query heads (unused when n_t == 1)
  int64_t ldo_t = 0;  // floats between consecutive positions' outputs (unused when n_t == 1)
};

// out[i * ldo_t + h * ldo + :v_dim] = Σ_j p[i, h, j] · v_j with p[i, h, :] =
// softmax_j(scale · q[i * ldq_t + h * ldq + :k_dim] · k_j) over the positions j < n_ctx - n_t + 1
// + i of all spans in order, for i < n_t, h < n_q. At least n_t positions; q, out f32; the K/V
// rows f32 or bf16 (each span says which); out must not overlap q or the KV rows. `scores` is
// scratch ([n_t * n_q, n_ctx] f32), reused across calls to avoid allocating. A position's output
// is the same, bit for bit, whether computed alone or in a block of n_t.
//
// On the instruction set products with bf16 weights use (simd::bf16_isa). Where it multiplies bf16
// pairs (AVX-512 BF16) and every span's rows are bf16, with FlashAttention's numerics: q and the
// probabilities rounded to bf16 (to nearest even), exact products summed in f32 (half the
// multiply instructions of f32 products, and the rows never widened). Otherwise f32 products of
// the rows' exact values (AVX-512 when the CPU has it, else the scalar version): bf16 rows then
// give the same result, bit for bit, as f32 rows holding their widened values.
//
// With lse: lse[r] = log Σ_j exp(scale · q_r · k_j) over the positions row r sees (r = i · n_q +
// h), so that outputs over disjoint parts of a row's positions combine into the whole's:
// out = Σ_c exp(lse_c - lse) · out_c with lse = log Σ_c exp(lse_c) (up to the roundings of each
// part's probabilities; mla_heads.h does this).
void attend(const AttendShape& shape, const float* q, const std::vector<KvSpan>& spans, float* out,
            std::vector<float>& scores, float* lse = nullptr);

// attend on a given instruction set (kernels/simd_impl.h): its bf16-pair kernel on bf16 rows
// where isa multiplies bf16 pairs (simd::Isa::kAvx512Bf16Emulated runs it on any AVX-512 CPU);
// otherwise the f32 one (AVX-512 where the CPU has it, unless isa is kScalar). For tests and
// benchmarks that compare them.
void attend_with(simd::Isa isa, const AttendShape& shape, const float* q,
                 const std::vector<KvSpan>& spans, float* out, std::vector<float>& scores,
                 float* lse = nullptr);

// The plain version (sums in double): the reference for tests and the fallback. bf16 rows give
// the same result, bit for bit, as f32 rows holding their widened values (for attend too).
void attend_scalar(const AttendShape& shape, const float* q, const std::vector<KvSpan>& spans,
                   float* out, std::vector<float>& scores, float* lse = nullptr);

}  // namespace duet
