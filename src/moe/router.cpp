#include "moe/router.h"

#include <algorithm>
#include <cmath>
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

// Keeps the topk_group groups with the highest sum of their two best choice scores and sets the
// other groups' choice scores to 0 (DeepSeek-V3's noaux_tc; ties go to the lower group).
void mask_groups_top2(const RouterParams& p, float* choice) {
  const int64_t per_group = p.n_expert / p.n_group;
  std::vector<float> group_score(static_cast<size_t>(p.n_group));
  for (int64_t g = 0; g < p.n_group; ++g) {
    float best = -std::numeric_limits<float>::infinity(), second = best;
    for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
      if (choice[e] > best) {
        second = best;
        best = choice[e];
      } else if (choice[e] > second) {
        second = choice[e];
      }
    }
    group_score[g] = best + second;
  }
  std::vector<int64_t> order(static_cast<size_t>(p.n_group));
  for (int64_t g = 0; g < p.n_group; ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
  for (int64_t r = p.topk_group; r < p.n_group; ++r) {
    std::fill(choice + order[r] * per_group, choice + (order[r] + 1) * per_group, 0.0f);
  }
}

// DeepSeek-V3's routing of one token (see RouterParams::noaux_tc).
void route_noaux_tc(const RouterParams& p, const float* logits, std::vector<float>& scores,
                    std::vector<float>& choice, std::vector<int32_t>& order, int32_t* tid,
                    float* tw) {
  const int64_t E = p.n_expert, K = p.n_expert_used;
  for (int64_t e = 0; e < E; ++e) {
    scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = scores[e] + (p.score_bias ? p.score_bias[e] : 0.0f);
  }
  if (p.n_group > 1) mask_groups_top2(p, choice.data());
  for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
    return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
  });
  float sum = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    tid[k] = order[k];
    tw[k] = scores[order[k]];
    sum += tw[k];
  }
  const float denom = p.norm_topk_prob ? sum + static_cast<float>(p.norm_eps) : 1.0f;
  for (int64_t k = 0; k < K; ++k)
    tw[k] = tw[k] / denom * static_cast<float>(p.routed_scaling_factor);
}

}  // namespace

void route_topk(const RouterParams& p, const float* logits, int64_t n_tokens, int32_t* ids,
                float* weights) {
  const int64_t E = p.n_expert, K = p.n_expert_used;
  DUET_CHECK(K >= 1 && K <= E, "k " << K << " experts " << E);
  DUET_CHECK(p.n_group >= 1 && E % p.n_group == 0, "n_group " << p.n_group);
  std::vector<float> scores(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  if (p.noaux_tc) {
    std::vector<float> choice(static_cast<size_t>(E));
    for (int64_t t = 0; t < n_tokens; ++t)
      route_noaux_tc(p, logits + t * E, scores, choice, order, ids + t * K, weights + t * K);
    return;
  }
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
