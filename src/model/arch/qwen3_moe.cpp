// Qwen3-MoE (Qwen3MoeForCausalLM): GQA attention with per-head q/k RMSNorm before NeoX rope;
// MoE layers with softmax top-k routing, optionally renormalised (norm_topk_prob); dense layers
// where mlp_only_layers or decoder_sparse_step say so.
#include <memory>

#include "model/gqa_attention.h"

namespace duet {
namespace {

class Qwen3Moe final : public GqaMoeModel {
 public:
  explicit Qwen3Moe(const ModelConfig& c) : GqaMoeModel(c, /*qk_norm=*/true) {}

 protected:
  void load_ffn(WeightSource& src, const std::string& p, int64_t il, FfnWeights& ffn) override {
    const ModelConfig& c = config_;
    ffn.is_moe = c.is_moe_layer(il);
    if (!ffn.is_moe) {
      ffn.dense = load_mlp(src, p + "mlp", c.n_embd, c.n_ff, Layout::kPanels);
      return;
    }
    ffn.router = src.matrix(p + "mlp.gate.weight", c.n_expert, c.n_embd);
    ffn.route.n_expert = c.n_expert;
    ffn.route.n_expert_used = c.n_expert_used;
    ffn.route.norm_topk_prob = c.norm_topk_prob;
    for (int64_t e = expert_begin_; e < expert_end_; ++e) {
      ffn.experts.push_back(
          load_mlp(src, p + "mlp.experts." + std::to_string(e), c.n_embd, c.n_ff_exp));
    }
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3_moe(const ModelConfig& config) {
  return std::make_unique<Qwen3Moe>(config);
}

}  // namespace duet
