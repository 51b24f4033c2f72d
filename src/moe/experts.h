// SiLU-gated MLPs: dense layers, shared experts and routed experts.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/grouped_matmul.h"
#include "moe/dispatcher.h"

namespace duet {

// down(silu(gate(x)) * up(x)); gate, up: [n_ff, n_embd]; down: [n_embd, n_ff].
struct MlpWeights {
  Matrix gate;
  Matrix up;
  Matrix down;
};

// Reusable scratch so the hot path does not allocate per call.
struct MlpScratch {
  std::vector<float> act;  // [n_rows, n_ff] silu(gate) * up of every row
  std::vector<GatedGroup> gated;
  std::vector<MatmulGroup> down;
  std::vector<ScatterGroup> scatter;
  std::vector<GatedGroup> gated_part;  // chunked combine: one chunk's groups
  std::vector<ScatterGroup> scatter_part;
  std::vector<float*> clear_part;          // and their output rows to zero
  std::vector<int32_t> group_of;           // [n_local_expert] an expert's group, -1 without rows
  std::vector<float*> shared_out;          // [n_tokens] the shared experts' output rows
  std::vector<float> shared_weight;        // [n_tokens] 1
};

// Shared experts (DeepSeek) run inside run_experts: every token of x through w, its output added
// to its row of out after the routed experts' rows.
struct SharedExperts {
  const MlpWeights* w = nullptr;
  const float* x = nullptr;  // [n_tokens, n_embd]
  float* out = nullptr;      // [n_tokens, n_embd]
  int64_t n_tokens = 0;
};

// y[n_tokens, n_embd] = mlp(x[n_tokens, n_embd]).
void mlp_forward(ThreadPool& pool, const MlpWeights& w, const float* x, int64_t n_tokens,
                 MlpScratch& scratch, float* y);

// Runs each local expert on its rows of the batch, read in place, and adds to the batch's output
// rows the weighted sum of their rows' expert outputs (the reduction fused into the down
// projection), after zeroing batch.clear. Each projection of each expert is one product over all of
// the expert's rows, so its weights are read once; all experts' gate/up products share one pool job
// and all down products another. experts[e] is local expert e. Returns the bytes of expert weights
// it read (the experts that had rows). With chunks (ExpertBatch::chunk_ends), the experts run chunk
// by chunk (gate/up, then down) in batch.order, calling batch.chunk_ready before each (if set)
// and batch.chunk_done after. With shared (not with chunks), the shared experts are one more group
// of both jobs, after the routed ones: each out row gains exactly what adding mlp_forward's
// output after run_experts would add (their bytes are not counted).
uint64_t run_experts(ThreadPool& pool, const std::vector<MlpWeights>& experts, ExpertBatch& batch,
                     MlpScratch& scratch, const SharedExperts* shared = nullptr);

}  // namespace duet
