// The one step path stepped on 1, 2 and 4 in-process ranks (a tiny model, experts split over the
// ranks): every rank's plan of every step (mode, padding, dummy batch), the shape each slot's
// dispatcher was told, which ranks ran their batch and which the dummy, and that a rank's logits
// are its batch's — what the rank computes alone with the whole model, to 1e-5.
// With TBO, which micro-batch slot ran what.
#include "engine/step_runner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/inproc_backend.h"
#include "engine/kv_cache.h"
#include "engine/tiny_models.h"
#include "moe/ep_dispatcher.h"
#include "moe/local_dispatcher.h"

namespace duet {
namespace {

// Forwards to an EpDispatcher (on one rank: a LocalDispatcher) and records what the step path
// told it and how many tokens it dispatched per step.
class RecordingDispatcher final : public Dispatcher {
 public:
  explicit RecordingDispatcher(std::unique_ptr<Dispatcher> inner) : inner_(std::move(inner)) {}
  void dispatch_send(const RoutedTokens& t) override {
    if (sent_.empty()) sent_.push_back(0);
    sent_.back() = t.n_tokens;
    inner_->dispatch_send(t);
  }
  ExpertBatch& dispatch_recv() override { return inner_->dispatch_recv(); }
  void combine_send() override { inner_->combine_send(); }
  void combine_recv() override { inner_->combine_recv(); }
  void plan_step(int64_t max_tokens, bool micro_batch) override {
    planned.push_back(max_tokens);
    split.push_back(micro_batch);
    sent_.push_back(-1);
    inner_->plan_step(max_tokens, micro_batch);
  }
  std::vector<int64_t> planned;  // plan_step's arguments, per step
  std::vector<bool> split;
  // Tokens of the last MoE layer's dispatch, per step (-1: none).
  const std::vector<int64_t>& sent() const { return sent_; }

