#include "engine/step_runner.h"

#include <chrono>

#include "core/error.h"

namespace duet {

StepRunner::StepRunner(const Model& model, ThreadPool& pool, const StepGroup& group)
    : solo_(group.coord ? nullptr : std::make_unique<SoloCoordinator>()),
      coord_(group.coord ? group.coord : solo_.get()),
      policy_(group.micro_batch),
      runner_(model, pool, group.dispatchers),
      dummy_kv_(model.config().n_layer, model.kv_k_width(), model.kv_v_width(), DType::kF32) {
  const int32_t seq = dummy_kv_.add_sequence();
  dummy_kv_.reserve(seq, 1);
  const int32_t tok = 0;
  dummy_in_.add(seq, 0, &tok, 1, /*all_logits=*/false);
  dummy_in_.out_rows.clear();  // nobody reads its logits
}

bool StepRunner::can_split(const ForwardInput& in, bool has_prefill) {
  return in.spans.size() >= 2 || (has_prefill && in.n_tokens() >= 2);
}

void StepRunner::run_dummy(ForwardMode mode) {
  dummy_in_.mode = mode;
  runner_.forward(dummy_in_, dummy_kv_);
}

StepRunner::Launch StepRunner::run(ForwardInput& in, KvStore& kv, bool has_prefill) {
  using Clock = std::chrono::steady_clock;
  const StepOffer mine{in.n_tokens(), has_prefill && in.n_tokens() > 0, can_split(in, has_prefill)};
  const Clock::time_point t0 = Clock::now();
  Launch launch{agree(*coord_, mine, policy_)};
  stats_.agree_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  const StepPlan& plan = launch.plan;
  if (!plan.runs()) return launch;
  ++stats_.steps;
  // The step's shape, the same on every rank: a distributed dispatcher picks its algorithm.
  for (int s = 0; s < runner_.n_slots(); ++s) runner_.dispatcher(s).plan_step(plan.padded_tokens);
  if (plan.dummy) {
    ++stats_.dummy_steps;
    run_dummy(plan.mode);
    return launch;
  }
  in.mode = plan.mode;
  launch.logits = &runner_.forward(in, kv);
  return launch;
}

}  // namespace duet
