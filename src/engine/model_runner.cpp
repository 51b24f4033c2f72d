#include "engine/model_runner.h"

#include "engine/executor.h"

namespace duet {

ModelRunner::ModelRunner(const Model& model, ThreadPool& pool)
    : model_(model), dispatcher_(model.config().n_expert) {
  state_.dispatcher = &dispatcher_;
  state_.pool = &pool;
}

const std::vector<float>& ModelRunner::forward(const ForwardInput& in, KvStore& kv) {
  state_.in = &in;
  state_.kv = &kv;
  run_plain(model_.operations(), state_);
  state_.in = nullptr;
  state_.kv = nullptr;
  return state_.logits;
}

}  // namespace duet
