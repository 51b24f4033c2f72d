// The "agree" phase of a step (DESIGN §3, step 2): before every forward pass all ranks of a
// data-parallel group say what they hold, and each derives the same plan from the same offers —
// the group's forward mode, whether this rank runs a dummy batch, the token count every rank pads
// to, and whether the step runs as two micro-batches (seed 000: uniform across ranks, or none).
// A single rank is a group of one: the same function plans its steps with no message.
//
// The plan is a pure function of the offers (plan_step), so it is tested without ranks; agree()
// is the collective around it: one all-gather of five integers per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/coordinator.h"
#include "engine/split_timing.h"
#include "model/forward.h"

namespace duet {

// What one rank holds before a step.
struct StepOffer {
  int64_t n_tokens = 0;      // tokens of its batch; 0: nothing to run
  bool has_prefill = false;  // some sequence processes prompt tokens (prefill or mixed batch)
  // Its batch can be cut into two non-empty micro-batches (two sequences or more, or a prompt
  // the two-chunk split may cut). Ignored for an idle rank, which can always run a dummy pair.
  bool can_split = false;
  // Multi-step (--num-scheduler-steps): how many decode steps this batch could run in one go
  // (its KV rows reserved ahead). The group runs the fewest any working rank offers, and 1 once
  // any rank prefills; an idle rank's offer does not count (it runs its dummy batch as often).
  int64_t n_steps = 1;
  // The measured split choice (SplitTimes): this rank's forward time per step, in ns, of the
  // running plan SplitTimes::kLag agreements back; -1: none (not timed, or not finished).
  int64_t lagged_ns = -1;
};

// When a step runs as two micro-batches (vLLM's DBO thresholds; SGLang's TBO uses the same
// decision with its own split). Off unless enabled.
struct MicroBatchPolicy {
  bool enabled = false;
  int64_t decode_token_threshold = 32;    // --dbo-decode-token-threshold: decode-only steps
  int64_t prefill_token_threshold = 512;  // --dbo-prefill-token-threshold: steps with a prefill
  // --dbo-split auto (the command line's default): past the thresholds, split a step only when
  // steps like it have run faster split than whole (SplitTimes, kept by the step path). false:
  // whenever past them, as vLLM does.
  bool measured = false;
};

struct StepPlan {
  // Prefill as soon as any rank prefills (SGLang's DP-attention agreement on the forward mode), so
  // every rank runs the same operation list. kIdle: no rank has work; the group stops or waits.
  ForwardMode mode = ForwardMode::kIdle;
  bool dummy = false;  // this rank has no tokens and runs the dummy batch
  // Tokens every rank's batch is padded to: the largest rank's (1 for the dummy batch at least).
  int64_t padded_tokens = 0;
  // All ranks split their step into two micro-batches; false on every rank otherwise.
  bool micro_batch = false;
  // Tokens of micro-batch A of the padded batch when micro_batch: padded_tokens / 2, rounded
  // up; B takes the rest. A rank whose real tokens would leave B empty vetoes the split.
  int64_t micro_batch_split = 0;
  // Decode steps every rank runs with this plan before the next agreement (multi-step); 1 for
  // prefill.
  int64_t n_steps = 1;
  // The plan's number among the group's running plans, from 0, when the split is chosen by
  // measurement (SplitTimes numbers them); -1 otherwise.
  int64_t index = -1;
  std::vector<StepOffer> offers;  // every rank's offer, in rank order

  bool runs() const { return mode != ForwardMode::kIdle; }
  int64_t group_tokens() const;  // real tokens over all ranks
  std::string describe() const;  // "decode padded 8 micro-batch 4|4 dummy", for logs and tests
};

// The plan of `rank` from every rank's offer. Pure: every rank computes the same plan (but for
// `dummy`) from the same offers. With `times` (--dbo-split auto), a step past the thresholds is
// split as times->choose() says, and the table learns from the offers and the plan; every rank
// must pass its own table, which then stays the same on every rank.
StepPlan plan_step(const std::vector<StepOffer>& offers, int rank, const MicroBatchPolicy& policy,
                   SplitTimes* times = nullptr);

// Collective: shares `mine` with every rank of `coord`'s group and plans the step. Throws
// duet::Error as the coordinator does when a rank is missing.
StepPlan agree(Coordinator& coord, const StepOffer& mine, const MicroBatchPolicy& policy,
               SplitTimes* times = nullptr);

// The coordinator of a group of one: the calls return at once (a single rank plans its steps
// through the same agree()).
class SoloCoordinator : public Coordinator {
 public:
  SoloCoordinator() : Coordinator(RankInfo{}) {}
  void broadcast(std::string&, int) override {}
  void barrier() override {}
  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override { return values; }
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override { return {bytes}; }
};

}  // namespace duet
