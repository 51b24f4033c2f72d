#include "engine/step_agreement.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "core/error.h"

namespace duet {

int64_t StepPlan::group_tokens() const {
  int64_t n = 0;
  for (const StepOffer& o : offers) n += o.n_tokens;
  return n;
}

std::string StepPlan::describe() const {
  std::ostringstream s;
  s << forward_mode_name(mode);
  if (!runs()) return s.str();
  s << " padded " << padded_tokens;
  if (micro_batch)
    s << " micro-batch " << micro_batch_split << "|" << padded_tokens - micro_batch_split;
  if (n_steps > 1) s << " x" << n_steps;
  if (dummy) s << " dummy";
  return s.str();
}

namespace {

// Whether one working rank's batch may run as two micro-batches under `policy` (before padding).
bool rank_wants_split(const StepOffer& o, const MicroBatchPolicy& policy) {
  const int64_t threshold =
      o.has_prefill ? policy.prefill_token_threshold : policy.decode_token_threshold;
  return o.can_split && o.n_tokens >= threshold;
}

// plan_step() but for the measured choice's bookkeeping; *candidate: the step was past the
// thresholds.
StepPlan plan_offers(const std::vector<StepOffer>& offers, int rank, const MicroBatchPolicy& policy,
                     SplitTimes* times, bool* candidate) {
  DUET_CHECK(rank >= 0 && rank < static_cast<int>(offers.size()),
             "plan_step: rank " << rank << " of " << offers.size() << " offers");
  StepPlan plan;
  plan.offers = offers;
  int64_t most = 0;
  int64_t fewest_steps = INT64_MAX;
  bool any_prefill = false;
  for (const StepOffer& o : offers) {
    DUET_CHECK(o.n_tokens >= 0 && o.n_steps >= 1,
               "plan_step: an offer of " << o.n_tokens << " tokens, " << o.n_steps << " steps");
    most = std::max(most, o.n_tokens);
    any_prefill |= o.has_prefill && o.n_tokens > 0;
    if (o.n_tokens > 0) fewest_steps = std::min(fewest_steps, o.n_steps);
  }
  if (most == 0) return plan;  // kIdle
  plan.mode = any_prefill ? ForwardMode::kPrefill : ForwardMode::kDecode;
  plan.n_steps = any_prefill ? 1 : fewest_steps;
  plan.dummy = offers[static_cast<size_t>(rank)].n_tokens == 0;
  plan.padded_tokens = most;

  // Micro-batching is all ranks or none (seed 000): every working rank must want it, and after
  // padding to the largest rank every working rank's second micro-batch must hold real tokens.
  // Idle ranks do not veto: they run a dummy pair.
  if (!policy.enabled || most < 2) return plan;
  const int64_t split = (most + 1) / 2;
  for (const StepOffer& o : offers) {
    if (o.n_tokens == 0) continue;
    if (!rank_wants_split(o, policy) || o.n_tokens <= split) return plan;
  }
  *candidate = true;
  if (times && !times->choose(plan.mode, plan.padded_tokens)) return plan;
  plan.micro_batch = true;
  plan.micro_batch_split = split;
  return plan;
}

}  // namespace

StepPlan plan_step(const std::vector<StepOffer>& offers, int rank, const MicroBatchPolicy& policy,
                   SplitTimes* times) {
  if (times) times->record(offers);
  bool candidate = false;
  StepPlan plan = plan_offers(offers, rank, policy, times, &candidate);
  if (times) times->push(plan, candidate);
  return plan;
}

StepPlan agree(Coordinator& coord, const StepOffer& mine, const MicroBatchPolicy& policy,
               SplitTimes* times) {
  constexpr size_t kFields = 5;
  const std::vector<int64_t> all =
      coord.all_gather({mine.n_tokens, mine.has_prefill ? 1 : 0, mine.can_split ? 1 : 0,
                        mine.n_steps, mine.lagged_ns});
  DUET_CHECK(all.size() == kFields * static_cast<size_t>(coord.world_size()),
             "agree: " << all.size() << " values from " << coord.world_size() << " ranks");
  std::vector<StepOffer> offers(static_cast<size_t>(coord.world_size()));
  for (size_t r = 0; r < offers.size(); ++r) {
    const int64_t* o = &all[kFields * r];
    offers[r] = {o[0], o[1] != 0, o[2] != 0, o[3], o[4]};
  }
  return plan_step(offers, coord.rank(), policy, times);
}

}  // namespace duet
