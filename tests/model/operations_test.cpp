// The operation lists a model builds per forward mode, and check_operations: each operation's
// kind and layer, yields numbered by stage, and lists that would overwrite a buffer still needed
// (reordered for an overlap strategy the wrong way) refused with both operations named.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/tiny_models.h"
#include "model/forward.h"
#include "model/model.h"

namespace duet {
namespace {

std::vector<std::string> names(const std::vector<Operation>& ops) {
  std::vector<std::string> out;
  for (const Operation& op : ops) out.push_back(op.name());
  return out;
}

// Index of the operation named `name`.
size_t at(const std::vector<Operation>& ops, const std::string& name) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].name() == name) return i;
  }
  throw std::runtime_error("no operation " + name);
}

// ops with the operation named `name` moved to just before the one named `before`.
std::vector<Operation> moved(std::vector<Operation> ops, const std::string& name,
                             const std::string& before) {
  Operation op = ops[at(ops, name)];
  ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(at(ops, name)));
  ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(at(ops, before)), op);
  return ops;
}

// The message check_operations throws for `ops`, or "" if it accepts them.
std::string refusal(std::vector<Operation> ops) {
  try {
    check_operations(ops);
  } catch (const Error& e) {
    // An invariant check's message: "internal error: check failed at ...: ... (operation list:
    // ...)".
    const std::string what = e.what();
    const size_t from = what.find("operation list:");
    if (from == std::string::npos) return what;
    const bool check = what.rfind("internal error", 0) == 0;
    return what.substr(from, what.size() - from - (check ? 1 : 0));
  }
  return "";
}

// DeepSeek tiny: layer 0 dense, layers 1 and 2 MoE with a shared expert.
TEST(OperationsTest, ListsNameKindAndLayerAndNumberTheStages) {
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir("deepseek_v2"));
  for (ForwardMode mode : kForwardModes) {
    const std::vector<Operation>& ops = model->operations(mode);
    const std::vector<std::string> want{"embed",
                                        "L0.attn",
                                        "L0.mlp",
                                        "L1.attn",
                                        "L1.moe_route",
                                        "L1.dispatch_send",
                                        "L1.yield0",
                                        "L1.shared_experts",
                                        "L1.dispatch_recv",
                                        "L1.experts",
                                        "L1.combine_send",
                                        "L1.yield1",
                                        "L1.combine_recv",
                                        "L2.attn",
                                        "L2.moe_route",
                                        "L2.dispatch_send",
                                        "L2.yield2",
                                        "L2.shared_experts",
                                        "L2.dispatch_recv",
                                        "L2.experts",
                                        "L2.combine_send",
                                        "L2.yield3",
                                        "L2.combine_recv",
                                        "output"};
    EXPECT_EQ(names(ops), want) << forward_mode_name(mode);
    EXPECT_EQ(ops[at(ops, "L2.experts")].kind, OpKind::kExperts);
    EXPECT_EQ(ops[at(ops, "L2.experts")].il, 2);
    EXPECT_EQ(ops[at(ops, "L2.yield3")].stage, 3);
  }
  EXPECT_THROW(model->operations(ForwardMode::kIdle), Error);
}

// Layer 1's operations of deepseek_v2's decode list with the shared experts at `at` (layer 0 is
// dense); the whole list must pass the check.
std::vector<std::string> deepseek_layer1(SharedExpertsAt at) {
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir("deepseek_v2"));
  const std::vector<Operation>& ops = model->operations(ForwardMode::kDecode, at);
  EXPECT_EQ(refusal(ops), "");
  const std::vector<std::string> all = names(ops);
  return std::vector<std::string>(all.begin() + 4, all.begin() + 13);
}

