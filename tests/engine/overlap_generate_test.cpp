// Two-micro-batch overlap (TBO on one thread, DBO on two) and single-batch overlap (the chunked
// combine, the shared experts beside the dispatch or the combine, the experts whose rows are all
// the rank's own run while the combine travels), alone and together, give the
// plain path's greedy tokens and its logits to 1e-5 on f32 models: every architecture, on one
// rank with micro-batching forced (thresholds of 2 tokens) and on 2 and 4 in-process ranks with
// experts split, both all-to-all algorithms; prefill (the two-chunk split of single prompts),
// decode, an idle rank (dummy pairs) and uneven ranks. bf16 rows stay within their bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/inproc_backend.h"
#include "engine/decisive_prompts.h"
#include "engine/ep_requests.h"
#include "engine/generator.h"
#include "engine/tiny_models.h"
#include "moe/ep_dispatcher.h"

namespace duet {
namespace {

// The decisive prompts of `arch`'s tiny f32 model, with all prompt logits kept, 8 greedy tokens.
std::vector<GenerateRequest> requests(const std::string& arch) {
  std::vector<GenerateRequest> reqs;
  for (std::vector<int32_t>& p : test::decisive_prompts(arch, DType::kF32)) {
    GenerateRequest r;
    r.prompt = std::move(p);
    r.max_tokens = 8;
    r.prompt_logits = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

StepGroup overlap_group(OverlapMode mode) {
  StepGroup g;
  g.overlap = mode;
  g.micro_batch.decode_token_threshold = 2;  // every batch that can split does
  g.micro_batch.prefill_token_threshold = 2;
  return g;
}

void expect_same(const GenerateResult& got, const GenerateResult& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.finish_reason, want.finish_reason) << what;
  ASSERT_EQ(got.prompt_logits.size(), want.prompt_logits.size()) << what;
  for (size_t j = 0; j < want.prompt_logits.size(); ++j) {
    ASSERT_NEAR(got.prompt_logits[j], want.prompt_logits[j],
                1e-5f * (1.0f + std::fabs(want.prompt_logits[j])))
        << what << " logit " << j;
  }
}

struct OverlapCase {
  std::string arch;
  OverlapMode mode;
  // Single-batch overlap: the combine's chunks (low_latency) and where the shared experts run.
  int combine_chunks = 1;
  std::optional<SharedExpertsAt> shared_at;
  bool own_last = false;      // EpDispatcherOptions::own_experts_last
  bool counts_first = false;  // EpDispatcherOptions::own_rows_beside_dispatch
};

std::string case_name(const OverlapCase& c) {
  std::string name = c.arch + "_" + overlap_mode_name(c.mode);
  if (c.combine_chunks > 1) name += "_chunks" + std::to_string(c.combine_chunks);
  if (c.shared_at) {
    name += *c.shared_at == SharedExpertsAt::kCombine  ? "_shared_combine"
            : *c.shared_at == SharedExpertsAt::kSerial ? "_shared_serial"
                                                       : "_shared_dispatch";
  }
  if (c.own_last) name += "_own_last";
  if (c.counts_first) name += "_counts_first";
  return name;
}

class OverlapGenerateTest : public ::testing::TestWithParam<OverlapCase> {
 protected:
  void SetUp() override {
    model_ = Model::load(test::tiny_model_dir(GetParam().arch));
    reqs_ = requests(GetParam().arch);
    ThreadPool pool(2);
    Generator plain(*model_, pool);
    want_ = plain.generate(reqs_);
  }
  std::unique_ptr<Model> model_;
  std::vector<GenerateRequest> reqs_;
  std::vector<GenerateResult> want_;
};

TEST_P(OverlapGenerateTest, OneRankWithMicroBatchingForcedEqualsPlain) {
  if (GetParam().mode == OverlapMode::kNone) GTEST_SKIP() << "no micro-batches on one rank";
  ThreadPool pool(2);
  StepGroup g = overlap_group(GetParam().mode);
  g.shared_experts_at = GetParam().shared_at;
  Generator gen(*model_, pool, KvCacheDtype::kAuto, g);
  GenerateStats st;
  // All requests at once (mixed lengths), then each alone (a single prompt: the two-chunk split).
  const std::vector<GenerateResult> got = gen.generate(reqs_, &st);
  EXPECT_GT(st.steps, 1);
  EXPECT_EQ(st.micro_batch_steps, st.steps);
  for (size_t i = 0; i < reqs_.size(); ++i) expect_same(got[i], want_[i], "batch " + std::to_string(i));
  for (size_t i = 0; i < reqs_.size(); ++i) {
    ThreadPool p1(1);
    Generator plain(*model_, p1);
    const GenerateResult alone = plain.generate({reqs_[i]})[0];
    expect_same(gen.generate({reqs_[i]})[0], alone, "alone " + std::to_string(i));
  }
}

TEST_P(OverlapGenerateTest, ExpertParallelRanksEqualPlain) {
  const std::string dir = test::tiny_model_dir(GetParam().arch);
  for (int world : {2, 4}) {
    for (All2AllBackend backend : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
      std::mutex mu;
      run_ranks(world, [&](DistContext& ctx) {
        const int r = ctx.rank();
        const ExpertPlacement place = place_experts(8, world);
        std::unique_ptr<Model> m = Model::load(dir, LoadOptions{place.begin(r), place.end(r)});
        ThreadPool pool(1);
        StepGroup g = overlap_group(GetParam().mode);
        g.coord = &ctx.coord();
        g.shared_experts_at = GetParam().shared_at;
        Communicator* comm = &ctx.comm();
        EpDispatcherOptions opt{backend, 64};
        opt.combine_chunks = GetParam().combine_chunks;
        opt.own_experts_last = GetParam().own_last;
        opt.own_rows_beside_dispatch = GetParam().counts_first;
        g.dispatchers = [comm, place, opt](int) {
          return std::make_unique<EpDispatcher>(*comm, place, opt);
        };
        Generator gen(*m, pool, KvCacheDtype::kAuto, g);
        // Rank 0 takes requests 0 and 1, rank 1 request 2, the others none (idle: dummy pairs).
        std::vector<size_t> idx;
        if (r == 0) idx = {0, 1};
        if (r == 1) idx = {2};
        std::vector<GenerateRequest> mine;
        for (size_t i : idx) mine.push_back(reqs_[i]);
        GenerateStats st;
        const std::vector<GenerateResult> got = gen.generate(mine, &st);
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_GT(st.steps, 0);
        if (GetParam().mode != OverlapMode::kNone) {
          EXPECT_GT(st.micro_batch_steps, 0) << r;
        }
        for (size_t j = 0; j < idx.size(); ++j) {
          expect_same(got[j], want_[idx[j]],
                      std::to_string(world) + " ranks, rank " + std::to_string(r) + " request " +
                          std::to_string(idx[j]));
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Archs, OverlapGenerateTest,
    ::testing::Values(OverlapCase{"qwen3_moe", OverlapMode::kTbo, 1, std::nullopt},
                      OverlapCase{"qwen3_moe", OverlapMode::kDbo, 1, std::nullopt},
                      OverlapCase{"deepseek_v2", OverlapMode::kTbo, 1, std::nullopt},
                      OverlapCase{"deepseek_v2", OverlapMode::kDbo, 1, std::nullopt},
                      OverlapCase{"mixtral", OverlapMode::kTbo, 1, std::nullopt},
                      OverlapCase{"mixtral", OverlapMode::kDbo, 1, std::nullopt}),
    [](const ::testing::TestParamInfo<OverlapCase>& info) { return case_name(info.param); });

// Single-batch overlap alone (overlap kNone) and inside each micro-batch of TBO and DBO.
INSTANTIATE_TEST_SUITE_P(
    Sbo, OverlapGenerateTest,
    ::testing::Values(
        OverlapCase{"deepseek_v2", OverlapMode::kNone, 2, SharedExpertsAt::kCombine},
        OverlapCase{"deepseek_v2", OverlapMode::kNone, 4, SharedExpertsAt::kDispatch},
        OverlapCase{"deepseek_v2", OverlapMode::kTbo, 2, SharedExpertsAt::kCombine},
        OverlapCase{"deepseek_v2", OverlapMode::kDbo, 3, SharedExpertsAt::kDispatch},
        OverlapCase{"deepseek_v2", OverlapMode::kNone, 1, SharedExpertsAt::kSerial},
        OverlapCase{"deepseek_v2", OverlapMode::kTbo, 1, SharedExpertsAt::kSerial},
        OverlapCase{"qwen3_moe", OverlapMode::kNone, 2, std::nullopt},
        OverlapCase{"qwen3_moe", OverlapMode::kDbo, 4, std::nullopt},
        OverlapCase{"mixtral", OverlapMode::kNone, 4, std::nullopt},
        OverlapCase{"mixtral", OverlapMode::kTbo, 2, std::nullopt},
        // The own experts last (low_latency steps that travel whole).
        OverlapCase{"qwen3_moe", OverlapMode::kNone, 1, std::nullopt, true},
        OverlapCase{"deepseek_v2", OverlapMode::kTbo, 1, SharedExpertsAt::kDispatch, true},
        OverlapCase{"mixtral", OverlapMode::kDbo, 1, std::nullopt, true},
        OverlapCase{"qwen3_moe", OverlapMode::kTbo, 1, std::nullopt, true, true},
        OverlapCase{"deepseek_v2", OverlapMode::kNone, 1, SharedExpertsAt::kDispatch, true, true}),
    [](const ::testing::TestParamInfo<OverlapCase>& info) { return case_name(info.param); });

// bf16 and fp8 rows on 2 and 4 ranks, both algorithms, alone and under TBO: the decisive
// prompts' greedy tokens are the plain path's, and every prompt logit is within the bound of it
// (relative to the row's largest logit). The tiny f32 models measure at most 2.7e-3 with bf16
// rows and 3.3e-2 with fp8 rows (Zen 4); the bounds leave room for other CPUs' numerics.
constexpr float kBf16RowsBound = 1e-2f;
constexpr float kFp8RowsBound = 1e-1f;

// The rows of the dispatch and of the combine.
struct RowsCase {
  RowDtype rows;
  RowDtype back_rows;
};

class Bf16RowsTest : public ::testing::TestWithParam<std::tuple<std::string, RowsCase>> {};

TEST_P(Bf16RowsTest, GreedyTokensEqualAndLogitsWithinTheBound) {
  const std::string arch = std::get<0>(GetParam());
  const RowDtype rows = std::get<1>(GetParam()).rows;
  const RowDtype back_rows = std::get<1>(GetParam()).back_rows;
  const std::string dir = test::tiny_model_dir(arch);
  std::unique_ptr<Model> model = Model::load(dir);
  const std::vector<GenerateRequest> reqs = requests(arch);
  ThreadPool p1(1);
  const std::vector<GenerateResult> want = Generator(*model, p1).generate(reqs);
  const int64_t n_vocab = model->config().n_vocab;
  for (int world : {2, 4}) {
    for (All2AllBackend backend : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
      for (OverlapMode mode : {OverlapMode::kNone, OverlapMode::kTbo}) {
        std::mutex mu;
        float worst = 0;
        run_ranks(world, [&](DistContext& ctx) {
          const int r = ctx.rank();
          const ExpertPlacement place = place_experts(8, world);
          std::unique_ptr<Model> m = Model::load(dir, LoadOptions{place.begin(r), place.end(r)});
          ThreadPool pool(1);
          StepGroup g = overlap_group(mode);
          g.coord = &ctx.coord();
          Communicator* comm = &ctx.comm();
          EpDispatcherOptions opt{backend, 64};
          opt.row_dtype = rows;
          if (back_rows != rows) opt.combine_dtype = back_rows;
          g.dispatchers = [comm, place, opt](int) {
            return std::make_unique<EpDispatcher>(*comm, place, opt);
          };
          std::vector<GenerateRequest> mine;
          if (r == 0) mine = reqs;
          const std::vector<GenerateResult> got = Generator(*m, pool, KvCacheDtype::kAuto, g)
                                                      .generate(mine);
          std::lock_guard<std::mutex> lock(mu);
          for (size_t i = 0; i < got.size(); ++i) {
            EXPECT_EQ(got[i].tokens, want[i].tokens) << world << " ranks, request " << i;
            const std::vector<float>& a = got[i].prompt_logits;
            const std::vector<float>& b = want[i].prompt_logits;
            ASSERT_EQ(a.size(), b.size());
            for (size_t row = 0; row < a.size() / n_vocab; ++row) {
              float scale = 0, err = 0;
              for (int64_t v = 0; v < n_vocab; ++v) {
                scale = std::max(scale, std::fabs(b[row * n_vocab + v]));
                err = std::max(err, std::fabs(a[row * n_vocab + v] - b[row * n_vocab + v]));
              }
              worst = std::max(worst, err / scale);
            }
          }
        });
        const bool fp8 = rows == RowDtype::kFp8 || back_rows == RowDtype::kFp8;
        EXPECT_LE(worst, fp8 ? kFp8RowsBound : kBf16RowsBound)
            << world << " ranks, " << all2all_backend_name(backend);
        EXPECT_GT(worst, 0.0f) << "the rows changed nothing: are they rounded?";
        std::printf(
            "%s/%s rows %s, %d ranks, %s, %s: max logit error %.2e of the row's "
            "largest\n",
            all2all_dtype_name(rows), all2all_dtype_name(back_rows), arch.c_str(), world,
            all2all_backend_name(backend), overlap_mode_name(mode), worst);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Archs, Bf16RowsTest,
    ::testing::Combine(::testing::Values("qwen3_moe", "deepseek_v2", "mixtral"),
                       ::testing::Values(RowsCase{RowDtype::kBF16, RowDtype::kBF16},
                                         RowsCase{RowDtype::kFp8, RowDtype::kFp8},
                                         RowsCase{RowDtype::kFp8, RowDtype::kBF16})),
    [](const ::testing::TestParamInfo<std::tuple<std::string, RowsCase>>& info) {
      const RowsCase& c = std::get<1>(info.param);
      return std::get<0>(info.param) + "_" + all2all_dtype_name(c.rows) +
             (c.back_rows != c.rows ? std::string("_") + all2all_dtype_name(c.back_rows) : "");
    });

// An EpDispatcher of one micro-batch slot that, on the stalling rank, stops answering at its n-th
// dispatch (for 3 s), with the other micro-batch's transfers in flight on the other ranks.
class StallingSlot final : public Dispatcher {
 public:
  StallingSlot(std::unique_ptr<EpDispatcher> inner, DistContext* stalls, int at)
      : inner_(std::move(inner)), stalls_(stalls), at_(at) {}
  void dispatch_send(const RoutedTokens& t) override {
    if (stalls_ && ++calls_ == at_) {
      stop_answering(*stalls_);  // hung, as a stopped process
      std::this_thread::sleep_for(std::chrono::seconds(3));
    }
    inner_->dispatch_send(t);
  }
  ExpertBatch& dispatch_recv() override { return inner_->dispatch_recv(); }
  void combine_send() override { inner_->combine_send(); }
  void combine_recv() override { inner_->combine_recv(); }
  void plan_step(int64_t n, bool micro_batch) override { inner_->plan_step(n, micro_batch); }

 private:
  std::unique_ptr<EpDispatcher> inner_;
  DistContext* stalls_;  // the stalling rank's context, or null
  int at_;
  int calls_ = 0;
};

class OverlapFailureTest : public ::testing::TestWithParam<OverlapMode> {};

// Rank 2 of 4 stops answering in a decode step that runs as two micro-batches: every other rank
// ends with an error naming it within the watchdog time (500 ms here), with both micro-batches'
// transfers posted, and nothing hangs.
TEST_P(OverlapFailureTest, StalledRankStopsTheOthersWithinTheWatchdog) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  const std::vector<GenerateRequest> reqs = test::ep_requests(8);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> failed_after(4, -1);
  std::vector<std::string> errors = run_ranks_collect(
      4,
      [&](DistContext& ctx) {
        const int r = ctx.rank();
        const ExpertPlacement place = place_experts(8, 4);
        std::unique_ptr<Model> m = Model::load(dir, LoadOptions{place.begin(r), place.end(r)});
        ThreadPool pool(1);
        StepGroup g = overlap_group(GetParam());
        g.coord = &ctx.coord();
        Communicator* comm = &ctx.comm();
        DistContext* c = &ctx;
        g.dispatchers = [comm, c, place, r](int slot) {
          // Micro-batch A of rank 2 stalls at its 3rd decode step's first MoE layer.
          return std::make_unique<StallingSlot>(
              std::make_unique<EpDispatcher>(*comm, place, EpDispatcherOptions{}),
              r == 2 && slot == 0 ? c : nullptr, /*at=*/3 * 2 + 1);
        };
        Generator gen(*m, pool, KvCacheDtype::kAuto, g);
        try {
          gen.generate({reqs[static_cast<size_t>(2 * r)], reqs[static_cast<size_t>(2 * r + 1)]});
        } catch (...) {
          failed_after[static_cast<size_t>(r)] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          throw;
        }
      },
      std::chrono::milliseconds(500));
  for (int r : {0, 1, 3}) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank(s) 2"), std::string::npos)
        << errors[static_cast<size_t>(r)];
    EXPECT_GE(failed_after[static_cast<size_t>(r)], 0.0);
    EXPECT_LT(failed_after[static_cast<size_t>(r)], 2.0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, OverlapFailureTest,
                         ::testing::Values(OverlapMode::kTbo, OverlapMode::kDbo),
                         [](const ::testing::TestParamInfo<OverlapMode>& info) {
                           return std::string(overlap_mode_name(info.param));
                         });

}  // namespace
}  // namespace duet
