"""DeepseekV2ForCausalLM (DeepSeek's own modeling_deepseek.py for V2) in NumPy float64.

Multi-head latent attention, computed the naive way (full per-head keys and values):
  q = q_proj(x) or q_b_proj(q_a_layernorm(q_a_proj(x)))     per head [q_nope | q_pe]
  kv_a_proj_with_mqa(x) = [compressed_kv (kv_lora_rank) | k_pe (qk_rope_head_dim, one shared head)]
  kv_b_proj(kv_a_layernorm(compressed_kv))                  per head [k_nope | v]
  rope on q_pe and k_pe, DeepSeek style: de-interleave the pairs, then rotate_half;
  keys [k_nope | k_pe], queries [q_nope | q_pe], scale (nope+rope)^-0.5 (times yarn mscale^2).
Layer il is MoE iff n_routed_experts is set, il >= first_k_dense_replace and
il % moe_layer_freq == 0. MoE: softmax gate, greedy or group-limited top-k, then either
w / (sum w + 1e-20) (top_k > 1 and norm_topk_prob) or w * routed_scaling_factor, plus shared experts.
"""

import numpy as np

from ref_common import (ConfigError, DecoderModel, apply_rope_neox, attention_probs, bf16_round, causal_attention,
                        default_inv_freq, extend_or_pass, rms_norm, rope_cos_sin, selection_margin,
                        softmax, top_k, yarn_get_mscale, yarn_inv_freq)


