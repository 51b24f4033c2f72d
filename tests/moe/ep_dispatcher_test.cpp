// EpDispatcher against LocalDispatcher on the same routing, on in-process ranks: each rank
// routes its own tokens; "expert" e maps a row x to (e + 1) · x + e, so every output row says
// which expert made it. Both algorithms, 1-4 ranks, uneven and degenerate routings.
#include "moe/ep_dispatcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "core/error.h"
#include "dist/inproc_backend.h"
#include "moe/local_dispatcher.h"
#include "moe/fake_experts.h"

namespace duet {
namespace {

struct Routing {
  int64_t n_tokens = 0, n_embd = 0, k = 0;
  std::vector<float> x, w;   // [n_tokens, n_embd], [n_tokens, k]
  std::vector<int32_t> ids;  // [n_tokens, k]
};

// Picks a token's k distinct experts; `pick(rank, t, j)` may force them.
using Pick = std::function<int32_t(int rank, int64_t t, int64_t j, std::mt19937& rng)>;

Routing make_routing(int rank, int64_t n_tokens, int64_t D, int64_t K, const Pick& pick) {
  std::mt19937 rng(1000 + rank);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Routing r{n_tokens, D, K, {}, {}, {}};
  for (int64_t i = 0; i < n_tokens * D; ++i) r.x.push_back(u(rng));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t j = 0; j < K; ++j) {
      r.ids.push_back(pick(rank, t, j, rng));
      r.w.push_back(0.5f + 0.25f * u(rng));
    }
  return r;
}

void run_experts_fake(ExpertBatch& b) {
  run_fake_experts(b, [](int64_t e, float v) { return static_cast<float>(e + 1) * v + e; });
}

std::vector<float> run_one(Dispatcher& d, const Routing& r) {
  std::vector<float> out(static_cast<size_t>(r.n_tokens * r.n_embd), 0.5f);
  d.dispatch_send({r.x.data(), r.ids.data(), r.w.data(), r.n_tokens, r.n_embd, r.k, out.data()});
  run_experts_fake(d.dispatch_recv());
  d.combine_send();
  d.combine_recv();
  return out;
}

struct Case {
  int world;
  int64_t n_expert;
  All2AllBackend backend;
};

// Every rank's EP output equals what LocalDispatcher gives for its tokens, in steps without a
// plan and in steps planned as the engines plan them (the most tokens of any rank), where
// high_throughput goes in one round.
void expect_same_as_local(const Case& c, int64_t D, int64_t K,
                          const std::function<int64_t(int rank)>& n_tokens, const Pick& pick) {
  int64_t most = 0;
  for (int rank = 0; rank < c.world; ++rank) most = std::max(most, n_tokens(rank));
  run_ranks(c.world, [&](DistContext& ctx) {
    const Routing r = make_routing(ctx.rank(), n_tokens(ctx.rank()), D, K, pick);
    LocalDispatcher local(c.n_expert);
    const std::vector<float> want = run_one(local, r);
    EpDispatcher ep(ctx.comm(), place_experts(c.n_expert, c.world), {c.backend, 16});
    for (int rep = 0; rep < 4; ++rep) {  // buffers are reused across steps
      const bool planned = rep >= 2;
      if (planned) ep.plan_step(most);
      const std::vector<float> got = run_one(ep, r);
      if (c.backend == All2AllBackend::kHighThroughput) {
        EXPECT_EQ(ep.last_dispatch_bounded(), planned);
      }
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i]))) << "rank " << ctx.rank();
    }
  });
}

Pick random_distinct(int64_t n_expert) {
  return [n_expert](int, int64_t, int64_t j, std::mt19937& rng) {
    // j-th of K distinct experts: a random start plus j (mod n_expert) keeps them distinct.
    static thread_local int32_t start = 0;
    if (j == 0) start = static_cast<int32_t>(rng() % n_expert);
    return static_cast<int32_t>((start + j * 5) % n_expert);
  };
}

class EpDispatcherTest : public ::testing::TestWithParam<Case> {};

TEST_P(EpDispatcherTest, RandomRouting) {
  const Case c = GetParam();
  expect_same_as_local(
      c, 8, 2, [](int rank) { return 5 + 3 * rank; }, random_distinct(c.n_expert));
}

// Every token of every rank goes to expert 0: one rank gets everything, the others nothing.
TEST_P(EpDispatcherTest, EveryTokenToOneExpert) {
  const Case c = GetParam();
  expect_same_as_local(
      c, 4, 1, [](int) { return 7; }, [](int, int64_t, int64_t, std::mt19937&) { return 0; });
}

