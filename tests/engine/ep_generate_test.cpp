// Expert parallelism on in-process ranks gives the single-rank greedy tokens, for the three
// architectures, EP = 2 and 4, both all-to-all algorithms: with every rank running the same
// batch (pure EP) and with DP attention (each rank its own requests; idle ranks run dummy
// batches). Each rank loads only its own experts. Also with bf16 KV caches (every rank and the
// reference alike).
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "dist/inproc_backend.h"
#include "engine/generator.h"
#include "moe/borrowed_dispatcher.h"
#include "engine/generator.h"
#include "moe/ep_dispatcher.h"
#include "engine/ep_requests.h"
#include "tiny_models.h"

namespace duet {
namespace {

struct EpCase {
  const char* arch;
  int world;
  All2AllBackend backend;
  KvCacheDtype kv = KvCacheDtype::kAuto;  // the tiny models are f32: auto is f32
};

class EpGenerateTest : public ::testing::TestWithParam<EpCase> {
 protected:
  // The single-rank tokens of every request, and the whole model's weight bytes.
  void reference(const std::vector<GenerateRequest>& reqs) {
    std::unique_ptr<Model> m = Model::load(test::tiny_model_dir(GetParam().arch));
    ThreadPool pool(1);
    Generator g(*m, pool, GetParam().kv);
    for (const GenerateResult& r : g.generate(reqs)) want_.push_back(r.tokens);
    full_bytes_ = m->weight_bytes();
  }

  // Runs the EP group; rank r generates the requests `mine(r)` (indices into reqs) and its
  // tokens are checked against the reference.
  void run_group(const std::vector<GenerateRequest>& reqs,
                 const std::function<std::vector<size_t>(int rank)>& mine) {
    const EpCase c = GetParam();
    const std::string dir = test::tiny_model_dir(c.arch);
    std::mutex mu;
    run_ranks(c.world, [&](DistContext& ctx) {
      const ExpertPlacement place = place_experts(8, ctx.world_size());
      LoadOptions opt{place.begin(ctx.rank()), place.end(ctx.rank())};
      std::unique_ptr<Model> m = Model::load(dir, opt);
      EXPECT_LT(m->weight_bytes(), full_bytes_);  // only this rank's experts are resident
      ThreadPool pool(1);
      EpDispatcher ep(ctx.comm(), place, {c.backend, 64});
      Generator gen(*m, pool, c.kv, test::borrowing_group(ctx.coord(), ep));
      std::vector<GenerateRequest> my_reqs;
      const std::vector<size_t> idx = mine(ctx.rank());
      for (size_t i : idx) my_reqs.push_back(reqs[i]);
      GenerateStats st;
      const std::vector<GenerateResult> got = gen.generate(my_reqs, &st);
      std::lock_guard<std::mutex> lock(mu);
      for (size_t j = 0; j < idx.size(); ++j) {
        EXPECT_FALSE(got[j].tokens.empty());
        EXPECT_EQ(got[j].tokens, want_[idx[j]]) << "rank " << ctx.rank() << " request " << idx[j];
      }
      if (idx.empty()) {
        EXPECT_EQ(st.dummy_steps, st.steps);
      }
    });
  }

