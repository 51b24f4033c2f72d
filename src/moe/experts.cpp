#include "moe/experts.h"

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace duet {

void mlp_forward(ThreadPool& pool, const MlpWeights& w, const float* x, int64_t n_tokens,
                 MlpScratch& scratch, float* y) {
  if (n_tokens == 0) return;
  const int64_t n_ff = w.gate.rows;
  scratch.gate.resize(static_cast<size_t>(n_tokens * n_ff));
  scratch.up.resize(scratch.gate.size());
  matmul(pool, w.gate, x, n_tokens, scratch.gate.data());
  matmul(pool, w.up, x, n_tokens, scratch.up.data());
  silu_mul(scratch.gate.data(), scratch.up.data(), n_tokens * n_ff, scratch.gate.data());
  matmul(pool, w.down, scratch.gate.data(), n_tokens, y);
}

uint64_t run_experts(ThreadPool& pool, const std::vector<MlpWeights>& experts, ExpertBatch& batch,
                 MlpScratch& scratch) {
  DUET_CHECK(static_cast<int64_t>(experts.size()) == batch.n_local_expert,
             "experts " << experts.size() << " batch " << batch.n_local_expert);
  const int64_t D = batch.n_embd;
  uint64_t bytes = 0;
  for (int64_t e = 0; e < batch.n_local_expert; ++e) {
    const int64_t r0 = batch.offsets[e], n = batch.offsets[e + 1] - r0;
    if (n == 0) continue;
    mlp_forward(pool, experts[e], batch.x.data() + r0 * D, n, scratch, batch.y.data() + r0 * D);
    const MlpWeights& w = experts[e];
    for (const Matrix* m : {&w.gate, &w.up, &w.down})
      bytes += static_cast<uint64_t>(m->rows * m->cols) * dtype_size(m->dtype);
  }
  return bytes;
}

}  // namespace duet
