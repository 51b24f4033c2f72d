// MLA's per-head products around its absorbed attention (DeepSeek-V2/V3): each query head's
// nope part times its W_UK, and each head's attended latent times its W_UV, both slices of
// kv_b_proj. A head's product is small (64 × 256 weights on the `small` preset, 128 × 512 on
// DeepSeek-V3), so the heads go to the pool in jobs of many heads rather than one job a head.
// Between them, the absorbed attention itself over the latent rows (mla_attend).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/attend.h"

namespace duet {

struct MlaHeads {
  int64_t n_head = 0;
  int64_t qk_dim = 0;  // floats of a head's query row: nope, then rope
  int64_t nope = 0;    // qk_nope_head_dim
  int64_t v_dim = 0;   // v_head_dim
  int64_t rank = 0;    // kv_lora_rank (L)
  // kv_b: [n_head * (nope + v_dim), rank]; head h's W_UK is rows [h * (nope + v_dim), + nope),
  // its W_UV the v_dim rows after them.
};

// kv_b_proj as absorbed attention multiplies it: split by head (`k_b` and `v_b`; both products by
// matmul, whose rows the quantized and fp8 kernels read in groups or blocks along the columns),
// as the loader holds every kv_b (in its dtype, quantized, or fp8), or as stored (`kv_b`; the
// queries' products by matmul_xw, which multiplies it untransposed), as it holds an fp8 kv_b
// whose blocks do not allow the split. k_b [n_head · rank, nope], rows [h · rank, + rank) head h's
// W_UK transposed (row l: column l of W_UK[h]); v_b [n_head · v_dim, rank], rows
// [h · v_dim, + v_dim) head h's W_UV.
struct MlaKvB {
  Matrix kv_b = {};
  Matrix k_b = {};
  Matrix v_b = {};
  bool split() const { return k_b.data != nullptr; }
};

// kv_b (kF32, kBF16 or kF8E4M3 with its block scales, [n_head · (nope + v_dim), rank]; each
// weight's value) split as MlaKvB's k_b and v_b, in f32:
// k_b [n_head · rank · nope], v_b [n_head · v_dim · rank].
void mla_split_kv_b(const Matrix& kv_b, const MlaHeads& m, std::vector<float>& k_b,
                    std::vector<float>& v_b);

// kv_b's elements as stored (bf16, f32 or fp8 codes; no f16 or int layouts) moved to MlaKvB's
// layout in the same dtype: k_b [n_head · rank, nope] and v_b [n_head · v_dim, rank] elements,
// each dtype_size(kv_b.dtype) bytes. Bit for bit; an fp8 kv_b's scales are not touched.
void mla_split_kv_b_elements(const Matrix& kv_b, const MlaHeads& m, void* k_b, void* v_b);

// One part of an fp8 kv_b split by head (mla_split_kv_b_fp8): E4M3 codes [rows, cols] and an f32
// scale per [block_rows, block_cols] block, as Matrix::f8 reads them.
struct Fp8Part {
  std::vector<uint8_t> codes;  // [rows, cols] E4M3
  std::vector<float> scales;   // [rows / block_rows, ceil(cols / block_cols)] f32
  int64_t rows = 0, cols = 0, block_rows = 0, block_cols = 0;
  // A matrix over codes and scales (valid while they are).
  Matrix view() const;
};

// kv_b in fp8 (an fp8 checkpoint's, DType::kF8E4M3 with block scales [B_r, B_c]) split as
// MlaKvB's k_b and v_b, still fp8: the codes moved, the scales of their blocks copied. With g =
// gcd(B_r, nope, v_dim), k_b's blocks are [gcd(B_c, rank), g] and v_b's [g, B_c]: each block of a
// part lies inside one block of kv_b, so every weight keeps its value exactly. Returns false
// (and leaves k_b and v_b alone) where g is not a multiple of 16, the fp8 kernels' least block
// width, or kv_b is not fp8.
bool mla_split_kv_b_fp8(const Matrix& kv_b, const MlaHeads& m, Fp8Part& k_b, Fp8Part& v_b);

// Heads per pool job for n_tokens: every head at a few tokens (a pool synchronisation per head
// cost more than a small head's product), in prefill as many as keep the job's copies of the
// heads' rows within 4 MiB.
int64_t mla_heads_per_job(const MlaHeads& m, int64_t n_tokens);

// q_lat[h, t, :] = q[t, h, :nope] · W_UK[h] for every head h and token t < n_tokens, in jobs of
// job_heads heads. q: [n_tokens, n_head, qk_dim] f32; q_lat: [n_head, n_tokens, rank] f32; buf:
// scratch, reused.
void mla_absorb_queries(ThreadPool& pool, const MlaKvB& w, const MlaHeads& m, const float* q,
                        int64_t n_tokens, int64_t job_heads, float* q_lat, std::vector<float>& buf);

// out[t, h, :] = W_UV[h] · o_lat[h, t, :] likewise. o_lat: [n_head, n_tokens, rank] f32; out:
// [n_tokens, n_head, v_dim] f32.
void mla_head_outputs(ThreadPool& pool, const MlaKvB& w, const MlaHeads& m, const float* o_lat,
                      int64_t n_tokens, int64_t job_heads, float* out, std::vector<float>& buf);

// Positions of a part of mla_attend's attention for a token that sees more.
constexpr int64_t kMlaChunkPositions = 512;

// Absorbed attention of every head at every token t < n_tokens: o_lat[h, t, :] = Σ_j p_j ·
// c_kv_j with p = softmax_j(scale · [q_lat[h, t, :] | q[t, h, nope:]] · row_j) over the latent
// rows spans_of(t) gives (n_ctx[t] positions; keys the whole rows [c_kv | k_pe], values their
// first `rank` elements). q: [n_tokens, n_head, qk_dim]; q_lat, o_lat: [n_head, n_tokens, rank].
// A task takes a token and 4 heads, so each latent row is read once for them. A token that sees
// more than chunk_positions positions is cut into parts of chunk_positions positions, attended by
// tasks of up to 16 heads and merged by their log-sum-exp: a long context is read once for 16
// heads, and one sequence's decode still gives both threads work. The parts depend on the
// token's positions only, so the bits do not depend on the batch or the threads. `partials` is
// scratch, reused.
void mla_attend(ThreadPool& pool, const MlaHeads& m, const float* q_lat, const float* q,
                int64_t n_tokens, const std::vector<int64_t>& n_ctx, float scale,
                const std::function<void(int64_t t, std::vector<KvSpan>& spans)>& spans_of,
                float* o_lat, std::vector<float>& partials,
                int64_t chunk_positions = kMlaChunkPositions);

}  // namespace duet