def deinterleave(x):
    """[..., d] with pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...], as DeepSeek's
    x.view(..., d // 2, 2).transpose(-1, -2).reshape(..., d)."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(*x.shape[:-1], d)


def deepseek_rope(cfg, dim, theta):
    """(inv_freq [dim/2], cos/sin multiplier, softmax-scale multiplier) of DeepSeek V2's rotary
    classes: plain, or DeepseekV2YarnRotaryEmbedding for rope_scaling.type "yarn"."""
    rs = cfg.opt("rope_scaling", None)
    if rs is None:
        return default_inv_freq(dim, theta), 1.0, 1.0
    kind = rs.get("type", rs.get("rope_type"))
    if kind != "yarn":
        raise ConfigError(f"deepseek_v2 rope scaling type {kind!r} is not implemented by the reference")
    factor = float(rs["factor"])
    mscale = rs.get("mscale", 1)
    mscale_all_dim = rs.get("mscale_all_dim", 0)
    inv_freq = yarn_inv_freq(dim, theta, factor, rs.get("beta_fast", 32), rs.get("beta_slow", 1),
                             rs.get("original_max_position_embeddings", 4096))
    cos_sin_scale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    attn_scale = yarn_get_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0
    return inv_freq, cos_sin_scale, attn_scale


class DeepseekV2(DecoderModel):
    SCORING_FUNC = "softmax"
    # The V2 code spells the plain branch "gready"; its released configs say "greedy".
    DEFAULT_TOPK_METHOD = "gready"
    TOPK_METHODS = ("greedy", "gready", "group_limited_greedy")

    def __init__(self, cfg, store):
        super().__init__(cfg, store, eps_default=1e-6)
        self.n_head = int(cfg.req("num_attention_heads"))
        self.q_lora_rank = cfg.opt("q_lora_rank", 1536)
        self.kv_lora_rank = int(cfg.opt("kv_lora_rank", 512))
        self.n_nope = int(cfg.opt("qk_nope_head_dim", 128))
        self.n_rope = int(cfg.opt("qk_rope_head_dim", 64))
        self.n_v = int(cfg.opt("v_head_dim", 128))
        self.bias = bool(cfg.opt("attention_bias", False))
        self.inv_freq, self.rope_scale, attn_scale = deepseek_rope(
            cfg, self.n_rope, float(cfg.opt("rope_theta", 10000.0)))
        self.kq_scale = (self.n_nope + self.n_rope) ** -0.5 * attn_scale
        self.n_expert = cfg.opt("n_routed_experts", None)
        self.n_expert_used = cfg.opt("num_experts_per_tok", None)
        self.n_shared = cfg.opt("n_shared_experts", None)
        self.first_dense = int(cfg.opt("first_k_dense_replace", 0))
        self.layer_freq = int(cfg.opt("moe_layer_freq", 1))
        self.topk_method = cfg.opt("topk_method", self.DEFAULT_TOPK_METHOD)
        self.n_group = cfg.opt("n_group", None)
        self.topk_group = cfg.opt("topk_group", None)
        self.norm_topk_prob = bool(cfg.opt("norm_topk_prob", False))
        self.routed_scaling = float(cfg.opt("routed_scaling_factor", 1.0))
        if cfg.opt("scoring_func", self.SCORING_FUNC) != self.SCORING_FUNC:
            raise ConfigError(f"scoring_func {cfg.opt('scoring_func', None)!r} is not {self.SCORING_FUNC}")
        if self.topk_method not in self.TOPK_METHODS:
            raise ConfigError(f"topk_method {self.topk_method!r} is not implemented by the reference")

    def is_moe(self, il):
        return self.n_expert is not None and il >= self.first_dense and il % self.layer_freq == 0

    def attention_tensors(self, il):
        if self.q_lora_rank is None:
            names = ["self_attn.q_proj.weight"]
        else:
            names = ["self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight"]
            if self.bias:
                names.append("self_attn.q_a_proj.bias")
        names += ["self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
                  "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight"]
        if self.bias:
            names += ["self_attn.kv_a_proj_with_mqa.bias", "self_attn.o_proj.bias"]
        return names

    def ffn_tensors(self, il):
        mlp3 = ("gate_proj", "up_proj", "down_proj")
        if not self.is_moe(il):
            return [f"mlp.{n}.weight" for n in mlp3]
        names = ["mlp.gate.weight"] + [f"mlp.experts.{e}.{n}.weight" for e in range(self.n_expert) for n in mlp3]
        if self.n_shared:
            names += [f"mlp.shared_experts.{n}.weight" for n in mlp3]
        return names

    def linear(self, name, x, has_bias=False):
        y = self.mm(x, name + ".weight")
        return y + self.w(name + ".bias") if has_bias else y

    def rope(self, x, cos, sin):
        """x [..., n_tokens, n_rope] -> rotated, in the de-interleaved layout DeepSeek returns."""
        return apply_rope_neox(deinterleave(x), cos, sin)

    def attention(self, il, x, pos, cache):
        p = f"model.layers.{il}.self_attn."
        n_tokens = x.shape[0]
        if self.q_lora_rank is None:
            q = self.linear(p + "q_proj", x)
        else:
            q_a = rms_norm(self.linear(p + "q_a_proj", x, self.bias), self.w(p + "q_a_layernorm.weight"), self.eps)
            q = self.linear(p + "q_b_proj", q_a)
        # [n_head, n_tokens, nope + rope]
        q = q.reshape(n_tokens, self.n_head, self.n_nope + self.n_rope).transpose(1, 0, 2)
        q_nope, q_pe = q[..., :self.n_nope], q[..., self.n_nope:]

        kv_a = self.linear(p + "kv_a_proj_with_mqa", x, self.bias)  # [n_tokens, kv_lora_rank + rope]
        ckv, k_pe = kv_a[:, :self.kv_lora_rank], kv_a[:, self.kv_lora_rank:]
        # The latent duet caches is [normed ckv | roped k_pe]; K and V are expanded from it here.
        ckv = self.kv_round(rms_norm(ckv, self.w(p + "kv_a_layernorm.weight"), self.eps))
        # kv_b_proj per head: [n_head, nope + v, kv_lora_rank]
        w_kv_b = self.w(p + "kv_b_proj.weight").reshape(self.n_head, self.n_nope + self.n_v, self.kv_lora_rank)
        k_nope = np.einsum("tc,hdc->htd", ckv, w_kv_b[:, :self.n_nope])  # [n_head, n_tokens, nope]
        v = np.einsum("tc,hdc->htd", ckv, w_kv_b[:, self.n_nope:])  # [n_head, n_tokens, v]

        cos, sin = rope_cos_sin(self.inv_freq, pos, self.rope_scale)
        q_pe = self.rope(q_pe, cos, sin)
        k_pe = self.kv_round(self.rope(k_pe[None], cos, sin))  # [1, n_tokens, rope], every head's
        query = np.concatenate([q_nope, q_pe], axis=-1)
        key = np.concatenate([k_nope, np.broadcast_to(k_pe, (self.n_head,) + k_pe.shape[1:])], axis=-1)
        key = extend_or_pass(cache, "k", key, axis=1)
        v = extend_or_pass(cache, "v", v, axis=1)
        ckv_all = extend_or_pass(cache, "ckv", ckv, axis=0)  # [n_kv, kv_lora_rank]
        rounds_lat = self.act_bf16 and self.store.dtype(p + "kv_b_proj.weight") == "BF16"
        if self.attn_bf16 or rounds_lat:
            # duet attends in the latent space: each head's q_nope times its W_UK, and the attended
            # latent times its W_UV, both inputs rounded like any product's where kv_b is bf16;
            # unrounded, that is the same as q·k and P·v.
            if rounds_lat:
                q_nope = bf16_round(q_nope)
                query = np.concatenate([q_nope, q_pe], axis=-1)
            if self.attn_bf16:
                # Its query [q_nope · W_UK | q_pe] against the cached [ckv | k_pe], that query
                # and the probabilities rounded to bf16 (attn_bf16).
                q_lat = np.einsum("htd,hdc->htc", q_nope, w_kv_b[:, :self.n_nope])  # [n_head, n_tokens, c]
                k_pe_all = key[0:1, :, self.n_nope:]  # [1, n_kv, rope]
                key_lat = np.concatenate([np.broadcast_to(ckv_all[None], (self.n_head,) + ckv_all.shape),
                                          np.broadcast_to(k_pe_all, (self.n_head,) + k_pe_all.shape[1:])],
                                         axis=-1)
                probs = attention_probs(np.concatenate([q_lat, q_pe], axis=-1), key_lat, pos, self.kq_scale,
                                        round_bf16=True)
            else:
                probs = attention_probs(query, key, pos, self.kq_scale)  # [n_head, n_tokens, n_kv]
            lat = np.einsum("hts,sc->htc", probs, ckv_all)  # [n_head, n_tokens, kv_lora_rank]
            if rounds_lat:
                lat = bf16_round(lat)
            out = np.einsum("htc,hdc->thd", lat, w_kv_b[:, self.n_nope:]).reshape(n_tokens, -1)
        else:
            out = causal_attention(query, key, v, pos, self.kq_scale)  # [n_tokens, n_head * v_head_dim]
        return self.linear(p + "o_proj", out, self.bias)

    def route(self, scores):
        """(experts [k], weights [k]) for one token's gate probabilities [n_expert]."""
        k = self.n_expert_used
        if self.topk_method == "group_limited_greedy":
            groups = scores.reshape(self.n_group, -1)  # [n_group, n_expert / n_group]
            group_best = groups.max(axis=1)
            keep = top_k(group_best, self.topk_group)
            mask = np.zeros(self.n_group, dtype=bool)
            mask[keep] = True
            masked = np.where(np.repeat(mask, groups.shape[1]), scores, 0.0)
            experts = top_k(masked, k)
            self.stats.min_margin = min(self.stats.min_margin, selection_margin(group_best, self.topk_group))
            self.stats.note(masked, k)
            if set(experts.tolist()) != set(top_k(scores, k).tolist()):
                self.stats.n_group_changed += 1
            weights = masked[experts]
        else:
            experts = top_k(scores, k)
            self.stats.note(scores, k)
            weights = scores[experts]
        if k > 1 and self.norm_topk_prob:
            weights = weights / (weights.sum() + 1e-20)
        else:
            weights = weights * self.routed_scaling
        return experts, weights

    def route_tokens(self, p, x):
        """(experts, weights) of each token of x [n_tokens, n_embd] in the MoE layer at prefix p."""
        probs = softmax(self.mm(x, p + "gate.weight"))  # [n_tokens, n_expert]
        return [self.route(row) for row in probs]

    def ffn(self, il, x):
        p = f"model.layers.{il}.mlp."
        if not self.is_moe(il):
            return self.dense_mlp(p, x)
        routed = self.route_tokens(p, x)
        experts = np.stack([r[0] for r in routed])  # [n_tokens, n_expert_used]
        weights = np.stack([r[1] for r in routed])
        out = self.routed_experts(x, experts, weights, lambda e, xs: self.dense_mlp(f"{p}experts.{e}.", xs))
        if self.n_shared:
            out = out + self.dense_mlp(p + "shared_experts.", x)
        return out
