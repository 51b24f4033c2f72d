// Expert routing: router logits -> top-k expert ids and weights, as each architecture's modeling
// code computes them.
#pragma once

#include <cstdint>

namespace duet {

struct RouterParams {
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;          // k
  // Renormalise the k weights to sum 1 (DeepSeek-V2 only does it when k > 1: its model code
  // passes false for k == 1).
  bool norm_topk_prob = false;
  // DeepSeek-V2 applies routed_scaling_factor only when it does not renormalise; Qwen3 and
  // Mixtral never scale (factor 1).
  double routed_scaling_factor = 1.0;
  // Group-limited greedy (DeepSeek-V2): keep the topk_group groups whose best expert scores
  // highest, then take the top k among their experts. n_group 1 = plain greedy.
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // Epsilon added to the renormalisation denominator (DeepSeek: 1e-20; HF Qwen3/Mixtral: 0).
  double norm_eps = 0.0;
  // DeepSeek-V3's noaux_tc: scores are sigmoid(logits); experts are chosen by score +
  // score_bias[e] (e_score_correction_bias), groups by the sum of their two best such scores
  // (the other groups' choice scores become 0, as HF's masked_fill does); the weights are the
  // chosen experts' unbiased scores, renormalised if norm_topk_prob, then always multiplied by
  // routed_scaling_factor.
  bool noaux_tc = false;
  const float* score_bias = nullptr;  // [n_expert] f32; null: no bias
};

// For each of n_tokens rows of logits [n_tokens, n_expert] (f32): softmax (noaux_tc: sigmoid),
// select the top k (ties go to the lower expert id), weight them. Outputs: ids [n_tokens, k] int32 and
// weights [n_tokens, k] f32, in descending score order.
void route_topk(const RouterParams& p, const float* logits, int64_t n_tokens, int32_t* ids,
                float* weights);

}  // namespace duet
