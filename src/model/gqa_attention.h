// The attention half of a Llama-style decoder layer (Qwen3-MoE, Mixtral): pre-norm, q/k/v
// projections, optional per-head q/k RMSNorm (Qwen3), NeoX rope, GQA attention over the KV store,
// o_proj, residual add.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/rope.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/weight_source.h"

namespace duet {

struct GqaWeights {
  const float* norm = nullptr;    // [n_embd] input_layernorm
  Matrix wq;                      // [n_head * head_dim, n_embd]
  Matrix wk;                      // [n_head_kv * head_dim, n_embd]
  Matrix wv;                      // [n_head_kv * head_dim, n_embd]
  Matrix wo;                      // [n_embd, n_head * head_dim]
  const float* q_norm = nullptr;  // [head_dim] or null
  const float* k_norm = nullptr;  // [head_dim] or null
};

// Loads "<layer_prefix>input_layernorm" and "<layer_prefix>self_attn.{q,k,v,o}_proj" (and
// q_norm/k_norm when qk_norm).
GqaWeights load_gqa(WeightSource& src, const std::string& layer_prefix, const ModelConfig& c,
                    bool qk_norm);

// The rope of a Llama-style model: over the whole head, yarn-scaled if the config says so.
RopeParams rope_params(const ModelConfig& c, int64_t dim);

// s.x += attention(norm(s.x)); writes the batch's K/V rows of layer il into s.kv.
void gqa_attention(ForwardState& s, int64_t il, const GqaWeights& w, const ModelConfig& c,
                   const Rope& rope);

// The shared shape of Llama-style MoE models (Qwen3-MoE, Mixtral): GQA attention in every layer;
// a subclass says whether q/k are normed and how a layer's feed-forward weights are named.
class GqaMoeModel : public Model {
 public:
  int64_t kv_k_width() const override { return config_.n_head_kv * config_.head_dim; }
  int64_t kv_v_width() const override { return kv_k_width(); }

 protected:
  GqaMoeModel(const ModelConfig& c, bool qk_norm)
      : Model(c), qk_norm_(qk_norm), rope_(rope_params(c, c.head_dim)) {}

  void load_weights(WeightSource& src) override;
  void attention(ForwardState& s, int64_t il) const override {
    gqa_attention(s, il, attn_[il], config_, rope_);
  }
  // Loads ffn (norm excluded) of layer il; `p` is "model.layers.<il>.".
  virtual void load_ffn(WeightSource& src, const std::string& p, int64_t il, FfnWeights& ffn) = 0;

 private:
  bool qk_norm_;
  Rope rope_;
  std::vector<GqaWeights> attn_;  // [n_layer]
};

}  // namespace duet
