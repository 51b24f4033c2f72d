// The single-rank dispatcher: every expert is local, so dispatch groups the (token, expert) pairs
// by expert, pointing each row at its token's hidden state and at its token's row of the
// caller's output, which the experts add their weighted outputs to; combine has nothing to do.
#pragma once

#include "moe/dispatcher.h"

namespace duet {

class LocalDispatcher final : public Dispatcher {
 public:
  explicit LocalDispatcher(int64_t n_expert) : n_expert_(n_expert) {}

  void dispatch_send(const RoutedTokens& tokens) override;
  ExpertBatch& dispatch_recv() override { return batch_; }
  void combine_send() override {}
  void combine_recv() override {}

 private:
  int64_t n_expert_;
  ExpertBatch batch_;
};

}  // namespace duet