// DBO's lists (seed 000) compute the shared experts while the combine travels.
TEST(OperationsTest, SharedExpertsCanRunWhileTheCombineTravels) {
  EXPECT_EQ(deepseek_layer1(SharedExpertsAt::kCombine),
            (std::vector<std::string>{"L1.moe_route", "L1.dispatch_send", "L1.yield0",
                                      "L1.dispatch_recv", "L1.experts", "L1.combine_send",
                                      "L1.yield1", "L1.shared_experts", "L1.combine_recv"}));
}

// The baseline of every overlap: the shared experts before the dispatch is posted, so that
// nothing computes while either transfer travels.
TEST(OperationsTest, SharedExpertsCanRunBeforeTheDispatch) {
  EXPECT_EQ(deepseek_layer1(SharedExpertsAt::kSerial),
            (std::vector<std::string>{"L1.moe_route", "L1.shared_experts", "L1.dispatch_send",
                                      "L1.yield0", "L1.dispatch_recv", "L1.experts",
                                      "L1.combine_send", "L1.yield1", "L1.combine_recv"}));
}

// One rank: the shared experts inside the experts operation's pool jobs (moe/experts.h), no
// operation of their own.
TEST(OperationsTest, SharedExpertsCanRunInsideTheExperts) {
  EXPECT_EQ(deepseek_layer1(SharedExpertsAt::kExperts),
            (std::vector<std::string>{"L1.moe_route", "L1.dispatch_send", "L1.yield0",
                                      "L1.dispatch_recv", "L1.experts", "L1.combine_send",
                                      "L1.yield1", "L1.combine_recv", "L2.attn"}));
}

TEST(OperationsTest, EveryArchitecturesListsPassTheCheck) {
  for (const char* arch : {"qwen3_moe", "mixtral", "deepseek_v2"}) {
    std::unique_ptr<Model> model = Model::load(test::tiny_model_dir(arch));
    for (ForwardMode mode : kForwardModes) {
      for (SharedExpertsAt at : kSharedExpertsAts) {
        EXPECT_EQ(refusal(model->operations(mode, at)), "")
            << arch << " " << forward_mode_name(mode);
      }
    }
  }
}

TEST(OperationsTest, AnOperationOverwritingWhatALaterOneReadsIsRefused) {
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir("deepseek_v2"));
  const std::vector<Operation>& ops = model->operations(ForwardMode::kDecode);
  // The next layer's attention before this layer's combine has added the experts into x.
  EXPECT_EQ(refusal(moved(ops, "L2.attn", "L1.combine_recv")),
            "operation list: L2.attn writes x, which L1.dispatch_send holds until "
            "L1.combine_recv");
  // The next layer's routing overwrites h while the dispatcher still sends it.
  EXPECT_EQ(refusal(moved(ops, "L2.moe_route", "L1.experts")),
            "operation list: L2.moe_route writes h, which L1.dispatch_send holds until "
            "L1.combine_recv");
  // Shared experts after the attention that overwrote h (and before their own layer's route).
  EXPECT_EQ(refusal(moved(ops, "L1.shared_experts", "L1.moe_route")),
            "operation list: L1.shared_experts reads h written by L1.attn, not by L1.moe_route");
  // Experts before the rows arrived.
  EXPECT_EQ(refusal(moved(ops, "L1.experts", "L1.dispatch_recv")),
            "operation list: L1.experts reads expert_batch, which nothing wrote before it");
  // A combine whose shared experts' output is not there yet.
  EXPECT_EQ(refusal(moved(ops, "L2.combine_recv", "L2.shared_experts")),
            "operation list: L2.combine_recv reads shared_out written by L1.shared_experts, not "
            "by L2.shared_experts");
  std::vector<Operation> no_combine = ops;
  no_combine.pop_back();  // the output head, which would overwrite h first
  no_combine.erase(no_combine.begin() + static_cast<std::ptrdiff_t>(at(ops, "L2.combine_recv")));
  EXPECT_EQ(refusal(no_combine),
            "operation list: L2.dispatch_send holds x until L2.combine_recv, which never runs");
}

}  // namespace
}  // namespace duet
