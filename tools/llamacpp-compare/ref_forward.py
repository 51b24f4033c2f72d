#!/usr/bin/env python3
"""An f64 numpy forward pass of a Hugging Face qwen3_moe checkpoint, as a third opinion when duet
and llama.cpp disagree: prints, per prompt position, the largest |duet logit - reference logit|
and the smallest gap between the router's 4th and 5th expert scores over the layers (a gap near 0
means a tiny numeric difference can route the token to another expert).

Usage: ref_forward.py MODEL_DIR DUET_DUMP.json
  (the dump from `duet generate MODEL_DIR --prompt-ids ... --dump-logits DUET_DUMP.json`)
Slow (seconds per token); meant for a few dozen tokens.
"""

import json
import os
import sys

import numpy as np

from to_gguf import SafetensorsShards, bf16_to_f32


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, dump_path = sys.argv[1], sys.argv[2]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(dump_path) as f:
        dump = json.load(f)
    st = SafetensorsShards(model_dir)
    w = lambda name: bf16_to_f32(st.raw_bf16(name)).astype(np.float64)

    tokens = np.array(dump["tokens"])
    n_tokens = len(tokens)
    n_head, n_head_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim, n_expert_used = cfg["head_dim"], cfg["num_experts_per_tok"]
    eps = cfg["rms_norm_eps"]

    def rms_norm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    # Rotary embedding over the two halves of each head (HF's rotate_half layout).
    inv_freq = cfg["rope_theta"] ** (-np.arange(0, head_dim, 2) / head_dim)
    angle = np.arange(n_tokens)[:, None] * inv_freq[None]  # [n_tokens, head_dim / 2]
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]

    def rope(x):  # [n_tokens, n_heads, head_dim]
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = w("model.embed_tokens.weight")[tokens]  # [n_tokens, n_embd]
    router_gap = np.full(n_tokens, np.inf)
    causal = np.triu(np.full((n_tokens, n_tokens), -np.inf), 1)
    for il in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{il}."
        h = rms_norm(x, w(p + "input_layernorm.weight"))
        q = (h @ w(p + "self_attn.q_proj.weight").T).reshape(n_tokens, n_head, head_dim)
        k = (h @ w(p + "self_attn.k_proj.weight").T).reshape(n_tokens, n_head_kv, head_dim)
        v = (h @ w(p + "self_attn.v_proj.weight").T).reshape(n_tokens, n_head_kv, head_dim)
        q = rope(rms_norm(q, w(p + "self_attn.q_norm.weight")))
        k = rope(rms_norm(k, w(p + "self_attn.k_norm.weight")))
        attn = np.zeros((n_tokens, n_head, head_dim))
        for hd in range(n_head):
            kv = hd // (n_head // n_head_kv)
            s = q[:, hd] @ k[:, kv].T / np.sqrt(head_dim) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            attn[:, hd] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + attn.reshape(n_tokens, -1) @ w(p + "self_attn.o_proj.weight").T

        h = rms_norm(x, w(p + "post_attention_layernorm.weight"))
        scores = h @ w(p + "mlp.gate.weight").T  # [n_tokens, n_expert]
        order = np.argsort(-scores, -1)
        ranked = np.take_along_axis(scores, order, -1)
        router_gap = np.minimum(router_gap, ranked[:, n_expert_used - 1] - ranked[:, n_expert_used])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        moe = np.zeros_like(x)
        for t in range(n_tokens):
            chosen = order[t, :n_expert_used]
            weights = probs[t, chosen] / probs[t, chosen].sum()  # norm_topk_prob
            for e, weight in zip(chosen, weights):
                pe = p + f"mlp.experts.{e}."
                gate = w(pe + "gate_proj.weight") @ h[t]
                up = w(pe + "up_proj.weight") @ h[t]
                moe[t] += weight * (w(pe + "down_proj.weight") @ (gate / (1 + np.exp(-gate)) * up))
        x = x + moe
    logits = rms_norm(x, w("model.norm.weight")) @ w("lm_head.weight").T  # [n_tokens, n_vocab]

    duet = np.array(dump["logits"])
    for t in range(n_tokens):
        print(f"pos {t}: |duet - ref| {np.abs(duet[t] - logits[t]).max():.2e}, "
              f"argmax duet {duet[t].argmax()} ref {logits[t].argmax()}, "
              f"min router 4th-5th gap {router_gap[t]:.4f}")


if __name__ == "__main__":
    main()
