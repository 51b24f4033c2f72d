// Expert parallelism over an fp8 checkpoint (make-model --dtype fp8, the experts' projections in
// E4M3 with 128 x 128 block scales, as DeepSeek-V3 publishes them): each rank loads only its own
// experts' codes and scales, and the greedy tokens are the single rank's, under both all-to-all
// algorithms, with and without the single-batch overlap's chunks.
#include <gtest/gtest.h>

#include <mutex>

#include "dist/inproc_backend.h"
#include "engine/ep_requests.h"
#include "engine/generator.h"
#include "model/make_model.h"
#include "moe/borrowed_dispatcher.h"
#include "moe/ep_dispatcher.h"
#include "tiny_models.h"

namespace duet {
namespace {

struct Fp8EpCase {
  const char* arch;
  int world;
  All2AllBackend backend;
  int chunks = 1;
};

class Fp8EpTest : public ::testing::TestWithParam<Fp8EpCase> {};

TEST_P(Fp8EpTest, ExpertParallelEqualsSingleRank) {
  const Fp8EpCase c = GetParam();
  MakeModelOptions mk;
  mk.dir = test::make_temp_dir("duet-fp8-ep-");
  mk.arch = c.arch;
  mk.dtype = DType::kF8E4M3;
  mk.seed = 11;
  make_model(mk);
  const std::vector<GenerateRequest> reqs = test::ep_requests(5);
  std::vector<std::vector<int32_t>> want;
  int64_t n_expert = 0;
  {
    std::unique_ptr<Model> m = Model::load(mk.dir);
    ASSERT_TRUE(m->config().fp8.enabled);
    n_expert = m->config().n_expert;
    ThreadPool pool(1);
    Generator g(*m, pool);
    for (const GenerateResult& r : g.generate(reqs)) want.push_back(r.tokens);
  }
  std::mutex mu;
  run_ranks(c.world, [&](DistContext& ctx) {
    const ExpertPlacement place = place_experts(n_expert, ctx.world_size());
    std::unique_ptr<Model> m =
        Model::load(mk.dir, LoadOptions{place.begin(ctx.rank()), place.end(ctx.rank())});
    ThreadPool pool(1);
    EpDispatcherOptions opt{c.backend, 64};
    opt.combine_chunks = c.chunks;
    EpDispatcher ep(ctx.comm(), place, opt);
    Generator gen(*m, pool, KvCacheDtype::kAuto, test::borrowing_group(ctx.coord(), ep));
    std::vector<size_t> idx;
    const std::vector<GenerateResult> got =
        gen.generate(test::rank_share(reqs, ctx.rank(), c.world, &idx));
    std::lock_guard<std::mutex> lock(mu);
    for (size_t j = 0; j < idx.size(); ++j) {
      EXPECT_EQ(got[j].tokens, want[idx[j]]) << "rank " << ctx.rank() << " request " << idx[j];
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Archs, Fp8EpTest,
    ::testing::Values(Fp8EpCase{"deepseek_v3", 2, All2AllBackend::kHighThroughput},
                      Fp8EpCase{"deepseek_v3", 4, All2AllBackend::kLowLatency, 2},
                      Fp8EpCase{"qwen3_moe", 2, All2AllBackend::kLowLatency},
                      Fp8EpCase{"mixtral", 2, All2AllBackend::kHighThroughput}),
    [](const ::testing::TestParamInfo<Fp8EpCase>& info) {
      return std::string(info.param.arch) + "_ep" + std::to_string(info.param.world) + "_" +
             all2all_backend_name(info.param.backend) +
             (info.param.chunks > 1 ? "_chunks" + std::to_string(info.param.chunks) : "");
    });

}  // namespace
}  // namespace duet
