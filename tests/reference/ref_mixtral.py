"""MixtralForCausalLM (transformers' modeling_mixtral.py) in NumPy float64.

Llama attention (no q/k norm, NeoX rope, grouped-query attention, optional sliding window) and a
sparse MoE block in every layer: softmax over num_local_experts, top-k, the k weights always
renormalised to sum 1; expert e computes w2(silu(w1(x)) * w3(x)) with intermediate_size.
"""

import numpy as np

from ref_common import (ConfigError, DecoderModel, apply_rope_neox, causal_attention,
                        extend_or_pass, hf_rope, rope_cos_sin, rope_theta_of, softmax, swiglu, top_k)


class Mixtral(DecoderModel):
    def __init__(self, cfg, store):
        super().__init__(cfg, store, eps_default=1e-5)
        self.n_head = int(cfg.req("num_attention_heads"))
        self.n_head_kv = int(cfg.opt("num_key_value_heads", 8))
        self.head_dim = int(cfg.opt("head_dim", None) or self.n_embd // self.n_head)
        if self.n_head % self.n_head_kv:
            raise ConfigError(f"num_attention_heads {self.n_head} not a multiple of kv heads {self.n_head_kv}")
        self.sliding_window = cfg.opt("sliding_window", None)
        self.inv_freq, self.rope_scale = hf_rope(cfg, self.head_dim, rope_theta_of(cfg, 1e6))
        self.n_expert = int(cfg.opt("num_local_experts", 8))
        self.n_expert_used = int(cfg.opt("num_experts_per_tok", 2))

    def attention_tensors(self, il):
        return [f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]

    def ffn_tensors(self, il):
        return ["block_sparse_moe.gate.weight"] + [
            f"block_sparse_moe.experts.{e}.{n}.weight" for e in range(self.n_expert) for n in ("w1", "w2", "w3")]

    def attention(self, il, x, pos, cache):
        p = f"model.layers.{il}.self_attn."
        n_tokens = x.shape[0]
        hd = self.head_dim
        q = self.mm(x, p + "q_proj.weight").reshape(n_tokens, self.n_head, hd).transpose(1, 0, 2)
        k = self.mm(x, p + "k_proj.weight").reshape(n_tokens, self.n_head_kv, hd).transpose(1, 0, 2)
        v = self.mm(x, p + "v_proj.weight").reshape(n_tokens, self.n_head_kv, hd).transpose(1, 0, 2)
        cos, sin = rope_cos_sin(self.inv_freq, pos, self.rope_scale)
        q = apply_rope_neox(q, cos, sin)  # [n_head, n_tokens, hd]
        k = apply_rope_neox(k, cos, sin)  # [n_head_kv, n_tokens, hd]
        k = extend_or_pass(cache, "k", self.kv_round(k), axis=1)
        v = extend_or_pass(cache, "v", self.kv_round(v), axis=1)
        group = self.n_head // self.n_head_kv  # query head h reads kv head h // group
        out = causal_attention(q, np.repeat(k, group, axis=0), np.repeat(v, group, axis=0), pos,
                               hd ** -0.5, self.sliding_window, round_bf16=self.attn_bf16)
        return self.mm(out, p + "o_proj.weight")

    def ffn(self, il, x):
        p = f"model.layers.{il}.block_sparse_moe."
        probs = softmax(self.mm(x, p + "gate.weight"))  # [n_tokens, n_expert]
        experts = np.stack([top_k(row, self.n_expert_used) for row in probs])  # [n_tokens, n_expert_used]
        for row in probs:
            self.stats.note(row, self.n_expert_used)
        weights = np.take_along_axis(probs, experts, axis=1)
        weights = weights / weights.sum(axis=1, keepdims=True)

        def expert(e, xs):
            q = f"{p}experts.{e}."
            return swiglu(self.mm, xs, q + "w1.weight", q + "w3.weight", q + "w2.weight")

        return self.routed_experts(x, experts, weights, expert)
