"""DeepSeek-V3 (DeepseekV3ForCausalLM, also Kimi K2's) in NumPy: DeepSeek-V2's model with
noaux_tc routing, written from Hugging Face's modeling_deepseek_v3:

    scores = sigmoid(router logits)
    choice = scores + e_score_correction_bias          (for choosing only)
    group score = sum of the group's two best choice scores; keep topk_group groups, the other
    groups' choice scores become 0 (masked_fill with 0.0)
    experts = top k of choice; weights = their scores (without the bias),
    divided by their sum + 1e-20 if norm_topk_prob, then times routed_scaling_factor.

The multi-token-prediction layers (model.layers.{num_hidden_layers + i}) are not part of the
forward pass and are skipped.
"""

import re

import numpy as np

from ref_common import top_k
from ref_deepseek_v2 import DeepseekV2


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class DeepseekV3(DeepseekV2):
    SCORING_FUNC = "sigmoid"
    DEFAULT_TOPK_METHOD = "noaux_tc"
    TOPK_METHODS = ("noaux_tc",)

    def __init__(self, cfg, store):
        super().__init__(cfg, store)
        self.n_group = int(cfg.opt("n_group", 8))
        self.topk_group = int(cfg.opt("topk_group", 4))
        self.norm_topk_prob = bool(cfg.opt("norm_topk_prob", True))
        self.routed_scaling = float(cfg.opt("routed_scaling_factor", 2.5))

    def ffn_tensors(self, il):
        names = super().ffn_tensors(il)
        return names + ["mlp.gate.e_score_correction_bias"] if self.is_moe(il) else names

    def tensor_name_mismatch(self):
        missing, unexpected = super().tensor_name_mismatch()
        mtp = re.compile(r"model\.layers\.(\d+)\.")
        return missing, [n for n in unexpected
                         if not (mtp.match(n) and int(mtp.match(n).group(1)) >= self.n_layer)]

    def route_v3(self, scores, bias):
        """(experts [k], weights [k]) for one token's sigmoid scores [n_expert]."""
        k = self.n_expert_used
        choice = scores + bias
        if self.n_group > 1:
            groups = choice.reshape(self.n_group, -1)
            group_score = np.sort(groups, axis=1)[:, -2:].sum(axis=1)
            keep = np.zeros(self.n_group, dtype=bool)
            keep[top_k(group_score, self.topk_group)] = True
            choice = np.where(np.repeat(keep, groups.shape[1]), choice, 0.0)
        experts = top_k(choice, k)
        self.stats.note(choice, k)
        weights = scores[experts]
        if self.norm_topk_prob:
            weights = weights / (weights.sum() + 1e-20)
        return experts, weights * self.routed_scaling

    def route_tokens(self, p, x):
        scores = sigmoid(self.mm(x, p + "gate.weight"))  # [n_tokens, n_expert]
        bias = self.w(p + "gate.e_score_correction_bias")
        return [self.route_v3(row, bias) for row in scores]
