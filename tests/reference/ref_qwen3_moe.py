"""Qwen3MoeForCausalLM (transformers' modeling_qwen3_moe.py) in NumPy float64.

Attention: q/k/v/o projections without bias, RMSNorm over head_dim on every query and key head
before rope (q_norm, k_norm), NeoX rope over the full head_dim, grouped-query attention,
scale head_dim^-0.5. Layer il is sparse iff il is not in mlp_only_layers, num_experts > 0 and
(il + 1) % decoder_sparse_step == 0; otherwise a dense SwiGLU MLP of intermediate_size.
Router: softmax over all experts, top-k, optional renormalisation of the k weights to sum 1.
"""

import numpy as np

from ref_common import (ConfigError, DecoderModel, apply_rope_neox, causal_attention,
                        extend_or_pass, hf_rope, rms_norm, rope_cos_sin, rope_theta_of, softmax,
                        swiglu, top_k)


class Qwen3Moe(DecoderModel):
    def __init__(self, cfg, store):
        super().__init__(cfg, store, eps_default=1e-6)
        self.n_head = int(cfg.req("num_attention_heads"))
        self.n_head_kv = int(cfg.opt("num_key_value_heads", self.n_head))
        self.head_dim = int(cfg.opt("head_dim", None) or self.n_embd // self.n_head)
        if cfg.opt("attention_bias", False):
            raise ConfigError("qwen3_moe with attention_bias true is not supported")
        if cfg.opt("use_sliding_window", False):
            raise ConfigError("qwen3_moe with use_sliding_window true is not supported")
        if self.n_head % self.n_head_kv:
            raise ConfigError(f"num_attention_heads {self.n_head} not a multiple of kv heads {self.n_head_kv}")
        self.inv_freq, self.rope_scale = hf_rope(cfg, self.head_dim, rope_theta_of(cfg, 10000.0))
        self.n_expert = int(cfg.opt("num_experts", 128))
        self.n_expert_used = int(cfg.opt("num_experts_per_tok", 8))
        self.norm_topk_prob = bool(cfg.opt("norm_topk_prob", False))
        self.sparse_step = int(cfg.opt("decoder_sparse_step", 1))
        self.mlp_only_layers = list(cfg.opt("mlp_only_layers", None) or [])

    def is_sparse(self, il):
        return (il not in self.mlp_only_layers and self.n_expert > 0
                and (il + 1) % self.sparse_step == 0)

    def attention_tensors(self, il):
        return [f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]

    def ffn_tensors(self, il):
        if not self.is_sparse(il):
            return [f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
        return ["mlp.gate.weight"] + [f"mlp.experts.{e}.{n}.weight" for e in range(self.n_expert)
                                      for n in ("gate_proj", "up_proj", "down_proj")]

    def attention(self, il, x, pos, cache):
        p = f"model.layers.{il}.self_attn."
        n_tokens = x.shape[0]
        hd = self.head_dim
        q = self.mm(x, p + "q_proj.weight").reshape(n_tokens, self.n_head, hd)
        k = self.mm(x, p + "k_proj.weight").reshape(n_tokens, self.n_head_kv, hd)
        v = self.mm(x, p + "v_proj.weight").reshape(n_tokens, self.n_head_kv, hd)
        q = rms_norm(q, self.w(p + "q_norm.weight"), self.eps).transpose(1, 0, 2)  # [n_head, n_tokens, hd]
        k = rms_norm(k, self.w(p + "k_norm.weight"), self.eps).transpose(1, 0, 2)  # [n_head_kv, n_tokens, hd]
        v = v.transpose(1, 0, 2)
        cos, sin = rope_cos_sin(self.inv_freq, pos, self.rope_scale)
        q = apply_rope_neox(q, cos, sin)
        k = apply_rope_neox(k, cos, sin)
        k = extend_or_pass(cache, "k", self.kv_round(k), axis=1)
        v = extend_or_pass(cache, "v", self.kv_round(v), axis=1)
        group = self.n_head // self.n_head_kv  # query head h reads kv head h // group
        out = causal_attention(q, np.repeat(k, group, axis=0), np.repeat(v, group, axis=0), pos, hd ** -0.5,
                               round_bf16=self.attn_bf16)
        return self.mm(out, p + "o_proj.weight")

    def ffn(self, il, x):
        p = f"model.layers.{il}.mlp."
        if not self.is_sparse(il):
            return self.dense_mlp(p, x)
        probs = softmax(self.mm(x, p + "gate.weight"))  # [n_tokens, n_expert]
        experts = np.stack([top_k(row, self.n_expert_used) for row in probs])  # [n_tokens, n_expert_used]
        for row in probs:
            self.stats.note(row, self.n_expert_used)
        weights = np.take_along_axis(probs, experts, axis=1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=1, keepdims=True)

        def expert(e, xs):
            q = f"{p}experts.{e}."
            return swiglu(self.mm, xs, q + "gate_proj.weight", q + "up_proj.weight",
                          q + "down_proj.weight")

        return self.routed_experts(x, experts, weights, expert)
