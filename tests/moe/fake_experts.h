// A stand-in for run_experts in dispatcher tests: local expert l maps an input value v to
// f(global id of l, v), elementwise; the batch's stale output rows are zeroed, then every output
// row grows by the weighted sum of its rows' results, as run_experts does.
#pragma once

#include <algorithm>
#include <functional>

#include "moe/dispatcher.h"

namespace duet {

inline void run_fake_experts(ExpertBatch& b, const std::function<float(int64_t e, float v)>& f) {
  const int64_t D = b.n_embd;
  for (float* o : b.clear) std::fill(o, o + D, 0.0f);
  for (int64_t l = 0; l < b.n_local_expert; ++l) {
    const int64_t e = b.first_expert + l;
    for (int64_t r = b.offsets[l]; r < b.offsets[l + 1]; ++r)
      for (int64_t i = 0; i < D; ++i) b.out[r][i] += b.weight[r] * f(e, b.x[r][i]);
  }
}

}  // namespace duet
