#include "engine/step_runner.h"

#include <chrono>
#include <exception>

#include "core/error.h"

namespace duet {

namespace {

MicroBatchPolicy policy_of(const StepGroup& group) {
  MicroBatchPolicy p = group.micro_batch;
  p.enabled = group.overlap != OverlapMode::kNone;
  return p;
}

}  // namespace

StepRunner::StepRunner(const Model& model, ThreadPool& pool, const StepGroup& group)
    : solo_(group.coord ? nullptr : std::make_unique<SoloCoordinator>()),
      coord_(group.coord ? group.coord : solo_.get()),
      overlap_(group.overlap),
      policy_(policy_of(group)),
      distribution_threshold_(group.tbo_distribution_threshold),
      runner_(model, pool, group.dispatchers, group.overlap == OverlapMode::kNone ? 1 : 2),
      dummy_kv_(model.config().n_layer, model.kv_k_width(), model.kv_v_width(), DType::kF32),
      trace_(group.trace) {
  if (policy_.enabled && policy_.measured) split_times_.emplace();
  runner_.set_trace(group.trace);
  runner_.set_shared_experts_at(group.shared_experts_at);
  const int32_t tok = 0;
  for (ForwardInput& dummy : dummy_in_) {
    const int32_t seq = dummy_kv_.add_sequence();
    dummy_kv_.reserve(seq, 1);
    dummy.add(seq, 0, &tok, 1, /*all_logits=*/false);
    dummy.out_rows.clear();  // nobody reads its logits
  }
}

void StepRunner::run_dummy(ForwardMode mode, bool pair) {
  dummy_in_[0].mode = dummy_in_[1].mode = mode;
  if (pair) {
    runner_.forward_overlapped(dummy_in_[0], dummy_in_[1], dummy_kv_, overlap_);
  } else {
    runner_.forward(dummy_in_[0], dummy_kv_);
  }
}

StepRunner::Launch StepRunner::run(ForwardInput& in, KvStore& kv, bool has_prefill) {
  const StepPlan plan = agree_step(in, has_prefill);
  if (!plan.runs()) return Launch{plan};
  return execute(plan, in, kv);
}

StepPlan StepRunner::agree_step(const ForwardInput& in, bool has_prefill, int64_t n_steps) {
  using Clock = std::chrono::steady_clock;
  StepOffer mine{in.n_tokens(), has_prefill && in.n_tokens() > 0,
                 in.n_tokens() > 0 && can_split_batch(in), n_steps};
  SplitTimes* times = split_times_ ? &*split_times_ : nullptr;
  if (times) mine.lagged_ns = plan_time(times->plans() - SplitTimes::kLag);
  const Clock::time_point t0 = Clock::now();
  StepPlan plan = agree(*coord_, mine, policy_, times);
  const Clock::time_point t_agreed = Clock::now();
  agree_seconds_ += std::chrono::duration<double>(t_agreed - t0).count();
  if (trace_) trace_->span(TraceTrack::kStep, "agree", t0, t_agreed);
  if (!plan.runs()) idle();
  return plan;
}

StepRunner::Launch StepRunner::execute(const StepPlan& plan, ForwardInput& in, KvStore& kv) {
  using Clock = std::chrono::steady_clock;
  DUET_CHECK(plan.runs(), "execute() of a plan that does not run");
  Launch launch{plan};
  if (idle_.exchange(false, std::memory_order_relaxed)) last_forward_end_ = {};
  // The step's span, from the agreement's end to the forward pass's, named by its plan.
  struct StepSpan {
    Trace* trace;
    const StepPlan& plan;
    Clock::time_point t0;
    ~StepSpan() {
      if (trace) trace->span(TraceTrack::kStep, "step: " + plan.describe(), t0, Clock::now());
    }
  } step_span{trace_, plan, Clock::now()};
  ++stats_.steps;
  // The step's shape, the same on every rank: a distributed dispatcher picks its algorithm.
  for (int s = 0; s < runner_.n_slots(); ++s)
    runner_.dispatcher(s).plan_step(plan.padded_tokens, plan.micro_batch);
  stats_.micro_batch_steps += plan.micro_batch;
  // The step gap and the forward pass's time, from here (the forward pass starts) to its end.
  // With the measured split choice, the plan's time too.
  struct ForwardSpan {
    StepRunner& runner;
    int64_t plan_index;
    Clock::time_point t0 = Clock::now();
    ~ForwardSpan() {
      StepStats& stats = runner.stats_;
      Clock::time_point& last_end = runner.last_forward_end_;
      if (last_end != Clock::time_point{}) {
        stats.gap_seconds += std::chrono::duration<double>(t0 - last_end).count();
        ++stats.gaps;
      }
      last_end = Clock::now();
      stats.forward_seconds += std::chrono::duration<double>(last_end - t0).count();
      if (plan_index >= 0 && !std::uncaught_exceptions()) {
        runner.add_plan_time(
            plan_index,
            std::chrono::duration_cast<std::chrono::nanoseconds>(last_end - t0).count());
      }
    }
  } forward_span{*this, plan.index};
  if (plan.dummy) {
    ++stats_.dummy_steps;
    run_dummy(plan.mode, plan.micro_batch);
    return launch;
  }
  in.mode = plan.mode;
  if (plan.micro_batch) {
    const MicroBatchSplit split = split_batch(in, distribution_threshold_);
    launch.logits = &runner_.forward_overlapped(split.a, split.b, kv, overlap_);
  } else {
    launch.logits = &runner_.forward(in, kv);
  }
  return launch;
}

void StepRunner::add_plan_time(int64_t index, int64_t ns) {
  std::lock_guard<std::mutex> lock(plan_times_mu_);
  PlanTime& t = plan_times_[index % (SplitTimes::kLag + 2)];
  if (t.index != index) t = {index, 0, 0};
  t.ns += ns;
  ++t.steps;
}

int64_t StepRunner::plan_time(int64_t index) {
  if (index < 0) return -1;
  std::lock_guard<std::mutex> lock(plan_times_mu_);
  const PlanTime& t = plan_times_[index % (SplitTimes::kLag + 2)];
  return t.index == index && t.steps > 0 ? t.ns / t.steps : -1;
}

}  // namespace duet
