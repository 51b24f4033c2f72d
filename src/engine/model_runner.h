// Runs one forward pass of a model over a batch on a KV store: the launch of every engine front
// (the batch generator, the serving loop; on any number of ranks, through StepRunner).
//
// The runner owns micro-batch slots. Each slot is one micro-batch's state (ForwardState) and its
// own dispatcher, so that two micro-batches of one step (the overlap executors) never share a
// buffer or a transfer: on several ranks each slot's dispatcher runs its collectives on the
// rank's one communication thread in the order they are started, the same on every rank, over
// buffers of its own. A step runs in slot 0 today.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/thread_pool.h"
#include "engine/executor.h"
#include "model/forward.h"
#include "model/model.h"
#include "moe/dispatcher.h"

namespace duet {

// Makes the dispatcher of one micro-batch slot (called once per slot, with its index). Empty: the
// single-rank LocalDispatcher, which needs a model holding every expert.
using DispatcherFactory = std::function<std::unique_ptr<Dispatcher>(int slot)>;

class ModelRunner {
 public:
  // Micro-batches a step can be cut into.
  static constexpr int kMaxSlots = 2;

  // The model and pool must outlive the runner. `make_dispatcher` makes each slot's dispatcher
  // (see DispatcherFactory); what it returns must not outlive what it was made from.
  ModelRunner(const Model& model, ThreadPool& pool, const DispatcherFactory& make_dispatcher = {},
              int n_slots = 1);

  // Runs the operation list of in.mode over `in` in micro-batch slot `slot`. The KV rows of every
  // position in `in` must exist in `kv` (the caller reserves them). Returns logits
  // [in.out_rows.size(), n_vocab], valid until the slot's next forward pass.
  const std::vector<float>& forward(const ForwardInput& in, KvStore& kv, int slot = 0);

  // Runs micro-batch `a` in slot 0 and `b` in slot 1 (both of one mode, over the same KV store)
  // with the overlap executor of `mode` (kTbo or kDbo). Needs two slots. Returns A's logits rows
  // then B's, valid until the next forward pass.
  const std::vector<float>& forward_overlapped(const ForwardInput& a, const ForwardInput& b,
                                               KvStore& kv, OverlapMode mode);

  const Model& model() const { return model_; }
  int n_slots() const { return static_cast<int>(slots_.size()); }
  Dispatcher& dispatcher(int slot = 0);
  // With a trace, each operation becomes a span on its slot's track (slot 0: micro-batch A, slot
  // 1: B). The trace must outlive the runner or the next set_trace.
  void set_trace(Trace* trace);
  // Where the MoE layers' shared experts run (see StepGroup::shared_experts_at); unset: on one
  // rank (the runner's own local dispatchers) inside the experts' jobs, else while the dispatch
  // travels, or with DBO while the combine does. Inside the experts' jobs is for the runner's own
  // local dispatchers only (their expert batch's output rows are the residual's): throws
  // duet::Error with a dispatcher factory.
  void set_shared_experts_at(std::optional<SharedExpertsAt> at);
  // While `seconds` is set (not null), forward passes add each operation's wall time to it.
  void set_op_seconds(OpSeconds* seconds) { op_seconds_ = seconds; }
  // Routed-expert weight bytes read by all forward passes so far, over every slot (benchmarks).
  uint64_t expert_bytes_read() const;
  // Seconds the slots' dispatchers have waited for transfers so far (0 on one rank).
  double dispatch_wait_seconds() const;

 private:
  struct Slot {
    std::unique_ptr<Dispatcher> dispatcher;
    ForwardState state;
  };
  Slot& slot(int i);

  const Model& model_;
  std::vector<std::unique_ptr<Slot>> slots_;  // [n_slots]; stable addresses
  OpSeconds* op_seconds_ = nullptr;
  std::optional<SharedExpertsAt> shared_at_;
  bool local_ = false;                     // the slots' dispatchers are LocalDispatchers (one rank)
  std::unique_ptr<DboWorker> dbo_worker_;  // micro-batch B's thread for kDbo, made on first use
  std::vector<float> joined_logits_;       // forward_overlapped's: [A rows + B rows, n_vocab]
};

}  // namespace duet
