// The agree phase of a step: the plan every rank derives from every rank's offer (forward mode,
// dummy batch, padding, the all-or-none micro-batch decision of seed 000), as a pure function and
// over 1, 2 and 4 in-process ranks stepping through a schedule of offers.
#include "engine/step_agreement.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/inproc_backend.h"

namespace duet {
namespace {

StepOffer decode(int64_t n, bool can_split = true) {
  return {n, false, can_split};
}
StepOffer prefill(int64_t n, bool can_split = true) {
  return {n, true, can_split};
}
constexpr StepOffer kIdle{};

MicroBatchPolicy split_policy(int64_t decode_threshold = 4, int64_t prefill_threshold = 16) {
  return {true, decode_threshold, prefill_threshold};
}

TEST(StepAgreementTest, NoWorkAnywhereIsIdle) {
  const StepPlan p = plan_step({kIdle, kIdle}, 1, split_policy());
  EXPECT_FALSE(p.runs());
  EXPECT_EQ(p.describe(), "idle");
}

TEST(StepAgreementTest, ARankWithoutWorkRunsTheDummyPaddedToTheLargest) {
  const std::vector<StepOffer> offers{decode(3), kIdle, decode(7)};
  for (int rank = 0; rank < 3; ++rank) {
    const StepPlan p = plan_step(offers, rank, {});
    EXPECT_EQ(p.mode, ForwardMode::kDecode);
    EXPECT_EQ(p.padded_tokens, 7);
    EXPECT_EQ(p.dummy, rank == 1) << rank;
    EXPECT_FALSE(p.micro_batch);
    EXPECT_EQ(p.group_tokens(), 10);
  }
}

TEST(StepAgreementTest, AnyRankPrefillingMakesThePrefillMode) {
  EXPECT_EQ(plan_step({decode(2), prefill(9)}, 0, {}).mode, ForwardMode::kPrefill);
  // A prefill flag on an empty batch is no prefill.
  EXPECT_EQ(plan_step({decode(2), prefill(0)}, 0, {}).mode, ForwardMode::kDecode);
}

TEST(StepAgreementTest, MicroBatchesOnlyWhenEveryWorkingRankCanSplitPastItsThreshold) {
  // Every rank at or past the decode threshold of 4, and splittable: all split at 4|4.
  StepPlan p = plan_step({decode(8), decode(6)}, 1, split_policy());
  EXPECT_TRUE(p.micro_batch);
  EXPECT_EQ(p.micro_batch_split, 4);
  EXPECT_EQ(p.describe(), "decode padded 8 micro-batch 4|4");
  // One rank below its threshold vetoes for all.
  EXPECT_FALSE(plan_step({decode(8), decode(3)}, 0, split_policy()).micro_batch);
  // One rank that cannot split (a single sequence) vetoes for all.
  EXPECT_FALSE(plan_step({decode(8), decode(6, false)}, 0, split_policy()).micro_batch);
  // A prefilling rank is held to the prefill threshold, a decoding one to the decode threshold.
  EXPECT_FALSE(plan_step({prefill(12), decode(8)}, 0, split_policy()).micro_batch);
  EXPECT_TRUE(plan_step({prefill(20), decode(12)}, 0, split_policy()).micro_batch);
  // Disabled: never.
  EXPECT_FALSE(plan_step({decode(64), decode(64)}, 0, {}).micro_batch);
}

TEST(StepAgreementTest, PaddingThatEmptiesARanksSecondMicroBatchAbortsForAll) {
  // Padded to 16, A takes 8 tokens: the rank with 8 real tokens would leave B empty.
  EXPECT_FALSE(plan_step({decode(16), decode(8)}, 0, split_policy()).micro_batch);
  EXPECT_TRUE(plan_step({decode(16), decode(9)}, 0, split_policy()).micro_batch);
  // Odd counts: A takes the larger half.
  const StepPlan p = plan_step({decode(7), decode(5)}, 0, split_policy());
  EXPECT_TRUE(p.micro_batch);
  EXPECT_EQ(p.micro_batch_split, 4);
}

TEST(StepAgreementTest, IdleRanksRunADummyPairWhenTheOthersSplit) {
  const StepPlan p = plan_step({decode(8), kIdle, decode(6)}, 1, split_policy());
  EXPECT_TRUE(p.micro_batch);
  EXPECT_TRUE(p.dummy);
  EXPECT_EQ(p.describe(), "decode padded 8 micro-batch 4|4 dummy");
}

// Multi-step: the group runs the fewest steps any working rank offers; idle ranks do not count
// (they run their dummy batch as often); any prefill makes it one step.
TEST(StepAgreementTest, MultiStepRunsTheFewestStepsAWorkingRankOffers) {
  StepOffer a = decode(4), b = decode(2), idle = kIdle;
  a.n_steps = 8;
  b.n_steps = 3;
  idle.n_steps = 1;
  EXPECT_EQ(plan_step({a, b}, 0, {}).n_steps, 3);
  EXPECT_EQ(plan_step({a, idle}, 1, {}).n_steps, 8);
  EXPECT_EQ(plan_step({a, idle}, 1, {}).describe(), "decode padded 4 x8 dummy");
  StepOffer p = prefill(5);
  p.n_steps = 8;
  EXPECT_EQ(plan_step({a, p}, 0, {}).n_steps, 1);
  StepOffer bad = decode(1);
  bad.n_steps = 0;
  EXPECT_THROW(plan_step({bad}, 0, {}), Error);
}

TEST(StepAgreementTest, ASingleRankIsAGroupOfOne) {
  SoloCoordinator solo;
  const StepPlan p = agree(solo, decode(6), split_policy());
  EXPECT_EQ(p.describe(), "decode padded 6 micro-batch 3|3");
  EXPECT_EQ(p.offers.size(), 1u);
  EXPECT_FALSE(agree(solo, kIdle, {}).runs());
}

// Ranks step through a schedule of offers (rank r's offer in step s is schedule[s][r]); every
// rank's plan of every step is recorded and compared with the plan drawn below.
class StepAgreementRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(StepAgreementRanksTest, EveryRankAgreesOnEveryStep) {
  const int n = GetParam();
  // Step 0: every rank prefills a prompt of 10 + r tokens.
  // Step 1: every rank decodes 8 sequences          → split 4|4 on every rank.
  // Step 2: rank 0 alone decodes 8, the rest idle   → dummy pairs beside rank 0's split.
  // Step 3: rank 0 decodes 1 sequence, others idle  → no split, dummies of 1 token.
  // Step 4: nobody has work                          → idle.
  // Step 5: rank r decodes 2 sequences offering 2 + r steps → all run 2 steps.
  std::vector<std::vector<StepOffer>> schedule(6, std::vector<StepOffer>(static_cast<size_t>(n)));
  for (int r = 0; r < n; ++r) {
    schedule[0][static_cast<size_t>(r)] = prefill(10 + r);
    schedule[1][static_cast<size_t>(r)] = decode(8);
    schedule[2][static_cast<size_t>(r)] = r == 0 ? decode(8) : kIdle;
    schedule[3][static_cast<size_t>(r)] = r == 0 ? decode(1, false) : kIdle;
    schedule[5][static_cast<size_t>(r)] = decode(2, false);
    schedule[5][static_cast<size_t>(r)].n_steps = 2 + r;
  }
  std::mutex mu;
  std::vector<std::vector<std::string>> seen(static_cast<size_t>(n));
  run_ranks(n, [&](DistContext& ctx) {
    const int r = ctx.rank();
    std::vector<std::string> mine;
    for (const std::vector<StepOffer>& step : schedule) {
      mine.push_back(
          agree(ctx.coord(), step[static_cast<size_t>(r)], split_policy(4, 64)).describe());
    }
    std::lock_guard<std::mutex> lock(mu);
    seen[static_cast<size_t>(r)] = mine;
  });
  for (int r = 0; r < n; ++r) {
    const std::string dummy = r == 0 ? "" : " dummy";
    const std::vector<std::string> want{
        "prefill padded " + std::to_string(10 + n - 1),  // below the prefill threshold of 64
        "decode padded 8 micro-batch 4|4", "decode padded 8 micro-batch 4|4" + dummy,
        "decode padded 1" + dummy, "idle", "decode padded 2 x2"};
    EXPECT_EQ(seen[static_cast<size_t>(r)], want) << "rank " << r << " of " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, StepAgreementRanksTest, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace duet