  std::vector<std::vector<int32_t>> want_;
  uint64_t full_bytes_ = 0;
};

// Every rank runs all requests: attention replicated, experts split.
TEST_P(EpGenerateTest, PureEpEqualsSingleRank) {
  const std::vector<GenerateRequest> reqs = test::ep_requests(4);
  reference(reqs);
  run_group(reqs, [&](int) {
    std::vector<size_t> all(reqs.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  });
}

// DP attention: request i runs on rank i % world; ranks finish at different steps and then
// run dummy batches until the last one is done.
TEST_P(EpGenerateTest, DpAttentionEqualsSingleRank) {
  const std::vector<GenerateRequest> reqs = test::ep_requests(5);
  reference(reqs);
  const int world = GetParam().world;
  run_group(reqs, [&](int rank) {
    std::vector<size_t> idx;
    for (size_t i = static_cast<size_t>(rank); i < reqs.size(); i += world) idx.push_back(i);
    return idx;
  });
}

// One rank has no requests at all: it runs only dummy batches.
TEST_P(EpGenerateTest, IdleRankRunsDummyBatches) {
  const std::vector<GenerateRequest> reqs = test::ep_requests(3);
  reference(reqs);
  const int world = GetParam().world;
  run_group(reqs, [&](int rank) {
    std::vector<size_t> idx;
    if (rank == world - 1) return idx;
    for (size_t i = static_cast<size_t>(rank); i < reqs.size(); i += world - 1) idx.push_back(i);
    return idx;
  });
}

std::vector<EpCase> all_cases() {
  std::vector<EpCase> cases;
  for (const char* arch : {"qwen3_moe", "deepseek_v2", "deepseek_v3", "mixtral"})
    for (int world : {2, 4})
      for (All2AllBackend b : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency})
        cases.push_back({arch, world, b});
  for (const char* arch : {"qwen3_moe", "deepseek_v2", "mixtral"})
    cases.push_back({arch, 2, All2AllBackend::kHighThroughput, KvCacheDtype::kBf16});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Archs, EpGenerateTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<EpCase>& info) {
                           return std::string(info.param.arch) + "_ep" +
                                  std::to_string(info.param.world) + "_" +
                                  all2all_backend_name(info.param.backend) +
                                  (info.param.kv == KvCacheDtype::kBf16 ? "_kv_bf16" : "");
                         });

// Delegates to an EpDispatcher; on one rank, stops answering at its n-th dispatch (mid-decode).
class StallingDispatcher final : public Dispatcher {
 public:
  StallingDispatcher(EpDispatcher& inner, DistContext* stalls, int at)
      : inner_(inner), stalls_(stalls), at_(at) {}
  void dispatch_send(const RoutedTokens& t) override {
    if (stalls_ && ++calls_ == at_) {
      stop_answering(*stalls_);  // hung, as a stopped process
      std::this_thread::sleep_for(std::chrono::seconds(3));
    }
    inner_.dispatch_send(t);
  }
  ExpertBatch& dispatch_recv() override { return inner_.dispatch_recv(); }
  void combine_send() override { inner_.combine_send(); }
  void combine_recv() override { inner_.combine_recv(); }

 private:
  EpDispatcher& inner_;
  DistContext* stalls_;  // the stalling rank's context, or null
  int at_;
  int calls_ = 0;
};

// Rank 2 of 4 stops answering in the middle of decoding: every other rank ends with an error
// naming it within the watchdog time, long before rank 2 would come back.
TEST(EpFailure, StalledRankStopsTheOthersWithinTheWatchdog) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  const std::vector<GenerateRequest> reqs = test::ep_requests(4);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> failed_after(4, -1);
  std::vector<std::string> errors = run_ranks_collect(
      4,
      [&](DistContext& ctx) {
        const ExpertPlacement place = place_experts(8, 4);
        std::unique_ptr<Model> m =
            Model::load(dir, LoadOptions{place.begin(ctx.rank()), place.end(ctx.rank())});
        ThreadPool pool(1);
        EpDispatcher ep(ctx.comm(), place, {});
        StallingDispatcher d(ep, ctx.rank() == 2 ? &ctx : nullptr, /*at=*/3 * 2 + 1);  // decode step 3
        Generator gen(*m, pool, KvCacheDtype::kAuto, test::borrowing_group(ctx.coord(), d));
        try {
          gen.generate({reqs[static_cast<size_t>(ctx.rank())]});
        } catch (...) {
          failed_after[ctx.rank()] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          throw;
        }
      },
      std::chrono::milliseconds(500));
  for (int r : {0, 1, 3}) {
    EXPECT_NE(errors[r].find("rank(s) 2"), std::string::npos) << errors[r];
    EXPECT_GE(failed_after[r], 0.0);
    EXPECT_LT(failed_after[r], 2.0) << "rank " << r;
  }
}

TEST(EpLoad, ExpertRangeIsValidated) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  EXPECT_THROW(Model::load(dir, LoadOptions{4, 9}), Error);
  EXPECT_THROW(Model::load(dir, LoadOptions{3, 3}), Error);
  std::unique_ptr<Model> m = Model::load(dir, LoadOptions{2, 4});
  EXPECT_EQ(m->expert_begin(), 2);
  EXPECT_EQ(m->expert_end(), 4);
  ThreadPool pool(1);
  EXPECT_THROW({ ModelRunner runner(*m, pool); }, Error);  // a partial model needs an EP dispatcher
}

}  // namespace
}  // namespace duet
