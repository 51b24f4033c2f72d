// Batched generation on one data-parallel rank of an expert-parallel group (DP attention + EP
// MoE): each rank has its own requests and KV cache and a full copy of attention; the routed
// experts are spread over the ranks and reached through the dispatcher's all-to-alls. Every
// step, all ranks share their token counts through the coordinator; the group stops when no
// rank has work, and a rank with nothing to do meanwhile runs a one-token dummy batch so the
// experts' collectives always have every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "dist/coordinator.h"
#include "engine/generator.h"
#include "engine/kv_cache.h"
#include "engine/kv_dtype.h"
#include "engine/model_runner.h"
#include "model/model.h"
#include "moe/dispatcher.h"

namespace duet {

// What every rank tells the others before a step.
struct DpStepInfo {
  int64_t n_tokens = 0;  // tokens in this rank's batch (0: it will run the dummy batch)
  bool has_prefill = false;
};

struct DpStats {
  int64_t steps = 0;        // forward passes run by the group
  int64_t dummy_steps = 0;  // of which this rank ran the dummy batch
  // This rank's own requests, as GenerateStats counts them.
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // the group's first step (every rank's prefill)
  double decode_seconds = 0;   // the later steps, until this rank's last request finished
  int64_t decode_steps = 0;    // later steps in which this rank decoded
  double sync_seconds = 0;     // spent in the per-step synchronisation of token counts
  // Of decode_seconds, the time spent waiting on communication: the step sync and the
  // experts' all-to-alls (what overlap would hide).
  double decode_comm_seconds = 0;
};

class DpGenerator {
 public:
  // All four must outlive the generator. Every rank of the group makes one, with the same
  // kv_dtype (the KV cache's rows, as Generator).
  DpGenerator(const Model& model, ThreadPool& pool, Dispatcher& dispatcher, Coordinator& coord,
              KvCacheDtype kv_dtype = KvCacheDtype::kAuto);

  // Collective: every rank calls it (with its own requests, possibly none) and it returns when
  // every rank's requests have finished. Prefill, then one token per live sequence per step,
  // as Generator does. Throws duet::Error on every rank if any rank's requests are invalid
  // (the message names the rank). prompt_logits is not supported here.
  std::vector<GenerateResult> generate(const std::vector<GenerateRequest>& requests,
                                       DpStats* stats = nullptr);

 private:
  // Shares `mine` and returns every rank's, in rank order.
  std::vector<DpStepInfo> sync(const DpStepInfo& mine);
  // One forward pass; reserves KV rows first.
  const std::vector<float>& forward(const ForwardInput& in);
  void run_dummy();

  const Model& model_;
  Dispatcher& dispatcher_;
  Coordinator& coord_;
  KvCache kv_;
  ModelRunner runner_;
  int32_t dummy_seq_;  // the dummy batch's sequence: one token at position 0, rewritten
  ForwardInput dummy_in_;
};

}  // namespace duet
