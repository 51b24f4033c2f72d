#include "moe/local_dispatcher.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"

namespace duet {

void LocalDispatcher::dispatch_send(const RoutedTokens& tokens) {
  DUET_CHECK(tokens.out || tokens.n_tokens == 0, "LocalDispatcher: no output rows");
  const int64_t n_pairs = tokens.n_tokens * tokens.n_expert_used;
  batch_.first_expert = 0;
  batch_.n_local_expert = n_expert_;
  batch_.n_embd = tokens.n_embd;
  // Counting sort of (token, k) pairs by expert keeps each expert's rows in token order.
  batch_.offsets.assign(static_cast<size_t>(n_expert_ + 1), 0);
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int32_t e = tokens.topk_ids[i];
    DUET_CHECK(e >= 0 && e < n_expert_, "expert id " << e << " of " << n_expert_);
    ++batch_.offsets[e + 1];
  }
  for (int64_t e = 0; e < n_expert_; ++e) batch_.offsets[e + 1] += batch_.offsets[e];
  std::vector<int64_t> fill(batch_.offsets.begin(), batch_.offsets.end() - 1);
  batch_.resize_rows();
  batch_.clear.clear();
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int64_t row = fill[tokens.topk_ids[i]]++, t = i / tokens.n_expert_used;
    batch_.x[row] = tokens.x + t * tokens.n_embd;
    batch_.out[row] = tokens.out + t * tokens.n_embd;
    batch_.weight[row] = tokens.topk_weights[i];
  }
}


}  // namespace duet
