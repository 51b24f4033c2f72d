// The measured split choice (--dbo-split auto): SplitTimes learns from the step times the offers
// carry kLag agreements late which of split and whole runs faster for each kind of step, keeps
// choosing it, re-tries the other every kExploreEvery-th time, and stays the same on every rank.
#include "engine/split_timing.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/inproc_backend.h"
#include "engine/kv_cache.h"
#include "engine/step_agreement.h"
#include "engine/step_runner.h"
#include "engine/tiny_models.h"
#include "moe/ep_dispatcher.h"

namespace duet {
namespace {

TEST(SplitTimesTest, BucketsAreHalfOctaves) {
  const std::vector<std::pair<int64_t, int>> want = {{1, 0},   {2, 2},   {3, 3},   {4, 4},
                                                     {5, 4},   {6, 5},   {8, 6},   {32, 10},
                                                     {45, 10}, {46, 11}, {64, 12}, {4096, 24}};
  for (const auto& [n, b] : want) EXPECT_EQ(SplitTimes::bucket(n), b) << n;
}

MicroBatchPolicy measured_policy() {
  MicroBatchPolicy p;
  p.enabled = true;
  p.decode_token_threshold = 8;
  p.measured = true;
  return p;
}

// A rank (or `ranks` alike) stepping through batches where a split step takes split_ns and a
// whole one whole_ns, offering each step's time kLag plans later as the step runner does.
struct Sim {
  SplitTimes times;
  std::vector<bool> split;  // every plan's micro_batch, by index

  // `steps` decode steps of `tokens`; returns their micro_batch flags.
  std::vector<bool> run(int64_t tokens, int steps, int64_t split_ns, int64_t whole_ns,
                        int ranks = 1) {
    std::vector<bool> got;
    for (int s = 0; s < steps; ++s) {
      StepOffer o{tokens, false, true};
      const int64_t back = times.plans() - SplitTimes::kLag;
      if (back >= 0) o.lagged_ns = split[static_cast<size_t>(back)] ? split_ns : whole_ns;
      const StepPlan p = plan_step(std::vector<StepOffer>(static_cast<size_t>(ranks), o), 0,
                                   measured_policy(), &times);
      EXPECT_EQ(p.index, static_cast<int64_t>(split.size()));
      split.push_back(p.micro_batch);
      got.push_back(p.micro_batch);
    }
    return got;
  }
};

int count(const std::vector<bool>& v, size_t from = 0) {
  int n = 0;
  for (size_t i = from; i < v.size(); ++i) n += v[i];
  return n;
}

TEST(SplitTimesTest, KeepsTheFasterAndRetriesTheOtherTwiceIn32) {
  // Decisions 9 to 200 (steps 8 to 199): the re-tries are decisions 32, 33, 64, 65, ..., 193.
  {
    Sim sim;  // split slower (the fast link): whole, but for the re-tries
    const std::vector<bool> split = sim.run(64, 200, 1'500'000, 1'000'000, 2);
    EXPECT_TRUE(split[0]) << "the first candidate is split";
    EXPECT_EQ(count(split, 8), 12) << sim.times.describe();
  }
  {
    Sim sim;  // split faster (the slow link): split, but for the re-tries
    const std::vector<bool> split = sim.run(64, 200, 700'000, 1'000'000);
    EXPECT_EQ(192 - count(split, 8), 12) << sim.times.describe();
    EXPECT_NE(sim.times.describe().find("decode 64-90: whole 15625 ns/token"), std::string::npos)
        << sim.times.describe();
  }
}

TEST(SplitTimesTest, EachKindOfStepLearnsApart) {
  Sim sim;
  EXPECT_EQ(count(sim.run(64, 100, 1'500'000, 1'000'000), 8), 6);  // 32, 33, 64, ...: whole wins
  // decode 16 (another bucket) starts over: its first candidates are split, while split is
  // slower at 64.
  EXPECT_EQ(sim.run(16, 2, 1'500'000, 1'000'000), std::vector<bool>({true, true}));
  // Below the threshold nothing is a candidate, and nothing is learnt.
  EXPECT_EQ(count(sim.run(6, 10, 1, 2)), 0);
  const std::string before = sim.times.describe();
  EXPECT_EQ(count(sim.run(6, 10, 1, 2)), 0);
  EXPECT_EQ(sim.times.describe(), before);
}

TEST(SplitTimesTest, AStepWithoutEveryRanksTimeTeachesNothing) {
  SplitTimes times;
  StepOffer timed{64, false, true};
  StepOffer untimed{64, false, true};
  for (int s = 0; s < 10; ++s) {
    timed.lagged_ns = s >= SplitTimes::kLag ? 1000 : -1;
    plan_step({timed, untimed}, 0, measured_policy(), &times);
  }
  EXPECT_EQ(times.describe(), "decode 64-90: whole 0 ns/token (0), split 0 (0)\n");
}

TEST(SplitTimesTest, IdlePlansAreNotNumbered) {
  SplitTimes times;
  plan_step({StepOffer{}}, 0, measured_policy(), &times);
  EXPECT_EQ(times.plans(), 0);
  plan_step({StepOffer{4, false, true}}, 0, measured_policy(), &times);
  EXPECT_EQ(times.plans(), 1);
}

// Ranks whose step times differ (each offers its own) still take the same decision at every step:
// the time learnt is the mean the all-gather brings to every rank alike.
TEST(SplitTimesTest, RanksDecideAlikeThroughTheAgreement) {
  constexpr int kRanks = 3;
  constexpr int kSteps = 120;
  std::mutex mu;
  std::vector<std::vector<bool>> seen(kRanks);
  run_ranks(kRanks, [&](DistContext& ctx) {
    const int r = ctx.rank();
    SplitTimes times;
    std::vector<bool> split;
    for (int s = 0; s < kSteps; ++s) {
      // Rank r's batch shrinks over time (several buckets); its split steps take longer than
      // whole ones on rank 0 only, so the mean decides.
      StepOffer o{s < 60 ? 64 : 20, false, true};
      const int64_t back = times.plans() - SplitTimes::kLag;
      if (back >= 0) {
        const bool was_split = split[static_cast<size_t>(back)];
        o.lagged_ns = was_split ? (r == 0 ? 3'000'000 : 900'000) + 1000 * r : 1'000'000;
      }
      const StepPlan p = agree(ctx.coord(), o, measured_policy(), &times);
      split.push_back(p.micro_batch);
    }
    std::lock_guard<std::mutex> lock(mu);
    seen[static_cast<size_t>(r)] = split;
  });
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], seen[0]) << r;
  // Mean split time (3.0 + 0.901 + 0.902) / 3 ms > 1 ms: whole wins after the first few.
  EXPECT_LE(count(seen[0], 10), 6);
}

// Forwards to an EpDispatcher and sleeps in dispatch_recv for fixed_us plus per_token_us for each
// token this slot dispatched: a link that makes split or whole steps slower, as a test wants.
class DelayingDispatcher final : public Dispatcher {
 public:
  DelayingDispatcher(std::unique_ptr<Dispatcher> inner, int64_t fixed_us, int64_t per_token_us)
      : inner_(std::move(inner)), fixed_us_(fixed_us), per_token_us_(per_token_us) {}
  void dispatch_send(const RoutedTokens& t) override {
    tokens_ = t.n_tokens;
    inner_->dispatch_send(t);
  }
  ExpertBatch& dispatch_recv() override {
    std::this_thread::sleep_for(std::chrono::microseconds(fixed_us_ + per_token_us_ * tokens_));
    return inner_->dispatch_recv();
  }
  void combine_send() override { inner_->combine_send(); }
  void combine_recv() override { inner_->combine_recv(); }
  void plan_step(int64_t max_tokens, bool micro_batch) override {
    inner_->plan_step(max_tokens, micro_batch);
  }

