// Building blocks shared by the architectures: embedding, output head, norms, the feed-forward
// sublayer (dense MLP or routed experts through the dispatcher) as operations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/forward.h"
#include "model/weight_source.h"
#include "moe/experts.h"
#include "moe/router.h"

namespace duet {

struct ModelConfig;

// The feed-forward half of a decoder layer: a dense MLP or a MoE block.
struct FfnWeights {
  const float* norm = nullptr;       // [n_embd] post_attention_layernorm
  bool is_moe = false;
  MlpWeights dense;                  // dense layers
  Matrix router;                     // [n_expert, n_embd]
  RouterParams route;
  std::vector<MlpWeights> experts;   // local experts, [n_local]
  int64_t first_expert = 0;          // global id of experts[0]
  bool has_shared = false;
  MlpWeights shared;                 // DeepSeek shared experts (width n_ff_exp * n_shared)
};

// The names of an MLP's three projections in a checkpoint.
struct MlpNames {
  const char* gate = "gate_proj";
  const char* up = "up_proj";
  const char* down = "down_proj";
};

// Loads an MLP's three projections "<prefix>.<name>.weight", laid out as `layout` says.
MlpWeights load_mlp(WeightSource& src, const std::string& prefix, int64_t n_embd, int64_t n_ff,
                    Layout layout = Layout::kAsStored, const MlpNames& names = {});

// s.x[t, :] = tok_embd[token t, :] (converted to f32). tok_embd: [n_vocab, n_embd].
void embed_tokens(ForwardState& s, const Matrix& tok_embd);

// s.h = rms_norm(s.x) with weight w.
void norm_into_h(ForwardState& s, const float* w, int64_t n_embd, float eps);

// s.logits[r, :] = output · rms_norm(s.x[out_rows[r]]) for each requested row.
void output_logits(ForwardState& s, const float* norm, float eps, const Matrix& output);

// Appends the feed-forward sublayer of layer il to ops: for a dense layer one operation; for a
// MoE layer route → dispatch_send → yield → [shared experts] → dispatch_recv → experts →
// combine_send → yield → combine_recv. The residual stream s.x gets the sublayer's output.
void append_ffn_ops(std::vector<Operation>& ops, int64_t il, const FfnWeights& w, int64_t n_embd,
                    float eps, SharedExpertsAt shared_at = SharedExpertsAt::kDispatch);

}  // namespace duet
