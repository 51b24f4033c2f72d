// On one rank the shared experts (DeepSeek) run inside the experts' pool jobs, one more group
// after the routed experts, instead of as an operation of their own: the same bits as every
// placement that runs them apart, two fewer pool synchronisations a layer.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/generator.h"
#include "engine/model_runner.h"
#include "engine/tiny_models.h"
#include "moe/local_dispatcher.h"

namespace duet {
namespace {

// Prompts of 1 to 13 tokens (the decode path's few-token products and prefill's blocked ones),
// all prompt logits kept, 6 greedy tokens.
std::vector<GenerateRequest> requests(int64_t n_vocab) {
  std::vector<GenerateRequest> reqs;
  for (int64_t len : {1, 3, 5, 13}) {
    GenerateRequest r;
    for (int64_t i = 0; i < len; ++i)
      r.prompt.push_back(static_cast<int32_t>((37 * i + 11 * len) % n_vocab));
    r.max_tokens = 6;
    r.prompt_logits = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Decode's operation kinds with their time, from a generate() with profile_ops.
OpSeconds decode_ops(const Model& model, ThreadPool& pool, const StepGroup& group) {
  Generator gen(model, pool, KvCacheDtype::kAuto, group);
  gen.profile_ops(true);
  GenerateStats st;
  gen.generate(requests(model.config().n_vocab), &st);
  return st.decode_op_seconds;
}

TEST(SharedExpertsTest, OneRankRunsThemInsideTheExpertsJobsUnlessTold) {
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir("deepseek_v2"));
  ThreadPool pool(2);
  EXPECT_EQ(decode_ops(*model, pool, {}).count("shared_experts"), 0u);
  StepGroup serial;
  serial.shared_experts_at = SharedExpertsAt::kSerial;
  EXPECT_EQ(decode_ops(*model, pool, serial).count("shared_experts"), 1u);
}

// A dispatcher from a factory (expert parallelism) sends the batch's rows elsewhere: the shared
// experts cannot join them there.
TEST(SharedExpertsTest, OnlyTheRunnersOwnLocalDispatchersTakeThemInsideTheExperts) {
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir("deepseek_v2"));
  ThreadPool pool(1);
  ModelRunner own(*model, pool);
  own.set_shared_experts_at(SharedExpertsAt::kExperts);
  const int64_t n_expert = model->config().n_expert;
  ModelRunner made(*model, pool, [&](int) { return std::make_unique<LocalDispatcher>(n_expert); });
  EXPECT_THROW(made.set_shared_experts_at(SharedExpertsAt::kExperts), Error);
  made.set_shared_experts_at(SharedExpertsAt::kCombine);
}

TEST(SharedExpertsTest, InsideTheExpertsJobsTheyGiveTheBitsOfEveryOtherPlacement) {
  for (const char* arch : {"deepseek_v2", "deepseek_v3"}) {
    std::unique_ptr<Model> model = Model::load(test::tiny_model_dir(arch));
    const std::vector<GenerateRequest> reqs = requests(model->config().n_vocab);
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      StepGroup inside;
      inside.shared_experts_at = SharedExpertsAt::kExperts;
      const std::vector<GenerateResult> want =
          Generator(*model, pool, KvCacheDtype::kAuto, inside).generate(reqs);
      for (SharedExpertsAt at :
           {SharedExpertsAt::kSerial, SharedExpertsAt::kDispatch, SharedExpertsAt::kCombine}) {
        StepGroup g;
        g.shared_experts_at = at;
        const std::vector<GenerateResult> got =
            Generator(*model, pool, KvCacheDtype::kAuto, g).generate(reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
          EXPECT_EQ(got[i].tokens, want[i].tokens) << arch << " placement " << static_cast<int>(at);
          EXPECT_EQ(got[i].prompt_logits, want[i].prompt_logits)
              << arch << " placement " << static_cast<int>(at) << ", " << threads << " threads, "
              << reqs[i].prompt.size() << " prompt tokens";
        }
      }
    }
  }
}

}  // namespace
}  // namespace duet
