// Runs one forward pass of a model over a batch on a KV store: the piece every engine front
// (the batch generator, the serving loop, later the DP/EP ranks) shares.
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "engine/executor.h"
#include "model/forward.h"
#include "model/model.h"
#include "moe/local_dispatcher.h"

namespace duet {

class ModelRunner {
 public:
  // The model and pool must outlive the runner. `dispatcher`, if given (it must outlive the
  // runner too), replaces the single-rank LocalDispatcher: an EpDispatcher for expert
  // parallelism, which a model holding only some experts requires.
  ModelRunner(const Model& model, ThreadPool& pool, Dispatcher* dispatcher = nullptr);

  // Runs the operation list over `in`. The KV rows of every position in `in` must exist in `kv`
  // (the caller reserves them). Returns logits [in.out_rows.size(), n_vocab], valid until the
  // next call.
  const std::vector<float>& forward(const ForwardInput& in, KvStore& kv);

  const Model& model() const { return model_; }
  // While `seconds` is set (not null), forward passes add each operation's wall time to it.
  void set_op_seconds(OpSeconds* seconds) { op_seconds_ = seconds; }
  // Routed-expert weight bytes read by all forward passes so far (benchmarks).
  uint64_t expert_bytes_read() const { return state_.expert_bytes_read; }

 private:
  const Model& model_;
  LocalDispatcher dispatcher_;
  ForwardState state_;
  OpSeconds* op_seconds_ = nullptr;
};

}  // namespace duet
