// A stand-in for run_experts in dispatcher tests: local expert l maps an input value v to
// f(global id of l, v), elementwise; the batch's stale output rows are zeroed, then every output
// row grows by the weighted sum of its rows' results, as run_experts does — chunk by chunk, with
// chunk_ready before and chunk_done after each, in b.order, when the batch has chunks (a chunked
// combine, or the own experts last).
#pragma once

#include <algorithm>
#include <functional>

#include "moe/dispatcher.h"

namespace duet {

inline void run_fake_experts(ExpertBatch& b, const std::function<float(int64_t e, float v)>& f) {
  const int64_t D = b.n_embd;
  auto run = [&](int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
      const int64_t e = b.first_expert + l;
      for (int64_t r = b.offsets[l]; r < b.offsets[l + 1]; ++r)
        for (int64_t i = 0; i < D; ++i) b.out[r][i] += b.weight[r] * f(e, b.x[r][i]);
    }
  };
  if (b.chunk_ends.empty()) {
    for (float* o : b.clear) std::fill(o, o + D, 0.0f);
    run(0, b.n_local_expert);
    return;
  }
  for (size_t c = 0; c < b.chunk_ends.size(); ++c) {
    const int64_t p0 = c == 0 ? 0 : b.chunk_ends[c - 1], p1 = b.chunk_ends[c];
    if (b.chunk_ready) b.chunk_ready(static_cast<int>(c));
    for (int64_t p = p0; p < p1; ++p) {  // chunk c: positions [p0, p1) of b.order
      const int64_t l = b.expert_at(p);
      for (int64_t r = b.offsets[l]; r < b.offsets[l + 1] && !b.clear.empty(); ++r)
        std::fill(b.clear[r], b.clear[r] + D, 0.0f);
      run(l, l + 1);
    }
    b.chunk_done(static_cast<int>(c));
  }
}

}  // namespace duet