// Rank 1 (or the only rank) has no tokens at all, yet takes part in every transfer.
TEST_P(EpDispatcherTest, RankWithZeroTokens) {
  const Case c = GetParam();
  expect_same_as_local(
      c, 8, 2, [](int rank) { return rank == 1 || rank == 0 ? 0 : 4; },
      random_distinct(c.n_expert));
  expect_same_as_local(
      c, 8, 2, [](int rank) { return rank == 1 ? 0 : 6; }, random_distinct(c.n_expert));
}

// All of a token's top-k experts on one rank (experts 0, 1, 2 of rank 0's range): the
// high_throughput record lists several experts, sent once.
TEST_P(EpDispatcherTest, SeveralTopkOnOneRank) {
  const Case c = GetParam();
  expect_same_as_local(
      c, 8, 3, [](int rank) { return 3 + rank; },
      [](int, int64_t t, int64_t j, std::mt19937&) {
        return static_cast<int32_t>(t % 2 == 0 ? j : 11 - j);
      });
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpDispatcherTest,
                         ::testing::Values(Case{1, 12, All2AllBackend::kHighThroughput},
                                           Case{2, 12, All2AllBackend::kHighThroughput},
                                           Case{3, 12, All2AllBackend::kHighThroughput},
                                           Case{4, 12, All2AllBackend::kHighThroughput},
                                           Case{1, 12, All2AllBackend::kLowLatency},
                                           Case{2, 12, All2AllBackend::kLowLatency},
                                           Case{3, 12, All2AllBackend::kLowLatency},
                                           Case{4, 12, All2AllBackend::kLowLatency}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(all2all_backend_name(info.param.backend)) + "_ep" +
                                  std::to_string(info.param.world);
                         });

// high_throughput sends a token once per destination rank, low_latency once per expert.
TEST(EpDispatcher, HighThroughputDeduplicates) {
  run_ranks(2, [](DistContext& ctx) {
    // 4 tokens, all routed to experts 0 and 1 (both on rank 0), D = 4, K = 2.
    const Routing r = make_routing(ctx.rank(), 4, 4, 2, [](int, int64_t, int64_t j, std::mt19937&) {
      return static_cast<int32_t>(j);
    });
    EpDispatcher ep(ctx.comm(), place_experts(4, 2), {All2AllBackend::kHighThroughput, 16});
    run_one(ep, r);
    EXPECT_EQ(ep.last_dispatch_bytes(), 4 * (2 * 2 + 4) * 4);  // 4 records of 2K + D words
    EXPECT_EQ(ep.last_combine_bytes(), ctx.rank() == 0 ? 2 * 4 * 4 * 4 : 0);
  });
}

// Two dispatchers (two micro-batches) in flight at once keep their own buffers.
TEST(EpDispatcher, TwoMicroBatchesInterleaved) {
  run_ranks(2, [](DistContext& ctx) {
    const ExpertPlacement p = place_experts(8, 2);
    const Routing a = make_routing(ctx.rank(), 5, 8, 2, random_distinct(8));
    const Routing b = make_routing(ctx.rank() + 7, 3, 8, 2, random_distinct(8));
    LocalDispatcher local(8);
    const std::vector<float> want_a = run_one(local, a), want_b = run_one(local, b);
    for (All2AllBackend be : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
      EpDispatcher da(ctx.comm(), p, {be, 8}), db(ctx.comm(), p, {be, 8});
      std::vector<float> out_a(want_a.size(), 0.5f), out_b(want_b.size(), 0.5f);
      da.dispatch_send({a.x.data(), a.ids.data(), a.w.data(), 5, 8, 2, out_a.data()});
      db.dispatch_send({b.x.data(), b.ids.data(), b.w.data(), 3, 8, 2, out_b.data()});
      run_experts_fake(da.dispatch_recv());
      da.combine_send();
      run_experts_fake(db.dispatch_recv());
      db.combine_send();
      db.combine_recv();
      da.combine_recv();
      for (size_t i = 0; i < want_a.size(); ++i) EXPECT_NEAR(out_a[i], want_a[i], 1e-5f);
      for (size_t i = 0; i < want_b.size(); ++i) EXPECT_NEAR(out_b[i], want_b[i], 1e-5f);
    }
  });
}

