#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"

namespace duet {
namespace {

TEST(SamplerTest, GreedyPicksFirstMaximum) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s({});
  EXPECT_EQ(s.sample(logits, 4), 1);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  const float logits[] = {0.1f, 0.3f, 3.0f, 0.2f};
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  p.seed = 7;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits, 4), 2);
}

TEST(SamplerTest, TopPKeepsSmallestNucleus) {
  // Probabilities ~ {0.64, 0.24, 0.09, 0.03}: top_p 0.7 keeps exactly the first two.
  const float logits[] = {3.0f, 2.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.7f;
  p.seed = 1;
  Sampler s(p);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s.sample(logits, 4)];
  EXPECT_EQ(seen.count(2) + seen.count(3), 0u);
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], 200);
}

TEST(SamplerTest, TemperatureFollowsSoftmax) {
  const float logits[] = {0.0f, std::log(3.0f)};  // p = {0.25, 0.75} at temperature 1
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  Sampler s(p);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits, 2);
  EXPECT_NEAR(ones / double(n), 0.75, 0.02);
}

TEST(SamplerTest, SameSeedSameSequence) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.7f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 99;
  Sampler a(p), b(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits.data(), 100), b.sample(logits.data(), 100));
}

TEST(SamplerTest, RejectsBadParameters) {
  SamplingParams p;
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_p = 1.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(Sampler{p}, Error);
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

// A NaN or infinite logit is an error naming the token, greedy or sampled, never a token.
TEST(SamplerTest, NonFiniteLogitsAreAnError) {
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> logits = {0.5f, 2.0f, 1.0f, 0.25f};
    logits[2] = bad;
    for (float temperature : {0.0f, 0.8f}) {
      SamplingParams p;
      p.temperature = temperature;
      p.top_k = temperature > 0 ? 3 : 0;
      p.seed = 1;
      Sampler s(p);
      try {
        s.sample(logits.data(), 4);
        ADD_FAILURE() << bad << " at temperature " << temperature << " gave a token";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("token id 2"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace duet
