// Mixtral (MixtralForCausalLM): Llama attention (GQA, NeoX rope) and a sparse MoE block in every
// layer ("block_sparse_moe", experts w1 = gate, w3 = up, w2 = down) whose top-k softmax weights
// are always renormalised.
#include <memory>

#include "model/gqa_attention.h"

namespace duet {
namespace {

class Mixtral final : public GqaMoeModel {
 public:
  explicit Mixtral(const ModelConfig& c) : GqaMoeModel(c, /*qk_norm=*/false) {}

 protected:
  void load_ffn(WeightSource& src, const std::string& p, int64_t, FfnWeights& ffn) override {
    const ModelConfig& c = config_;
    ffn.is_moe = true;
    ffn.router = src.matrix(p + "block_sparse_moe.gate.weight", c.n_expert, c.n_embd);
    ffn.route.n_expert = c.n_expert;
    ffn.route.n_expert_used = c.n_expert_used;
    ffn.route.norm_topk_prob = true;
    for (int64_t e = expert_begin_; e < expert_end_; ++e) {
      ffn.experts.push_back(load_mlp(src, p + "block_sparse_moe.experts." + std::to_string(e),
                                     c.n_embd, c.n_ff_exp, Layout::kAsStored, {"w1", "w3", "w2"}));
    }
  }
};

}  // namespace

std::unique_ptr<Model> make_mixtral(const ModelConfig& config) {
  return std::make_unique<Mixtral>(config);
}

}  // namespace duet