TEST(EpDispatcher, LowLatencyRefusesMoreThanItsCapacity) {
  std::vector<std::string> errors = run_ranks_collect(2, [](DistContext& ctx) {
    const Routing r = make_routing(ctx.rank(), 9, 4, 1, random_distinct(4));
    EpDispatcher ep(ctx.comm(), place_experts(4, 2), {All2AllBackend::kLowLatency, 8});
    run_one(ep, r);
  });
  EXPECT_NE(errors[0].find("exceed the capacity of 8"), std::string::npos) << errors[0];
}

// A step planned with more tokens than the capacity on some rank runs high_throughput on every
// rank (rank 0 has 9 tokens, rank 1 has 2), and the next small step goes back to low_latency.
TEST(EpDispatcher, LowLatencyPlansLargeStepsAsHighThroughput) {
  run_ranks(2, [](DistContext& ctx) {
    const int64_t n = ctx.rank() == 0 ? 9 : 2;
    const Routing big = make_routing(ctx.rank(), n, 4, 2, random_distinct(4));
    LocalDispatcher local(4);
    const std::vector<float> want = run_one(local, big);
    EpDispatcher ep(ctx.comm(), place_experts(4, 2), {All2AllBackend::kLowLatency, 8});
    ep.plan_step(9);
    EXPECT_EQ(ep.step_backend(), All2AllBackend::kHighThroughput);
    const std::vector<float> got = run_one(ep, big);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i])));
    ep.plan_step(8);
    EXPECT_EQ(ep.step_backend(), All2AllBackend::kLowLatency);
    const Routing small = make_routing(ctx.rank(), 2, 4, 2, random_distinct(4));
    const std::vector<float> want_small = run_one(local, small);
    const std::vector<float> got_small = run_one(ep, small);
    for (size_t i = 0; i < got_small.size(); ++i)
      ASSERT_NEAR(got_small[i], want_small[i], 1e-5f * (1 + std::abs(want_small[i])));
  });
}

// low_latency's buffer for a rank has room for min(K, n_local) rows per token of the step's
// capacity (the planned step's, else max_tokens_per_rank) behind n_local row counts, but only the
// counts and the rows placed travel: 3 tokens × 2 experts of 8 on 2 ranks, D = 4, send
// 2 × 4 count words + 6 rows of 4 words, whatever the capacity.
TEST(EpDispatcher, LowLatencySendsOnlyTheRowsItPlaced) {
  run_ranks(2, [](DistContext& ctx) {
    const Routing r = make_routing(ctx.rank(), 3, 4, 2, random_distinct(8));
    LocalDispatcher local(8);
    const std::vector<float> want = run_one(local, r);
    EpDispatcher ep(ctx.comm(), place_experts(8, 2), {All2AllBackend::kLowLatency, 16});
    for (const int64_t plan : {0, 3}) {
      if (plan) ep.plan_step(plan);
      const std::vector<float> got = run_one(ep, r);
      EXPECT_EQ(ep.last_dispatch_bytes(), (2 * 4 + 6 * 4) * 4) << "plan " << plan;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i])));
    }
  });
}

TEST(EpDispatcher, CallsOutOfTurnFail) {
  run_ranks(1, [](DistContext& ctx) {
    EpDispatcher ep(ctx.comm(), place_experts(4, 1), {});
    EXPECT_ANY_THROW(ep.dispatch_recv());
    EXPECT_ANY_THROW(ep.combine_send());
  });
}

TEST(ExpertPlacement, ContiguousRanges) {
  const ExpertPlacement p = place_experts(64, 4);
  EXPECT_EQ(p.n_local(), 16);
  EXPECT_EQ(p.begin(2), 32);
  EXPECT_EQ(p.end(3), 64);
  EXPECT_EQ(p.owner(15), 0);
  EXPECT_EQ(p.owner(16), 1);
  EXPECT_EQ(p.describe(1), "experts [16, 32) of 64");
}

TEST(ExpertPlacement, BadWorldSizesAreRefused) {
  auto message = [](int64_t e, int n) {
    try {
      place_experts(e, n);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_NE(message(8, 16).find("16 ranks but only 8 experts"), std::string::npos);
  EXPECT_NE(message(8, 3).find("cannot be split evenly over 3 ranks"), std::string::npos);
  EXPECT_NE(message(8, 0).find("world size 0"), std::string::npos);
  EXPECT_NE(message(0, 2).find("needs a MoE model"), std::string::npos);
  EXPECT_THROW(parse_all2all_backend("deepep"), Error);
  EXPECT_EQ(parse_all2all_backend("low_latency"), All2AllBackend::kLowLatency);
}

}  // namespace
}  // namespace duet
