#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace duet {

void attention_gqa(ThreadPool& pool, const ForwardInput& in, KvStore& kv, int64_t il,
                   const GqaShape& shape, const float* q, float* out) {
  const int64_t hd = shape.head_dim;
  const int64_t group = shape.n_head / shape.n_head_kv;
  const int64_t n_tasks = in.n_tokens() * shape.n_head_kv;
  pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [group, n_ctx]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / shape.n_head_kv, kvh = task % shape.n_head_kv;
      const SeqSpan& span = in.spans[in.span_of[t]];
      const int64_t n_ctx = in.pos[t] + 1;
      scores.resize(static_cast<size_t>(group * n_ctx));
      const float* qt = q + (t * shape.n_head + kvh * group) * hd;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float* kj = kv.k(span.seq_id, il, j) + kvh * hd;
        for (int64_t g = 0; g < group; ++g)
          scores[g * n_ctx + j] = dot(qt + g * hd, kj, hd) * shape.scale;
      }
      for (int64_t g = 0; g < group; ++g) softmax(scores.data() + g * n_ctx, n_ctx);
      float* ot = out + (t * shape.n_head + kvh * group) * hd;
      std::fill(ot, ot + group * hd, 0.0f);
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float* vj = kv.v(span.seq_id, il, j) + kvh * hd;
        for (int64_t g = 0; g < group; ++g) axpy(scores[g * n_ctx + j], vj, hd, ot + g * hd);
      }
    }
  });
}

}  // namespace duet
