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

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// DeepSeek-V3's noaux_tc: the bias decides which experts are chosen, but the weights are the
// unbiased sigmoid scores, renormalised and then scaled.
TEST(RouterTest, NoauxTcBiasChoosesButDoesNotWeigh) {
  RouterParams p;
  p.n_expert = 4;
  p.n_expert_used = 2;
  p.noaux_tc = true;
  p.norm_topk_prob = true;
  p.norm_eps = 1e-20;
  p.routed_scaling_factor = 2.5;
  const float logits[] = {2.0f, 1.0f, 0.0f, -1.0f};
  const float bias[] = {0.0f, 0.0f, 0.9f, 0.0f};  // lifts expert 2 (0.5 + 0.9) above expert 0
  int32_t ids[2];
  float w[2];
  route_topk(p, logits, 1, ids, w);
  EXPECT_EQ(ids[0], 0);  // no bias: experts 0 and 1
  EXPECT_EQ(ids[1], 1);
  p.score_bias = bias;
  route_topk(p, logits, 1, ids, w);
  EXPECT_EQ(ids[0], 2);  // 0.5 + 0.9 = 1.4 > sigmoid(2) = 0.88
  EXPECT_EQ(ids[1], 0);
  const float s2 = sigmoid(0.0f), s0 = sigmoid(2.0f);
  EXPECT_NEAR(w[0], s2 / (s2 + s0) * 2.5f, 1e-6);
  EXPECT_NEAR(w[1], s0 / (s2 + s0) * 2.5f, 1e-6);
  p.norm_topk_prob = false;  // then only scaled
  route_topk(p, logits, 1, ids, w);
  EXPECT_NEAR(w[0], s2 * 2.5f, 1e-6);
  EXPECT_NEAR(w[1], s0 * 2.5f, 1e-6);
}

// Groups score by the sum of their two best choice scores, not their best: group 0 has the
// single best expert (3.0) but a poor second, group 1 two good ones; with one group kept, the
// experts come from group 1 although expert 0 scores highest.
TEST(RouterTest, NoauxTcGroupsScoreByTheirTopTwo) {
  RouterParams p;
  p.n_expert = 6;
  p.n_expert_used = 2;
  p.noaux_tc = true;
  p.n_group = 2;
  p.topk_group = 1;
  const float logits[] = {3.0f, -3.0f, -3.0f, 1.5f, 1.4f, -2.0f};
  int32_t ids[2];
  float w[2];
  route_topk(p, logits, 1, ids, w);
  // Group 0: 0.953 + 0.047 = 1.00; group 1: 0.818 + 0.802 = 1.62.
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 4);
  EXPECT_NEAR(w[0], sigmoid(1.5f), 1e-6);
  EXPECT_NEAR(w[1], sigmoid(1.4f), 1e-6);
  p.topk_group = 2;  // both groups kept: plain top-2
  route_topk(p, logits, 1, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 3);
}

}  // namespace
}  // namespace duet
