#include "engine/logit_divergence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace duet {
namespace {

// Logits whose softmax is `probs`, shifted by `offset` (softmax does not see the shift).
std::vector<float> logits_of(const std::vector<double>& probs, double offset = 0) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p) + offset));
  return l;
}

TEST(LogitDivergenceTest, KnownPair) {
  // KL(p || q) = 0.5 ln(0.5 / 0.25) + 0.25 ln(0.25 / 0.5) + 0.25 ln(1) = 0.25 ln 2.
  const std::vector<float> p = logits_of({0.5, 0.25, 0.25});
  const std::vector<float> q = logits_of({0.25, 0.5, 0.25});
  const TokenDivergence d = token_divergence(p.data(), q.data(), 3);
  EXPECT_NEAR(d.kl, 0.25 * std::log(2.0), 1e-6);
  EXPECT_FALSE(d.same_top);
  EXPECT_NEAR(d.ref_entropy, 1.5 * std::log(2.0), 1e-6);  // 0.5 ln 2 + 2 * 0.25 ln 4
  EXPECT_NEAR(d.ref_top_prob, 0.5, 1e-6);
  // The reference is the first argument: KL(q2 || p) differs from KL(p || q2).
  const std::vector<float> q2 = logits_of({0.8, 0.1, 0.1});
  const double want = 0.8 * std::log(0.8 / 0.5) + 2 * 0.1 * std::log(0.1 / 0.25);
  const TokenDivergence d2 = token_divergence(q2.data(), p.data(), 3);
  EXPECT_NEAR(d2.kl, want, 1e-6);
  EXPECT_TRUE(d2.same_top);
  EXPECT_GT(std::abs(token_divergence(p.data(), q2.data(), 3).kl - want), 1e-3);
}

TEST(LogitDivergenceTest, ShiftedLogitsAreStable) {
  // Large common offsets (as real logits have) change nothing: log-softmax subtracts the max.
  const std::vector<float> p = logits_of({0.5, 0.25, 0.25}, 80.0);
  const std::vector<float> q = logits_of({0.25, 0.5, 0.25}, -30.0);
  EXPECT_NEAR(token_divergence(p.data(), q.data(), 3).kl, 0.25 * std::log(2.0), 1e-5);
}

TEST(LogitDivergenceTest, UniformReferenceHasMaximalEntropy) {
  const std::vector<float> u(64, 3.0f);
  const TokenDivergence d = token_divergence(u.data(), u.data(), 64);
  EXPECT_NEAR(d.ref_entropy, std::log(64.0), 1e-5);
  EXPECT_NEAR(d.ref_top_prob, 1.0 / 64, 1e-7);
}

TEST(LogitDivergenceTest, SameRowIsZeroAndAgrees) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(float(i)) * 4.0f;
  const TokenDivergence d = token_divergence(l.data(), l.data(), int64_t(l.size()));
  EXPECT_EQ(d.kl, 0.0);
  EXPECT_TRUE(d.same_top);
}

TEST(LogitDivergenceTest, TopOneTakesTheLowestIdOfEqualMaxima) {
  const float a[] = {1.0f, 3.0f, 3.0f};
  const float b[] = {1.0f, 3.0f, 2.9f};
  const float c[] = {1.0f, 2.9f, 3.0f};
  EXPECT_TRUE(token_divergence(a, b, 3).same_top);
  EXPECT_FALSE(token_divergence(a, c, 3).same_top);
}

TEST(LogitDivergenceTest, NonFiniteLogitThrows) {
  const float good[] = {0.0f, 1.0f};
  const float bad[] = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THROW(token_divergence(good, bad, 2), Error);
  EXPECT_THROW(token_divergence(bad, good, 2), Error);
}

TEST(LogitDivergenceTest, StatsOverPositions) {
  DivergenceStats s;
  EXPECT_EQ(s.n_tokens(), 0);
  EXPECT_EQ(s.mean_kl(), 0.0);
  EXPECT_EQ(s.top1_agreement(), 0.0);
  for (double kl : {0.4, 0.1, 0.3, 0.2}) s.add({kl, kl < 0.35, 10 * kl, kl});
  EXPECT_EQ(s.n_tokens(), 4);
  EXPECT_NEAR(s.mean_kl(), 0.25, 1e-12);
  // Sample standard deviation of (0.1, 0.2, 0.3, 0.4) is sqrt(0.05 / 3); over sqrt(4).
  EXPECT_NEAR(s.mean_kl_stderr(), std::sqrt(0.05 / 3) / 2, 1e-12);
  EXPECT_EQ(s.kl_quantile(0.0), 0.1);
  EXPECT_EQ(s.kl_quantile(0.5), 0.2);
  EXPECT_EQ(s.kl_quantile(0.99), 0.4);
  EXPECT_EQ(s.kl_quantile(1.0), 0.4);
  EXPECT_NEAR(s.top1_agreement(), 0.75, 1e-12);
  EXPECT_NEAR(s.top1_stderr(), std::sqrt(0.75 * 0.25 / 3), 1e-12);
  EXPECT_NEAR(s.mean_ref_entropy(), 2.5, 1e-12);
  EXPECT_NEAR(s.mean_ref_top_prob(), 0.25, 1e-12);
}

}  // namespace
}  // namespace duet
