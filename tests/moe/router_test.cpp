#include "moe/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace duet {
namespace {

std::vector<float> softmax_of(const std::vector<float>& x) {
  double m = x[0], s = 0;
  for (float v : x) m = std::max<double>(m, v);
  std::vector<float> p;
  for (float v : x) s += std::exp(v - m);
  for (float v : x) p.push_back(static_cast<float>(std::exp(v - m) / s));
  return p;
}

TEST(RouterTest, GreedyTopKWithoutNorm) {
  RouterParams p;
  p.n_expert = 6;
  p.n_expert_used = 2;
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.3f, 0.0f};
  int32_t ids[2];
  float w[2];
  route_topk(p, logits.data(), 1, ids, w);
  const auto prob = softmax_of(logits);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], prob[1], 1e-6);
  EXPECT_NEAR(w[1], prob[3], 1e-6);
}

TEST(RouterTest, NormalisedWeightsSumToOne) {
  RouterParams p;
  p.n_expert = 4;
  p.n_expert_used = 3;
  p.norm_topk_prob = true;
  const float logits[] = {1.0f, 0.0f, 3.0f, 2.0f, /* token 2 */ 0.0f, 0.0f, 0.0f, 0.0f};
  int32_t ids[6];
  float w[6];
  route_topk(p, logits, 2, ids, w);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0f, 1e-6);
  EXPECT_EQ(ids[0], 2);
  // Exact ties go to the lower expert id.
  EXPECT_EQ(ids[3], 0);
  EXPECT_EQ(ids[4], 1);
  EXPECT_EQ(ids[5], 2);
}

TEST(RouterTest, ScalingFactorAppliesWithoutNorm) {
  RouterParams p;
  p.n_expert = 4;
  p.n_expert_used = 2;
  p.routed_scaling_factor = 16.0;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f};
  int32_t ids[2];
  float w[2];
  route_topk(p, logits.data(), 1, ids, w);
  EXPECT_NEAR(w[0], 16.0f * softmax_of(logits)[3], 1e-5);
}

TEST(RouterTest, GroupLimitedKeepsBestGroups) {
  // 4 groups of 2. Group scores (best expert): g0 = 5.0, g1 = 4.9, g2 = 1.0, g3 = 4.0.
  // topk_group 2 keeps g0 and g1; expert 6 (4.0) is excluded although it beats expert 3 (3.0).
  RouterParams p;
  p.n_expert = 8;
  p.n_expert_used = 3;
  p.n_group = 4;
  p.topk_group = 2;
  const std::vector<float> logits = {5.0f, 0.0f, 4.9f, 3.0f, 1.0f, 0.5f, 4.0f, 0.2f};
  int32_t ids[3];
  float w[3];
  route_topk(p, logits.data(), 1, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 3);
  // Weights are the unmasked softmax probabilities.
  EXPECT_NEAR(w[2], softmax_of(logits)[3], 1e-6);
}

}  // namespace
}  // namespace duet
