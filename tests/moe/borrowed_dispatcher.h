// A Dispatcher that forwards to one owned elsewhere, so that a test can hand a model runner's
// dispatcher factory a dispatcher it made (and wrapped, to stall or fail it) itself.
#pragma once

#include <memory>

#include "core/error.h"
#include "engine/model_runner.h"
#include "engine/step_runner.h"
#include "moe/dispatcher.h"

namespace duet::test {

class BorrowedDispatcher final : public Dispatcher {
 public:
  explicit BorrowedDispatcher(Dispatcher& inner) : inner_(inner) {}
  void dispatch_send(const RoutedTokens& tokens) override { inner_.dispatch_send(tokens); }
  ExpertBatch& dispatch_recv() override { return inner_.dispatch_recv(); }
  void combine_send() override { inner_.combine_send(); }
  void combine_recv() override { inner_.combine_recv(); }
  double wait_seconds() const override { return inner_.wait_seconds(); }
  void plan_step(int64_t max_tokens_per_rank, bool micro_batch) override {
    inner_.plan_step(max_tokens_per_rank, micro_batch);
  }

 private:
  Dispatcher& inner_;
};

// A factory for one micro-batch slot that lends it `d`, which must outlive the runner.
inline DispatcherFactory borrow(Dispatcher& d) {
  return [&d](int slot) -> std::unique_ptr<Dispatcher> {
    DUET_CHECK(slot == 0, "a borrowed dispatcher serves one micro-batch slot, not slot " << slot);
    return std::make_unique<BorrowedDispatcher>(d);
  };
}

// The step group of `coord`'s rank whose one micro-batch slot borrows `d`.
inline StepGroup borrowing_group(Coordinator& coord, Dispatcher& d) {
  StepGroup g;
  g.coord = &coord;
  g.dispatchers = borrow(d);
  return g;
}

}  // namespace duet::test
