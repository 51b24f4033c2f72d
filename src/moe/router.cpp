#include "moe/router.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"

namespace duet {

namespace {

// Zeroes the scores of every group outside the topk_group best (a group scores by its best
// expert), as DeepSeek-V2's group_limited_greedy does (masked_fill with 0.0).
void mask_groups(const RouterParams& p, float* scores) {
  const int64_t per_group = p.n_expert / p.n_group;
  std::vector<float> group_score(static_cast<size_t>(p.n_group));
  for (int64_t g = 0; g < p.n_group; ++g) {
    group_score[g] = *std::max_element(scores + g * per_group, scores + (g + 1) * per_group);
  }
  std::vector<int64_t> order(static_cast<size_t>(p.n_group));
  for (int64_t g = 0; g < p.n_group; ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
  for (int64_t r = p.topk_group; r < p.n_group; ++r) {
    std::fill(scores + order[r] * per_group, scores + (order[r] + 1) * per_group, 0.0f);
  }
}

}  // namespace

void route_topk(const RouterParams& p, const float* logits, int64_t n_tokens, int32_t* ids,
                float* weights) {
  const int64_t E = p.n_expert, K = p.n_expert_used;
  DUET_CHECK(K >= 1 && K <= E, "k " << K << " experts " << E);
  DUET_CHECK(p.n_group >= 1 && E % p.n_group == 0, "n_group " << p.n_group);
  std::vector<float> scores(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::copy(logits + t * E, logits + (t + 1) * E, scores.begin());
    softmax(scores.data(), E);
    if (p.n_group > 1) mask_groups(p, scores.data());
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
    int32_t* tid = ids + t * K;
    float* tw = weights + t * K;
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      tid[k] = order[k];
      tw[k] = scores[order[k]];
      sum += tw[k];
    }
    if (p.norm_topk_prob) {
      const float denom = sum + static_cast<float>(p.norm_eps);
      for (int64_t k = 0; k < K; ++k) tw[k] /= denom;
    } else if (p.routed_scaling_factor != 1.0) {
      for (int64_t k = 0; k < K; ++k) tw[k] *= static_cast<float>(p.routed_scaling_factor);
    }
  }
}

}  // namespace duet
