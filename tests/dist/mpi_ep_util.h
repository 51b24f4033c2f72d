// Helpers of the expert-parallel tests over MPI: the tiny model every rank of the job reads,
// the requests, one rank's share of the model, and a dispatcher that runs a hook in the middle
// of a generation (a rank that dies, stops or is busy there).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dist/dist_context.h"
#include "engine/ep_requests.h"
#include "engine/generator.h"
#include "engine/tiny_models.h"
#include "model/config.h"
#include "model/model.h"
#include "moe/ep_dispatcher.h"
#include "moe/expert_placement.h"

namespace duet::test {

// The directory of the tiny f32 model of `arch`, made by rank 0 and read by every rank (all
// ranks of these tests run on one host). Collective.
inline std::string shared_tiny_model_dir(Coordinator& coord, const std::string& arch) {
  std::string dir = coord.is_master() ? tiny_model_dir(arch) : std::string();
  coord.broadcast(dir, 0);
  return dir;
}

// This rank's share of the model in `dir`: every tensor but the routed experts of other ranks.
struct RankShare {
  ExpertPlacement place;
  std::unique_ptr<Model> model;
};

inline RankShare load_rank_share(const std::string& dir, const DistContext& ctx) {
  RankShare s;
  s.place = place_experts(load_config(dir).n_expert, ctx.world_size());
  s.model = Model::load(dir, LoadOptions{s.place.begin(ctx.rank()), s.place.end(ctx.rank())});
  return s;
}

// MoE layers of the model: dispatch_send runs once per MoE layer per forward pass.
inline int n_moe_layers(const Model& m) {
  int n = 0;
  for (int64_t il = 0; il < m.config().n_layer; ++il) n += m.config().is_moe_layer(il) ? 1 : 0;
  return n;
}

// Delegates to an EpDispatcher and runs `hook` on this rank just before its n-th dispatch_send
// (1-based; 0: never) — in decode step s of a generation when n = s * n_moe_layers + 1.
class HookedDispatcher final : public Dispatcher {
 public:
  HookedDispatcher(EpDispatcher& inner, int at, std::function<void()> hook)
      : inner_(inner), at_(at), hook_(std::move(hook)) {}

  void dispatch_send(const RoutedTokens& t) override {
    if (++calls_ == at_) hook_();
    inner_.dispatch_send(t);
  }
  ExpertBatch& dispatch_recv() override { return inner_.dispatch_recv(); }
  void combine_send() override { inner_.combine_send(); }
  void combine_recv() override { inner_.combine_recv(); }
  double wait_seconds() const override { return inner_.wait_seconds(); }
  void plan_step(int64_t max_tokens_per_rank, bool micro_batch) override {
    inner_.plan_step(max_tokens_per_rank, micro_batch);
  }

 private:
  EpDispatcher& inner_;
  int at_;
  std::function<void()> hook_;
  int calls_ = 0;
};

// Seconds since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace duet::test
