// Expert parallelism over MPI gives the single-rank greedy tokens, for the three architectures
// and both all-to-all algorithms (the in-process twin is tests/engine/ep_generate_test.cpp):
// with every rank running the same batch (pure EP), with DP attention (each rank its own
// requests), and with one rank that has no request and runs only dummy batches. Each rank loads
// only its own experts. And a rank that is busy for longer than the watchdog time in the middle
// of a prefill is waited for. tests/cmake/dist.cmake runs these on 2 and 4 ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/mpi_backend.h"
#include "dist/mpi_ep_util.h"
#include "engine/decisive_prompts.h"
#include "engine/generator.h"
#include "moe/borrowed_dispatcher.h"

namespace duet {
namespace {

struct MpiEpCase {
  const char* arch;
  All2AllBackend backend;
};

class MpiEpGenerate : public ::testing::TestWithParam<MpiEpCase> {
 protected:
  // Rank r generates the requests mine(r, world) (indices into reqs) and checks its tokens
  // against the single-rank ones, which every rank computes itself (milliseconds on the tiny
  // model). Collective.
  void run(const std::vector<GenerateRequest>& reqs,
           const std::function<std::vector<size_t>(int rank, int world)>& mine) {
    const MpiEpCase c = GetParam();
    DistContext ctx = make_mpi_context();
    const std::string dir = test::shared_tiny_model_dir(ctx.coord(), c.arch);
    ThreadPool pool(1);
    std::unique_ptr<Model> whole = Model::load(dir);
    const std::vector<GenerateResult> want = Generator(*whole, pool).generate(reqs);

    test::RankShare share = test::load_rank_share(dir, ctx);
    EXPECT_LT(share.model->weight_bytes(), whole->weight_bytes()) << "rank " << ctx.rank();
    EpDispatcher ep(ctx.comm(), share.place, {c.backend, 64});
    Generator gen(*share.model, pool, KvCacheDtype::kAuto, test::borrowing_group(ctx.coord(), ep));
    const std::vector<size_t> idx = mine(ctx.rank(), ctx.world_size());
    std::vector<GenerateRequest> my_reqs;
    for (size_t i : idx) my_reqs.push_back(reqs[i]);
    GenerateStats st;
    const std::vector<GenerateResult> got = gen.generate(my_reqs, &st);
    ASSERT_EQ(got.size(), idx.size());
    for (size_t j = 0; j < idx.size(); ++j) {
      EXPECT_FALSE(got[j].tokens.empty());
      EXPECT_EQ(got[j].tokens, want[idx[j]].tokens)
          << "rank " << ctx.rank() << " request " << idx[j];
      EXPECT_EQ(got[j].finish_reason, want[idx[j]].finish_reason);
    }
    EXPECT_GT(st.steps, 0);
    if (idx.empty()) {
      EXPECT_EQ(st.dummy_steps, st.steps) << "rank " << ctx.rank();
    }
    // The group's steps are the longest request's: every rank ran each of them.
    const std::vector<int64_t> steps = ctx.coord().all_gather({st.steps});
    for (int64_t s : steps) EXPECT_EQ(s, st.steps);
  }
};

// Every rank runs all requests: attention replicated, experts split.
TEST_P(MpiEpGenerate, PureEpEqualsSingleRank) {
  const std::vector<GenerateRequest> reqs = test::ep_requests(4);
  run(reqs, [&](int, int) {
    std::vector<size_t> all(reqs.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  });
}

// DP attention: request i runs on rank i % world; ranks finish at different steps and then run
// dummy batches until the last one is done.
TEST_P(MpiEpGenerate, DpAttentionEqualsSingleRank) {
  const std::vector<GenerateRequest> reqs = test::ep_requests(5);
  run(reqs, [&](int rank, int world) {
    std::vector<size_t> idx;
    for (size_t i = static_cast<size_t>(rank); i < reqs.size(); i += world) idx.push_back(i);
    return idx;
  });
}

// The last rank has no request at all: it runs only dummy batches.
TEST_P(MpiEpGenerate, IdleRankRunsDummyBatches) {
  const std::vector<GenerateRequest> reqs = test::ep_requests(3);
  run(reqs, [&](int rank, int world) {
    const int n_busy = std::max(1, world - 1);  // ranks with requests
    std::vector<size_t> idx;
    if (rank >= n_busy) return idx;
    for (size_t i = static_cast<size_t>(rank); i < reqs.size(); i += n_busy) idx.push_back(i);
    return idx;
  });
}

std::vector<MpiEpCase> all_cases() {
  std::vector<MpiEpCase> cases;
  for (const char* arch : {"qwen3_moe", "deepseek_v2", "mixtral"})
    for (All2AllBackend b : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency})
      cases.push_back({arch, b});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Archs, MpiEpGenerate, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<MpiEpCase>& info) {
                           return std::string(info.param.arch) + "_" +
                                  all2all_backend_name(info.param.backend);
                         });

// Single-batch overlap over MPI: the chunked combine (low_latency, 4 chunks) with the shared
// experts beside it, under TBO, gives the single-rank tokens and prompt logits to 1e-5 (f32
// tiny DeepSeek model: shared experts, a dense first layer); bf16 rows give the single-rank
// tokens on the decisive prompts and logits within 1e-2 of each row's largest.
TEST(MpiEpSbo, ChunkedCombineAndBf16RowsEqualSingleRank) {
  DistContext ctx = make_mpi_context();
  const std::string dir = test::shared_tiny_model_dir(ctx.coord(), "deepseek_v2");
  std::vector<GenerateRequest> reqs;
  for (std::vector<int32_t>& p : test::decisive_prompts("deepseek_v2", DType::kF32)) {
    GenerateRequest r;
    r.prompt = std::move(p);
    r.max_tokens = 6;
    r.prompt_logits = true;
    reqs.push_back(std::move(r));
  }
  ThreadPool pool(1);
  std::unique_ptr<Model> whole = Model::load(dir);
  const std::vector<GenerateResult> want = Generator(*whole, pool).generate(reqs);
  test::RankShare share = test::load_rank_share(dir, ctx);
  for (const bool bf16 : {false, true}) {
    EpDispatcherOptions opt{All2AllBackend::kLowLatency, 64};
    opt.combine_chunks = 4;
    if (bf16) opt.row_dtype = RowDtype::kBF16;
    StepGroup g;
    g.coord = &ctx.coord();
    Communicator* comm = &ctx.comm();
    const ExpertPlacement place = share.place;
    g.dispatchers = [comm, place, opt](int) {
      return std::make_unique<EpDispatcher>(*comm, place, opt);
    };
    g.overlap = OverlapMode::kTbo;
    g.micro_batch.decode_token_threshold = 2;
    g.micro_batch.prefill_token_threshold = 2;
    g.shared_experts_at = SharedExpertsAt::kCombine;
    // Rank 0 runs every request; the others run dummy batches beside it.
    const std::vector<GenerateResult> got =
        Generator(*share.model, pool, KvCacheDtype::kAuto, g)
            .generate(ctx.rank() == 0 ? reqs : std::vector<GenerateRequest>{});
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << (bf16 ? "bf16" : "f32") << " request " << i;
      const std::vector<float>& a = got[i].prompt_logits;
      const std::vector<float>& b = want[i].prompt_logits;
      ASSERT_EQ(a.size(), b.size());
      float scale = 0;
      for (float v : b) scale = std::max(scale, std::fabs(v));
      for (size_t j = 0; j < a.size(); ++j) {
        ASSERT_NEAR(a[j], b[j], bf16 ? 1e-2f * scale : 1e-5f * (1 + std::fabs(b[j])))
            << (bf16 ? "bf16" : "f32") << " request " << i << " logit " << j;
      }
    }
  }
}