 private:
  std::unique_ptr<Dispatcher> inner_;
  std::vector<int64_t> sent_;
};

// Rank r's batch in step s: `n` tokens of one new sequence (prefill) or n decoding sequences.
struct Batch {
  int64_t n = 0;
  bool prefill = false;
};

class StepRunnerTest : public ::testing::TestWithParam<int> {};

TEST_P(StepRunnerTest, EveryRankRunsTheAgreedPlanOfEveryStep) {
  const int world = GetParam();
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  // Step 0: every rank prefills 3 + r tokens.   Step 1: rank 0 decodes 2 sequences, rank 1 (if
  // any) 1, the others nothing.  Step 2: only the last rank decodes 1.  Step 3: nobody: idle.
  std::vector<std::vector<Batch>> schedule(4, std::vector<Batch>(static_cast<size_t>(world)));
  for (int r = 0; r < world; ++r) {
    schedule[0][static_cast<size_t>(r)] = {3 + r, true};
    schedule[1][static_cast<size_t>(r)] = {r == 0 ? 2 : r == 1 ? 1 : 0, false};
    schedule[2][static_cast<size_t>(r)] = {r == world - 1 ? 1 : 0, false};
  }
  std::mutex mu;
  std::vector<std::vector<std::string>> plans(static_cast<size_t>(world));
  std::vector<std::vector<int64_t>> planned(static_cast<size_t>(world)), sent(plans.size());
  std::vector<std::vector<bool>> got_logits(plans.size());
  std::unique_ptr<Model> whole = Model::load(dir);
  run_ranks(world, [&](DistContext& ctx) {
    const int r = ctx.rank();
    const ExpertPlacement place = place_experts(8, world);
    std::unique_ptr<Model> m = Model::load(dir, LoadOptions{place.begin(r), place.end(r)});
    ThreadPool pool(1);
    RecordingDispatcher* rec = nullptr;
    StepGroup group;
    group.coord = &ctx.coord();
    group.dispatchers = [&](int) {
      std::unique_ptr<Dispatcher> inner;
      if (world == 1) {
        inner = std::make_unique<LocalDispatcher>(8);
      } else {
        inner = std::make_unique<EpDispatcher>(ctx.comm(), place, EpDispatcherOptions{});
      }
      auto d = std::make_unique<RecordingDispatcher>(std::move(inner));
      rec = d.get();
      return d;
    };
    StepRunner steps(*m, pool, group);
    KvCache kv(m->config().n_layer, m->kv_k_width(), m->kv_v_width());
    // The same batches on this rank alone (the whole model, the local dispatcher), for its logits.
    ModelRunner alone(*whole, pool);
    KvCache kv_alone(m->config().n_layer, m->kv_k_width(), m->kv_v_width());
    std::vector<int32_t> seqs;
    std::vector<std::string> my_plans;
    std::vector<bool> my_logits;
    for (const std::vector<Batch>& step : schedule) {
      const Batch b = step[static_cast<size_t>(r)];
      ForwardInput in;
      for (int64_t i = 0; i < (b.prefill ? 1 : b.n); ++i) {
        const int32_t seq = kv.add_sequence();
        ASSERT_EQ(kv_alone.add_sequence(), seq);
        const std::vector<int32_t> toks(static_cast<size_t>(b.prefill ? b.n : 1), 7 + r);
        in.add(seq, 0, toks.data(), static_cast<int64_t>(toks.size()), false);
        kv.reserve(seq, static_cast<int64_t>(toks.size()));
        kv_alone.reserve(seq, static_cast<int64_t>(toks.size()));
      }
      const StepRunner::Launch launch = steps.run(in, kv, b.prefill);
      my_plans.push_back(launch.plan.describe());
      my_logits.push_back(launch.logits != nullptr);
      if (launch.logits) {
        EXPECT_EQ(in.mode, b.prefill ? ForwardMode::kPrefill : ForwardMode::kDecode);
        // A token whose experts sit on two ranks sums their outputs in another order: 1e-5.
        const std::vector<float>& want = alone.forward(in, kv_alone);
        ASSERT_EQ(launch.logits->size(), want.size());
        for (size_t j = 0; j < want.size(); ++j) {
          ASSERT_NEAR((*launch.logits)[j], want[j], 1e-5f * (1.0f + std::fabs(want[j])))
              << "rank " << r << " logit " << j;
        }
      }
    }
    EXPECT_EQ(steps.stats().steps, 3);
    std::lock_guard<std::mutex> lock(mu);
    plans[static_cast<size_t>(r)] = my_plans;
    got_logits[static_cast<size_t>(r)] = my_logits;
    planned[static_cast<size_t>(r)] = rec->planned;
    sent[static_cast<size_t>(r)] = rec->sent();
  });
  const int64_t prefill_max = 3 + world - 1;
  for (int r = 0; r < world; ++r) {
    const size_t i = static_cast<size_t>(r);
    const bool works1 = r <= 1, works2 = r == world - 1;
    const std::vector<std::string> want{"prefill padded " + std::to_string(prefill_max),
                                        "decode padded 2" + std::string(works1 ? "" : " dummy"),
                                        "decode padded 1" + std::string(works2 ? "" : " dummy"),
                                        "idle"};
    EXPECT_EQ(plans[i], want) << "rank " << r << " of " << world;
    EXPECT_EQ(got_logits[i], (std::vector<bool>{true, works1, works2, false})) << "rank " << r;
    // The dispatcher learnt each running step's padded shape; it carried the rank's own tokens
    // or the dummy's one.
    EXPECT_EQ(planned[i], (std::vector<int64_t>{prefill_max, 2, 1})) << "rank " << r;
    const int64_t step1 = r == 0 ? 2 : 1;  // rank 1 decodes 1 sequence; the others' dummy: 1
    EXPECT_EQ(sent[i], (std::vector<int64_t>{3 + r, step1, 1})) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, StepRunnerTest, ::testing::Values(1, 2, 4));

// With TBO on 2 ranks, a step the group agrees to cut runs its halves in slots 0 and 1 (each
// dispatcher sees its half's tokens), an idle rank runs the dummy pair (one token in each slot),
// and a step that cannot be cut runs in slot 0 alone.
TEST(StepRunnerSlotsTest, SplitStepsRunInBothSlots) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  std::mutex mu;
  std::vector<std::vector<std::vector<int64_t>>> sent(2);  // [rank][slot] tokens per step
  run_ranks(2, [&](DistContext& ctx) {
    const int r = ctx.rank();
    const ExpertPlacement place = place_experts(8, 2);
    std::unique_ptr<Model> m = Model::load(dir, LoadOptions{place.begin(r), place.end(r)});
    ThreadPool pool(1);
    RecordingDispatcher* rec[2] = {nullptr, nullptr};
    StepGroup group;
    group.coord = &ctx.coord();
    group.overlap = OverlapMode::kTbo;
    group.micro_batch.decode_token_threshold = 2;
    group.dispatchers = [&](int slot) {
      auto d = std::make_unique<RecordingDispatcher>(
          std::make_unique<EpDispatcher>(ctx.comm(), place, EpDispatcherOptions{}));
      rec[slot] = d.get();
      return d;
    };
    StepRunner steps(*m, pool, group);
    KvCache kv(m->config().n_layer, m->kv_k_width(), m->kv_v_width());
    // Step 0: both ranks decode 4 sequences (split 2|2). Step 1: rank 0 decodes 5, rank 1 none
    // (3|2 beside a dummy pair). Step 2: rank 0 decodes 1 (cannot split: slot 0 only).
    for (int64_t n : {int64_t{4}, r == 0 ? int64_t{5} : 0, r == 0 ? int64_t{1} : 0}) {
      ForwardInput in;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t seq = kv.add_sequence(), tok = 9;
        kv.reserve(seq, 1);
        in.add(seq, 0, &tok, 1, false);
      }
      steps.run(in, kv, false);
    }
    // Both slots' dispatchers were told which steps were split (SBO keeps those unchunked).
    for (RecordingDispatcher* d : rec) EXPECT_EQ(d->split, (std::vector<bool>{true, true, false}));
    std::lock_guard<std::mutex> lock(mu);
    sent[static_cast<size_t>(r)] = {rec[0]->sent(), rec[1]->sent()};
  });
  EXPECT_EQ(sent[0][0], (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(sent[0][1], (std::vector<int64_t>{2, 2, -1}));
  EXPECT_EQ(sent[1][0], (std::vector<int64_t>{2, 1, 1}));  // the dummy pair, then the dummy
  EXPECT_EQ(sent[1][1], (std::vector<int64_t>{2, 1, -1}));
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

// The step gap: from the end of one forward pass to the start of the next, counted between
// consecutive steps only. Two steps 30 ms apart make one gap of at least 30 ms; after idle() (or
// a step with nothing to run) the next step starts no gap.
TEST(StepGapTest, CountsTheTimeBetweenConsecutiveForwardPasses) {
  std::unique_ptr<Model> m = Model::load(test::tiny_model_dir("qwen3_moe"));
  ThreadPool pool(1);
  StepRunner steps(*m, pool);
  KvCache kv(m->config().n_layer, m->kv_k_width(), m->kv_v_width());
  const int32_t seq = kv.add_sequence();
  const std::vector<int32_t> toks = {5, 6, 7, 8};
  auto step = [&](int64_t pos, int64_t n) {
    kv.reserve(seq, pos + n);
    ForwardInput in;
    in.add(seq, pos, toks.data() + pos, n, false);
    return steps.run(in, kv, n > 1);
  };
  step(0, 2);
  EXPECT_EQ(steps.stats().gaps, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  step(2, 1);
  EXPECT_EQ(steps.stats().gaps, 1);
  EXPECT_GE(steps.stats().gap_seconds, 0.030);
  EXPECT_GT(steps.stats().forward_seconds, 0.0);
  steps.idle();
  step(3, 1);
  EXPECT_EQ(steps.stats().gaps, 1);
  ForwardInput empty;
  EXPECT_FALSE(steps.run(empty, kv, false).plan.runs());
  kv.reserve(seq, 5);
  ForwardInput last;
  last.add(seq, 4, toks.data(), 1, false);
  steps.run(last, kv, false);
  EXPECT_EQ(steps.stats().gaps, 1);
  EXPECT_EQ(steps.stats().steps, 4);
}

}  // namespace
}  // namespace duet
