#include "engine/model_runner.h"

#include "core/error.h"
#include "engine/executor.h"
#include "moe/local_dispatcher.h"

namespace duet {

ModelRunner::ModelRunner(const Model& model, ThreadPool& pool,
                         const DispatcherFactory& make_dispatcher, int n_slots)
    : model_(model), local_(!make_dispatcher) {
  DUET_CHECK(n_slots >= 1 && n_slots <= kMaxSlots, "ModelRunner: " << n_slots << " slots");
  DUET_CHECK(make_dispatcher ||
                 (model.expert_begin() == 0 && model.expert_end() == model.config().n_expert),
             "a model holding experts [" << model.expert_begin() << ", " << model.expert_end()
                                         << ") needs an expert-parallel dispatcher");
  for (int i = 0; i < n_slots; ++i) {
    auto s = std::make_unique<Slot>();
    s->dispatcher = make_dispatcher ? make_dispatcher(i)
                                    : std::make_unique<LocalDispatcher>(model.config().n_expert);
    DUET_CHECK(s->dispatcher, "the dispatcher factory made no dispatcher for slot " << i);
    s->state.dispatcher = s->dispatcher.get();
    s->state.pool = &pool;
    slots_.push_back(std::move(s));
  }
}

ModelRunner::Slot& ModelRunner::slot(int i) {
  DUET_CHECK(i >= 0 && i < n_slots(), "micro-batch slot " << i << " of " << n_slots());
  return *slots_[static_cast<size_t>(i)];
}

void ModelRunner::set_shared_experts_at(std::optional<SharedExpertsAt> at) {
  if (at == SharedExpertsAt::kExperts && !local_) {
    throw Error("the shared experts run inside the experts' jobs on one rank only");
  }
  shared_at_ = at;
}

Dispatcher& ModelRunner::dispatcher(int i) {
  return *slot(i).dispatcher;
}

void ModelRunner::set_trace(Trace* trace) {
  for (int i = 0; i < n_slots(); ++i) {
    slot(i).state.trace = trace;
    slot(i).state.trace_track = i == 0 ? TraceTrack::kMicroBatchA : TraceTrack::kMicroBatchB;
  }
}

const std::vector<float>& ModelRunner::forward(const ForwardInput& in, KvStore& kv, int i) {
  ForwardState& state = slot(i).state;
  state.in = &in;
  state.kv = &kv;
  const std::vector<Operation>& ops = model_.operations(
      in.mode,
      shared_at_.value_or(local_ ? SharedExpertsAt::kExperts : SharedExpertsAt::kDispatch));
  if (op_seconds_) {
    run_plain_timed(ops, state, *op_seconds_);
  } else {
    run_plain(ops, state);
  }
  state.in = nullptr;
  state.kv = nullptr;
  return state.logits;
}

const std::vector<float>& ModelRunner::forward_overlapped(const ForwardInput& a,
                                                       const ForwardInput& b, KvStore& kv,
                                                       OverlapMode mode) {
  DUET_CHECK(n_slots() >= 2, "two micro-batches need two slots, the runner has " << n_slots());
  DUET_CHECK(a.mode == b.mode, "micro-batches of modes " << forward_mode_name(a.mode) << " and "
                                                         << forward_mode_name(b.mode));
  ForwardState& sa = slot(0).state;
  ForwardState& sb = slot(1).state;
  sa.in = &a;
  sb.in = &b;
  sa.kv = sb.kv = &kv;
  struct Clear {  // the states never keep pointers to this call's inputs
    ForwardState& a;
    ForwardState& b;
    ~Clear() { a.in = b.in = nullptr, a.kv = b.kv = nullptr; }
  } clear{sa, sb};
  // DBO follows seed 000's schedule unless told otherwise: the shared experts run while the
  // combine travels (on one rank, where nothing travels, inside the experts' jobs).
  const SharedExpertsAt by_mode =
      mode == OverlapMode::kDbo ? SharedExpertsAt::kCombine : SharedExpertsAt::kDispatch;
  const std::vector<Operation>& ops =
      model_.operations(a.mode, shared_at_.value_or(local_ ? SharedExpertsAt::kExperts : by_mode));
  if (mode == OverlapMode::kDbo) {
    if (!dbo_worker_) dbo_worker_ = std::make_unique<DboWorker>();
    run_dual_batch_overlap(ops, sa, sb, *dbo_worker_);
  } else {
    DUET_CHECK(mode == OverlapMode::kTbo, "overlap mode " << overlap_mode_name(mode));
    run_two_batch_overlap(ops, sa, sb, delta_stages(a.mode));
  }
  joined_logits_.assign(sa.logits.begin(), sa.logits.end());
  joined_logits_.insert(joined_logits_.end(), sb.logits.begin(), sb.logits.end());
  return joined_logits_;
}

uint64_t ModelRunner::expert_bytes_read() const {
  uint64_t n = 0;
  for (const auto& s : slots_) n += s->state.expert_bytes_read;
  return n;
}

double ModelRunner::dispatch_wait_seconds() const {
  double s = 0;
  for (const auto& slot : slots_) s += slot->dispatcher->wait_seconds();
  return s;
}

}  // namespace duet