// Rank 1 is busy for 2.5 watchdog times in the middle of the prefill (before its first
// dispatch, as a long prompt would keep it): the others wait at that layer's all-to-all, past
// the watchdog and the handle's backstop (watchdog + 1 s), and the tokens still equal the
// single-rank ones.
TEST(MpiEpBusy, SlowPrefillIsWaitedFor) {
  const std::chrono::milliseconds watchdog(1000);
  const std::chrono::milliseconds busy(2500);
  DistContext ctx = make_mpi_context(watchdog);
  const std::string dir = test::shared_tiny_model_dir(ctx.coord(), "qwen3_moe");
  const std::vector<GenerateRequest> reqs = test::ep_requests(1);
  ThreadPool pool(1);
  std::unique_ptr<Model> whole = Model::load(dir);
  const std::vector<GenerateResult> want = Generator(*whole, pool).generate(reqs);
  test::RankShare share = test::load_rank_share(dir, ctx);
  EpDispatcher ep(ctx.comm(), share.place, {});
  test::HookedDispatcher d(ep, ctx.rank() == 1 ? 1 : 0, [&] { std::this_thread::sleep_for(busy); });
  Generator gen(*share.model, pool, KvCacheDtype::kAuto, test::borrowing_group(ctx.coord(), d));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<GenerateResult> got = gen.generate(reqs);
  const double s = test::seconds_since(t0);
  std::printf("rank %d: generate took %.2f s with rank 1 busy for %.2f s\n", ctx.rank(), s,
              busy.count() / 1000.0);
  std::fflush(stdout);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tokens, want[0].tokens);
  EXPECT_GT(s, busy.count() / 1000.0);
}

}  // namespace
}  // namespace duet
