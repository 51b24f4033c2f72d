#include "moe/local_dispatcher.h"

#include <gtest/gtest.h>

#include <vector>

#include "moe/fake_experts.h"

namespace duet {
namespace {

// 3 tokens, hidden 2, top-2 over 4 experts; "experts" multiply by (expert id + 1).
TEST(LocalDispatcherTest, GathersByExpertAndCombinesWeighted) {
  const std::vector<float> x = {1, 2, /**/ 3, 4, /**/ 5, 6};
  const std::vector<int32_t> ids = {2, 0, /**/ 2, 3, /**/ 0, 2};
  const std::vector<float> w = {0.5f, 0.25f, /**/ 1.0f, 2.0f, /**/ 0.1f, 0.2f};
  LocalDispatcher d(4);
  std::vector<float> out(6, 1.0f);
  d.dispatch_send({x.data(), ids.data(), w.data(), 3, 2, 2, out.data()});
  ExpertBatch& b = d.dispatch_recv();
  ASSERT_EQ(b.offsets, (std::vector<int64_t>{0, 2, 2, 5, 6}));  // expert 1 gets nothing
  // Expert 0's rows in token order, read in place: token 0, token 2.
  EXPECT_EQ(b.x[0], x.data());
  EXPECT_EQ(b.x[1], x.data() + 4);
  // Rows of one token share its row of the output, which the experts add to in place.
  EXPECT_EQ(b.out[0], out.data());  // token 0's experts 0 and 2
  EXPECT_EQ(b.out[2], out.data());
  EXPECT_TRUE(b.clear.empty());
  EXPECT_EQ(b.weight[0], 0.25f);
  run_fake_experts(b, [](int64_t e, float v) { return v * float(e + 1); });
  d.combine_send();
  d.combine_recv();
  // token 0: 1 + 0.5*3*x + 0.25*1*x = 1 + 1.75 x
  EXPECT_FLOAT_EQ(out[0], 1 + 1.75f * 1);
  EXPECT_FLOAT_EQ(out[1], 1 + 1.75f * 2);
  // token 1: 1 + 1.0*3*x + 2.0*4*x = 1 + 11 x
  EXPECT_FLOAT_EQ(out[2], 1 + 11.0f * 3);
  // token 2: 1 + 0.1*1*x + 0.2*3*x = 1 + 0.7 x
  EXPECT_FLOAT_EQ(out[5], 1 + 0.7f * 6);
}

TEST(LocalDispatcherTest, AllTokensToOneExpert) {
  const std::vector<float> x = {1, 2, 3};
  const std::vector<int32_t> ids = {1, 1, 1};
  const std::vector<float> w = {1, 1, 1};
  LocalDispatcher d(3);
  std::vector<float> out(3, 0.0f);
  d.dispatch_send({x.data(), ids.data(), w.data(), 3, 1, 1, out.data()});
  ExpertBatch& b = d.dispatch_recv();
  EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 0, 3, 3}));
  run_fake_experts(b, [](int64_t, float v) { return v; });
  d.combine_send();
  d.combine_recv();
  EXPECT_EQ(out, x);
}

}  // namespace
}  // namespace duet
