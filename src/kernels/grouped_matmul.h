// Many independent matrix products run as one job on the pool: the routed experts of a MoE layer
// (a few rows each in a decode batch) would otherwise pay one pool synchronisation per product
// and leave threads idle at the end of each small one.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace duet {

// y[n_tokens, w.rows] = x[n_tokens, w.cols] · wᵀ, contiguous f32; y must not alias x.
struct MatmulGroup {
  Matrix w;
  const float* x = nullptr;
  int64_t n_tokens = 0;  // may be 0: the group is skipped
  float* y = nullptr;
};

// y[n_tokens, n_ff] = silu(x · gateᵀ) ⊙ (x · upᵀ), the first half of a SiLU-gated MLP;
// gate, up: [n_ff, n_in]; x: [n_tokens, n_in]. Contiguous f32; y must not alias x.
struct GatedGroup {
  Matrix gate;
  Matrix up;
  const float* x = nullptr;
  int64_t n_tokens = 0;  // may be 0: the group is skipped
  float* y = nullptr;
};

// Every group's product, split into (group, block of weight rows) tasks that one parallel_for
// shares out, so each weight row is still read once per call. Same numerics as matmul().
void matmul_grouped(ThreadPool& pool, const std::vector<MatmulGroup>& groups);

// Every group's gated product, likewise; a task computes a block of gate and up rows and
// applies silu_mul to it while it is in cache.
void gated_matmul_grouped(ThreadPool& pool, const std::vector<GatedGroup>& groups);

}  // namespace duet
