#include "engine/model_runner.h"

#include "core/error.h"
#include "engine/executor.h"
#include "moe/local_dispatcher.h"

namespace duet {

ModelRunner::ModelRunner(const Model& model, ThreadPool& pool,
                         const DispatcherFactory& make_dispatcher, int n_slots)
    : model_(model) {
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

Dispatcher& ModelRunner::dispatcher(int i) {
  return *slot(i).dispatcher;
}

const std::vector<float>& ModelRunner::forward(const ForwardInput& in, KvStore& kv, int i) {
  ForwardState& state = slot(i).state;
  state.in = &in;
  state.kv = &kv;
  if (op_seconds_) {
    run_plain_timed(model_.operations(in.mode), state, *op_seconds_);
  } else {
    run_plain(model_.operations(in.mode), state);
  }
  state.in = nullptr;
  state.kv = nullptr;
  return state.logits;
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
