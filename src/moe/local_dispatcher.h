// The single-rank dispatcher: every expert is local, so dispatch is a gather of token rows into
// per-expert groups and combine a weighted scatter-add back. The send halves do the work; the
// receive halves only hand it over.
#pragma once

#include "moe/dispatcher.h"

namespace duet {

class LocalDispatcher final : public Dispatcher {
 public:
  explicit LocalDispatcher(int64_t n_expert) : n_expert_(n_expert) {}

  void dispatch_send(const RoutedTokens& tokens) override;
  ExpertBatch& dispatch_recv() override { return batch_; }
  void combine_send() override {}
  void combine_recv(float* out) override;

 private:
  int64_t n_expert_;
  RoutedTokens tokens_;
  ExpertBatch batch_;
  std::vector<int64_t> row_of_;  // [n_tokens, n_expert_used]: the batch row of (token, k)
};

}  // namespace duet
