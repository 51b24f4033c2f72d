#include "engine/model_runner.h"

#include "core/error.h"
#include "engine/executor.h"

namespace duet {

ModelRunner::ModelRunner(const Model& model, ThreadPool& pool, Dispatcher* dispatcher)
    : model_(model), dispatcher_(model.config().n_expert) {
  DUET_CHECK(dispatcher || (model.expert_begin() == 0 &&
                            model.expert_end() == model.config().n_expert),
             "a model holding experts [" << model.expert_begin() << ", " << model.expert_end()
                                         << ") needs an expert-parallel dispatcher");
  state_.dispatcher = dispatcher ? dispatcher : &dispatcher_;
  state_.pool = &pool;
}

const std::vector<float>& ModelRunner::forward(const ForwardInput& in, KvStore& kv) {
  state_.in = &in;
  state_.kv = &kv;
  if (op_seconds_) {
    run_plain_timed(model_.operations(in.mode), state_, *op_seconds_);
  } else {
    run_plain(model_.operations(in.mode), state_);
  }
  state_.in = nullptr;
  state_.kv = nullptr;
  return state_.logits;
}

}  // namespace duet
