// Batched generation on one rank: every request's prompt is prefilled in one forward pass, then
// all unfinished sequences decode together, one token each per step. Used by `duet generate`,
// the benchmarks and the tests; the serving scheduler builds on the same forward().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/kv_dtype.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
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
  std::string finish_reason;         // "stop" or "length"
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;
  uint64_t decode_expert_bytes = 0;  // routed-expert weights read by the decode steps
  uint64_t decode_kv_bytes = 0;      // KV rows read by the decode steps' attention (their dtype)
  // Wall seconds per kind of operation over the decode steps, when Generator::profile_ops is on.
  OpSeconds decode_op_seconds;
};

// Throws duet::Error naming what is wrong with `r` for `config` (empty prompt, an id outside
// the vocabulary, max_tokens < 0, prompt + max_tokens beyond the context).
void validate_request(const GenerateRequest& r, const ModelConfig& config);

class Generator {
 public:
  // The model and pool must outlive the generator. The KV cache keeps its rows in the dtype
  // `kv_dtype` resolves to for the model (auto: the weights').
  Generator(const Model& model, ThreadPool& pool, KvCacheDtype kv_dtype = KvCacheDtype::kAuto);

  // Throws duet::Error on a bad request (empty prompt, id out of range, too long for the
  // model's context). Sequences' KV rows are freed when it returns.
  std::vector<GenerateResult> generate(const std::vector<GenerateRequest>& requests,
                                       GenerateStats* stats = nullptr);

  // One forward pass; reserves KV rows for every token first. Returns logits
  // [in.out_rows.size(), n_vocab], valid until the next call.
  const std::vector<float>& forward(const ForwardInput& in);

  KvCache& kv_cache() { return kv_; }
  // Whether generate() times each operation of its decode steps (GenerateStats::
  // decode_op_seconds); off by default, as the clock reads cost a little.
  void profile_ops(bool on) { profile_ops_ = on; }

 private:
  const Model& model_;
  KvCache kv_;
  ModelRunner runner_;
  bool profile_ops_ = false;
};

}  // namespace duet
