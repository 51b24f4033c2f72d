// Many independent matrix products run as one job on the pool: the routed experts of a MoE layer
// (a few rows each in a decode batch) would otherwise pay one pool synchronisation per product
// and leave threads idle at the end of each small one.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace duet {

// y[n_tokens, w.rows] = x[n_tokens, w.cols] · wᵀ; x contiguous or gathered, y contiguous f32, not
// aliasing x.
struct MatmulGroup {
  Matrix w;
  XRows x = nullptr;
  int64_t n_tokens = 0;  // may be 0: the group is skipped
  float* y = nullptr;
};

// y[n_tokens, n_ff] = silu(x · gateᵀ) ⊙ (x · upᵀ), the first half of a SiLU-gated MLP;
// gate, up: [n_ff, n_in]; x: [n_tokens, n_in], contiguous or gathered; y contiguous f32, not
// aliasing x.
struct GatedGroup {
  Matrix gate;
  Matrix up;
  XRows x = nullptr;
  int64_t n_tokens = 0;  // may be 0: the group is skipped
  float* y = nullptr;
};

// Every group's product, split into (group, block of weight rows) tasks that one parallel_for
// shares out, so each weight row is still read once per call. Same numerics as matmul().
void matmul_grouped(ThreadPool& pool, const std::vector<MatmulGroup>& groups);

// Every group's gated product, likewise; a task computes a block of gate and up rows and
// applies silu_mul to it while it is in cache.
void gated_matmul_grouped(ThreadPool& pool, const std::vector<GatedGroup>& groups);

// x[n_tokens, w.cols] · wᵀ, each result row scaled by its weight and added into its output row:
// the down projection of a MoE layer's experts with the weighted sum over a token's experts fused
// in, so the experts' outputs are never written unreduced. x is contiguous f32.
struct ScatterGroup {
  Matrix w;
  const float* x = nullptr;
  int64_t n_tokens = 0;             // may be 0: the group is skipped
  float* const* out = nullptr;      // [n_tokens] the output row of each row (w.rows f32)
  const float* weight = nullptr;    // [n_tokens]
};

// out row o += Σ weight[i] · (x[i] · wᵀ) over every row i of every group naming o (in group
// order, then row order), after the rows listed in `clear` (w.rows f32 each) are zeroed. Every
// group's w has the same rows; no output row may overlap another or any x. Every weight row is
// read once: with more than a few tokens in a group (prefill), tasks are blocks of output columns,
// each running all groups, so no two tasks write the same floats; with a few (decode), each
// group's product runs whole, as matmul_grouped's, into a buffer whose rows are then added up in
// the same order (long streams of weights instead of one short one per group and block). The same
// bits either way.
void matmul_grouped_scatter(ThreadPool& pool, const std::vector<ScatterGroup>& groups,
                            const std::vector<float*>& clear = {});

}  // namespace duet