 private:
  std::unique_ptr<Dispatcher> inner_;
  int64_t fixed_us_, per_token_us_;
  int64_t tokens_ = 0;
};

struct Delays {
  int64_t fixed_us[2];  // by micro-batch slot
  int64_t per_token_us[2];
};

// 40 decode steps of 8 sequences on 2 in-process ranks with `mode` and --dbo-split auto, the
// dispatchers delayed as `d` says: how many steps each rank ran split.
std::vector<int64_t> split_steps(OverlapMode mode, const Delays& d) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  std::vector<int64_t> got(2);
  run_ranks(2, [&](DistContext& ctx) {
    const int r = ctx.rank();
    const ExpertPlacement place = place_experts(8, 2);
    std::unique_ptr<Model> m = Model::load(dir, LoadOptions{place.begin(r), place.end(r)});
    ThreadPool pool(1);
    StepGroup group;
    group.coord = &ctx.coord();
    group.overlap = mode;
    group.micro_batch.decode_token_threshold = 2;
    group.micro_batch.measured = true;
    group.dispatchers = [&](int slot) {
      return std::make_unique<DelayingDispatcher>(
          std::make_unique<EpDispatcher>(ctx.comm(), place, EpDispatcherOptions{}),
          d.fixed_us[slot], d.per_token_us[slot]);
    };
    StepRunner steps(*m, pool, group);
    KvCache kv(m->config().n_layer, m->kv_k_width(), m->kv_v_width());
    std::vector<int32_t> seqs;
    for (int i = 0; i < 8; ++i) {
      seqs.push_back(kv.add_sequence());
      kv.reserve(seqs.back(), 40);
    }
    for (int s = 0; s < 40; ++s) {
      ForwardInput in;
      for (int i = 0; i < 8; ++i) {
        const int32_t tok = 9 + i;
        in.add(seqs[static_cast<size_t>(i)], s, &tok, 1, false);
      }
      steps.run(in, kv, false);
    }
    got[static_cast<size_t>(r)] = steps.stats().micro_batch_steps;
  });
  return got;
}

// With the split's second slot slow (a split step waits 20 ms more per layer), auto keeps steps
// whole after timing each twice: steps 0 and 1 split (their times arrive kLag = 2 steps late),
// then whole, but for the re-try at the 32nd and 33rd decisions. With the first slot slow per
// token (a whole step's 8 tokens wait twice as long as a half's 4: 40 ms per layer against 20, so
// that a loaded machine's hiccups of a few ms do not swap them), auto keeps splitting: steps 0
// and 1 split, 2 to 4 whole (until two whole times have arrived), then split but for the re-try.
TEST(SplitTimesTest, AStepRunnerLearnsWhichRunsFaster) {
  for (OverlapMode mode : {OverlapMode::kTbo, OverlapMode::kDbo}) {
    const std::vector<int64_t> slow_split = split_steps(mode, {{0, 20000}, {0, 0}});
    EXPECT_EQ(slow_split[0], 4) << overlap_mode_name(mode);
    EXPECT_EQ(slow_split[1], slow_split[0]);
    const std::vector<int64_t> slow_whole = split_steps(mode, {{0, 0}, {5000, 0}});
    EXPECT_EQ(slow_whole[0], 40 - 5) << overlap_mode_name(mode);
    EXPECT_EQ(slow_whole[1], slow_whole[0]);
  }
}

}  // namespace
}  // namespace duet
