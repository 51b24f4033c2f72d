// The single-rank dispatcher: every expert is local, so dispatch groups the (token, expert) pairs
// by expert, pointing each row at its token's hidden state and at its token's output row, which
// the experts fill with the weighted sum; combine adds those rows to the caller's output.
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
  std::vector<float> reduced_;  // [n_tokens, n_embd] Σ_k weight · expert output of each token
};

}  // namespace duet
