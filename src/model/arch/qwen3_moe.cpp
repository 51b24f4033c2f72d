// Qwen3-MoE (Qwen3MoeForCausalLM): GQA attention with per-head q/k RMSNorm before NeoX rope;
// MoE layers with softmax top-k routing, optionally renormalised (norm_topk_prob); dense layers
// where mlp_only_layers or decoder_sparse_step say so.
#include <memory>

#include "model/gqa_attention.h"
#include "model/layers.h"
#include "model/model.h"

namespace duet {
namespace {

class Qwen3Moe final : public Model {
 public:
  explicit Qwen3Moe(const ModelConfig& c) : Model(c), rope_(rope_params(c, c.head_dim)) {}

  int64_t kv_k_width() const override { return config_.n_head_kv * config_.head_dim; }
  int64_t kv_v_width() const override { return kv_k_width(); }

 protected:
  void load_weights(WeightSource& src) override {
    const ModelConfig& c = config_;
    const int64_t D = c.n_embd;
    load_embeddings(src);
    attn_.resize(static_cast<size_t>(c.n_layer));
    for (int64_t il = 0; il < c.n_layer; ++il) {
      const std::string p = "model.layers." + std::to_string(il) + ".";
      FfnWeights& ffn = ffn_[il];
      attn_[il] = load_gqa(src, p, c, /*qk_norm=*/true);
      ffn.norm = src.vector(p + "post_attention_layernorm.weight", D);
      ffn.is_moe = c.is_moe_layer(il);
      if (!ffn.is_moe) {
        ffn.dense = load_mlp(src, p + "mlp", D, c.n_ff);
        continue;
      }
      ffn.router = src.matrix(p + "mlp.gate.weight", c.n_expert, D);
      ffn.route.n_expert = c.n_expert;
      ffn.route.n_expert_used = c.n_expert_used;
      ffn.route.norm_topk_prob = c.norm_topk_prob;
      for (int64_t e = 0; e < c.n_expert; ++e) {
        ffn.experts.push_back(
            load_mlp(src, p + "mlp.experts." + std::to_string(e), D, c.n_ff_exp));
      }
    }
    load_output(src);
  }

  void attention(ForwardState& s, int64_t il) const override {
    gqa_attention(s, il, attn_[il], config_, rope_);
  }

 private:
  Rope rope_;
  std::vector<GqaWeights> attn_;  // [n_layer]
};

}  // namespace

std::unique_ptr<Model> make_qwen3_moe(const ModelConfig& config) {
  return std::make_unique<Qwen3Moe>(config);
}

}  // namespace duet
