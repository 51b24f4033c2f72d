// Batched generation, the front end of `duet generate`, `duet bench latency` and the tests, on
// one rank or on every rank of a data-parallel group (DP attention + EP MoE) alike: every
// request's prompt is prefilled in one step, then all unfinished sequences decode together, one
// token each per step, through the one step path (StepRunner). In a group each rank has its own
// requests and KV cache and a full copy of attention; the routed experts are spread over the
// ranks; a rank whose requests have finished runs dummy batches until every rank's have.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/kv_dtype.h"
#include "engine/sampler.h"
#include "engine/step_runner.h"
#include "model/model.h"

namespace duet {

struct GenerateRequest {
  std::vector<int32_t> prompt;    // token ids, not empty
  int64_t max_tokens = 16;        // 0: prefill only
  SamplingParams sampling;
  bool prompt_logits = false;     // keep the logits of every prompt position
  std::vector<int32_t> stop_ids;  // generation ends after one of these is produced
};

struct GenerateResult {
  std::vector<int32_t> tokens;       // generated ids (including a final stop id)
  std::vector<float> prompt_logits;  // [prompt.size(), n_vocab] if asked
  std::string finish_reason;         // "stop", "length", or "error" (see error)
  std::string error;                 // why the request ended early ("error"): e.g. NaN logits
};

struct GenerateStats {
  // This rank's own requests.
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // the first step (every rank's prefill)
  double decode_seconds = 0;   // the later steps, until this rank's last request finished
  int64_t decode_steps = 0;    // later steps in which this rank decoded
  uint64_t decode_expert_bytes = 0;  // routed-expert weights read by the decode steps
  uint64_t decode_kv_bytes = 0;      // KV rows read by the decode steps' attention (their dtype)
  // The group's steps.
  int64_t steps = 0;        // steps run by the group
  int64_t dummy_steps = 0;  // of which this rank ran the dummy batch
  int64_t micro_batch_steps = 0;  // of which the group ran as two micro-batches
  double sync_seconds = 0;  // in the steps' agreement (0 on one rank)
  // Of decode_seconds, the time spent waiting on communication: the steps' agreement and the
  // experts' all-to-alls (what overlap would hide). 0 on one rank.
  double decode_comm_seconds = 0;
  double prefill_comm_seconds = 0;  // likewise, of prefill_seconds
  // The step gap (StepStats): from the end of each forward pass to the start of the next, summed
  // over `step_gaps` pairs of consecutive steps, and the forward passes' time.
  double step_gap_seconds = 0;
  int64_t step_gaps = 0;
  double forward_seconds = 0;
  // Wall seconds per kind of operation over the decode steps, when Generator::profile_ops is on.
  OpSeconds decode_op_seconds;
};

// Throws duet::Error naming what is wrong with `r` for `config` (empty prompt, an id outside
// the vocabulary, max_tokens < 0, prompt + max_tokens beyond the context).
void validate_request(const GenerateRequest& r, const ModelConfig& config);

class Generator {
 public:
  // The model, the pool and the group's coordinator must outlive the generator. The KV cache
  // keeps its rows in the dtype `kv_dtype` resolves to for the model (auto: the weights'). Every
  // rank of a group makes one with the same kv_dtype and group policy.
  Generator(const Model& model, ThreadPool& pool, KvCacheDtype kv_dtype = KvCacheDtype::kAuto,
            const StepGroup& group = {});

  // Collective in a group: every rank calls it (with its own requests, possibly none) and it
  // returns when every rank's requests have finished. Throws duet::Error on a bad request (empty
  // prompt, id out of range, too long for the model's context) — in a group on every rank, the
  // message naming the rank whose request it was. Sequences' KV rows are freed when it returns.
  std::vector<GenerateResult> generate(const std::vector<GenerateRequest>& requests,
                                       GenerateStats* stats = nullptr);

  // One forward pass of this rank alone (a single rank only); reserves KV rows for every token
  // first. Returns logits [in.out_rows.size(), n_vocab], valid until the next call.
  const std::vector<float>& forward(const ForwardInput& in);

  KvCache& kv_cache() { return kv_; }
  // The measured split choice's table (--dbo-split auto; StepRunner::split_times), "" without.
  std::string split_times() const { return steps_.split_times(); }
  // Whether generate() times each operation of its decode steps (GenerateStats::
  // decode_op_seconds); off by default, as the clock reads cost a little.
  void profile_ops(bool on) { profile_ops_ = on; }
  // Called after each decode step of generate(), outside the step's time and its step gap: a
  // benchmark's measurement interleaved step by step with the decode (bench latency
  // --bandwidth-each-step).
  void after_decode_step(std::function<void()> f) { after_decode_step_ = std::move(f); }

 private:
  // Shares every rank's verdict on its requests; throws on every rank if any is bad.
  void validate_everywhere(const std::vector<GenerateRequest>& requests);
  void reserve(const ForwardInput& in);

  const Model& model_;
  KvCache kv_;
  StepRunner steps_;
  bool profile_ops_ = false;
  std::function<void()> after_decode_step_;
};

}  // namespace duet
