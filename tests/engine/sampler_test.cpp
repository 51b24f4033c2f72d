#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// The reference for the draws below: every token sorted by descending logit (lower id first),
// the probabilities exp(l / T - max / T) of the top-k survivors, and the top-p nucleus among
// them. Returns the nucleus's ids in rank order and their probabilities (normalised).
std::pair<std::vector<int32_t>, std::vector<double>> reference_nucleus(
    const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  if (p.top_k > 0 && size_t(p.top_k) < ids.size()) ids.resize(size_t(p.top_k));
  const double max = logits[size_t(ids[0])] / p.temperature;
  std::vector<double> prob;
  double sum = 0;
  for (int32_t id : ids) {
    prob.push_back(std::exp(logits[size_t(id)] / p.temperature - max));
    sum += prob.back();
  }
  double cum = 0;
  size_t keep = 0;
  while (keep < ids.size()) {
    cum += prob[keep++] / sum;
    if (cum >= p.top_p) break;
  }
  ids.resize(keep);
  prob.resize(keep);
  for (double& q : prob) q /= sum * cum;
  return {ids, prob};
}

// Large vocabularies, nuclei of a few tokens to thousands (the sampler sorts only as many ranks
// as it needs, in stages), with and without top-k: every draw is in the reference's nucleus, the
// token just outside it never comes, and the draws follow the nucleus's probabilities.
TEST(SamplerTest, DrawsFollowTheReferenceNucleus) {
  struct Case {
    int64_t n_vocab;
    float sigma, temperature, top_p;
    int32_t top_k;
    float step = 0;  // logits rounded to multiples of it: many ties, also at the top-k boundary
  };
  const Case cases[] = {{32000, 3.0f, 0.7f, 0.9f, 0},
                        {32000, 3.0f, 1.0f, 0.5f, 0},
                        {5000, 0.3f, 1.0f, 0.95f, 0},
                        {5000, 0.05f, 1.0f, 0.6f, 0},
                        {5000, 2.0f, 0.8f, 0.9f, 100},
                        {5000, 2.0f, 0.8f, 1.0f, 300},
                        {151936, 4.0f, 0.6f, 0.95f, 0},
                        {300, 1.0f, 1.3f, 1.0f, 0},
                        // every token: the draw walks blocks of sums, then one block
                        {32000, 0.05f, 1.0f, 1.0f, 0},
                        {32001, 2.0f, 0.9f, 1.0f, 0},
                        // top-k's scan over a large vocabulary, with ties at its boundary
                        {151936, 2.0f, 0.8f, 1.0f, 40},
                        {32000, 1.0f, 1.0f, 1.0f, 50, 0.25f},
                        {32000, 1.0f, 1.0f, 0.8f, 7, 0.5f}};
  int c_index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("case " + std::to_string(c_index++));
    std::mt19937 rng(100 + c_index);
    std::normal_distribution<float> normal(0.0f, c.sigma);
    std::vector<float> logits(size_t(c.n_vocab));
    for (float& v : logits)
      v = c.step > 0 ? std::round(normal(rng) / c.step) * c.step : normal(rng);
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.top_k = c.top_k;
    p.seed = 11;
    const auto [ids, prob] = reference_nucleus(logits, p);
    std::map<int32_t, size_t> rank;
    for (size_t r = 0; r < ids.size(); ++r) rank[ids[r]] = r;
    Sampler s(p);
    const int draws = c.n_vocab > 10000 ? 3000 : 10000;  // (large vocabularies: fewer, for time)
    std::vector<int> seen(ids.size(), 0);
    for (int i = 0; i < draws; ++i) {
      const int32_t tok = s.sample(logits.data(), c.n_vocab);
      auto it = rank.find(tok);
      ASSERT_NE(it, rank.end()) << "token " << tok << " outside the nucleus of " << ids.size();
      ++seen[it->second];
    }
    // The most likely ranks, and the nucleus's last quarter taken together, come as often as
    // their probabilities say (6 standard deviations: the seed is fixed, this never flakes).
    const auto check = [&](size_t from, size_t to, const char* what) {
      double q = 0;
      int got = 0;
      for (size_t r = from; r < to; ++r) q += prob[r], got += seen[r];
      const double sd = std::sqrt(draws * q * (1 - q)) + 1;
      EXPECT_NEAR(got, draws * q, 6 * sd) << what << " ranks " << from << ".." << to;
    };
    for (size_t r = 0; r < std::min<size_t>(3, ids.size()); ++r) check(r, r + 1, "top");
    check(ids.size() * 3 / 4, ids.size(), "last quarter");
  }
}

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
