"""A small qwen3_moe (Qwen3MoeForCausalLM) in plain PyTorch, written from the architecture's
description and duet's src/model (arch/qwen3_moe.cpp, gqa_attention.cpp, layers.cpp,
moe/router.cpp), plus Hugging Face-layout safetensors reading and writing.

Forward, as duet computes it:
  x = embed_tokens[ids]
  per layer:
    h = rms_norm(x, input_layernorm, eps)
    q, k, v = h q_projᵀ, h k_projᵀ, h v_projᵀ        (heads of head_dim; GQA: n_kv_heads)
    q, k = rms_norm per head with q_norm, k_norm      (before rope)
    q, k = rope, NeoX / rotate-half pairs (i, i + d/2), inv_freq = theta^(-2i/d)
    a = softmax(q kᵀ / sqrt(head_dim), causal) v;  x += a o_projᵀ
    h = rms_norm(x, post_attention_layernorm, eps)
    p = softmax(h gateᵀ) over the experts; the top k (ties to the lower id);
        weights renormalised to sum 1 when norm_topk_prob
    x += Σ_k w_k · down(silu(gate(h)) · up(h))
  logits = rms_norm(x, norm) lm_headᵀ
"""
import json
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import safetensors_io


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Config:
    def __init__(self, d):
        self.d = d
        self.vocab = d["vocab_size"]
        self.hidden = d["hidden_size"]
        self.n_layer = d["num_hidden_layers"]
        self.n_head = d["num_attention_heads"]
        self.n_kv = d["num_key_value_heads"]
        self.head_dim = d.get("head_dim", self.hidden // self.n_head)
        self.n_expert = d["num_experts"]
        self.top_k = d["num_experts_per_tok"]
        self.moe_ff = d["moe_intermediate_size"]
        self.eps = d["rms_norm_eps"]
        self.theta = d["rope_theta"]
        self.norm_topk = d["norm_topk_prob"]
        assert not d.get("tie_word_embeddings", False)
        assert not d.get("mlp_only_layers") and d.get("decoder_sparse_step", 1) == 1
        assert not d.get("attention_bias", False) and not d.get("rope_scaling")


class Experts(nn.Module):
    """E SiLU-gated MLPs, one parameter per expert and projection (as HF stores them; a stacked
    [E, out, in] parameter would make each expert's backward write a zero-filled full copy)."""

    def __init__(self, n, d, ff):
        super().__init__()
        self.gate_proj = nn.ParameterList(nn.Parameter(torch.empty(ff, d)) for _ in range(n))
        self.up_proj = nn.ParameterList(nn.Parameter(torch.empty(ff, d)) for _ in range(n))
        self.down_proj = nn.ParameterList(nn.Parameter(torch.empty(d, ff)) for _ in range(n))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, hd = c.hidden, c.head_dim
        self.input_layernorm = nn.Parameter(torch.ones(D))
        self.q_proj = nn.Parameter(torch.empty(c.n_head * hd, D))
        self.k_proj = nn.Parameter(torch.empty(c.n_kv * hd, D))
        self.v_proj = nn.Parameter(torch.empty(c.n_kv * hd, D))
        self.o_proj = nn.Parameter(torch.empty(D, c.n_head * hd))
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))
        self.post_attention_layernorm = nn.Parameter(torch.ones(D))
        self.gate = nn.Parameter(torch.empty(c.n_expert, D))
        self.experts = Experts(c.n_expert, D, c.moe_ff)


class Qwen3Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Parameter(torch.empty(c.vocab, c.hidden))
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.n_layer))
        self.norm = nn.Parameter(torch.ones(c.hidden))
        self.lm_head = nn.Parameter(torch.empty(c.vocab, c.hidden))
        hd = c.head_dim
        self.register_buffer(
            "inv_freq",
            1.0 / (c.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)),
            persistent=False)

    def init_weights(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue
            with torch.no_grad():
                p.normal_(0.0, std, generator=g)
                if name.endswith("o_proj") or ".down_proj." in name:
                    p.mul_(1.0 / math.sqrt(2 * self.c.n_layer))

    def rope(self, n, device):
        pos = torch.arange(n, dtype=torch.float64)
        ang = pos[:, None] * self.inv_freq[None, :]  # [n, hd/2], in f64 then rounded to f32
        return torch.cos(ang).float(), torch.sin(ang).float()

    @staticmethod
    def apply_rope(x, cos, sin):  # x [B, H, T, hd]; pairs (i, i + hd/2)
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def moe(self, L, h):
        """h [N, D] -> (out [N, D], router probabilities [N, E], chosen ids [N, k])."""
        c = self.c
        probs = torch.softmax(h @ L.gate.t(), dim=-1)
        w, ids = torch.topk(probs, c.top_k, dim=-1)  # ties: torch picks the lower index
        if c.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        ex = L.experts
        flat_ids = ids.reshape(-1)
        flat_w = w.reshape(-1)
        tok = torch.arange(h.shape[0], device=h.device).repeat_interleave(c.top_k)
        order = torch.argsort(flat_ids)
        counts = torch.bincount(flat_ids, minlength=c.n_expert).tolist()
        start = 0
        for e, cnt in enumerate(counts):
            if cnt == 0:
                continue
            sel = order[start:start + cnt]
            start += cnt
            t = tok[sel]
            x = h[t]
            y = (F.silu(x @ ex.gate_proj[e].t()) * (x @ ex.up_proj[e].t())) @ ex.down_proj[e].t()
            out.index_add_(0, t, y * flat_w[sel, None])
        return out, probs, ids

    def forward(self, ids, return_aux=False):
        """ids [B, T] -> logits [B, T, V] (and the load-balancing loss when return_aux)."""
        c = self.c
        B, T = ids.shape
        hd = c.head_dim
        x = self.embed_tokens[ids]
        cos, sin = self.rope(T, ids.device)
        mask = torch.full((T, T), float("-inf")).triu(1)
        aux = 0.0
        for L in self.layers:
            h = rms_norm(x, L.input_layernorm, c.eps)
            q = (h @ L.q_proj.t()).view(B, T, c.n_head, hd)
            k = (h @ L.k_proj.t()).view(B, T, c.n_kv, hd)
            v = (h @ L.v_proj.t()).view(B, T, c.n_kv, hd)
            q = rms_norm(q, L.q_norm, c.eps).transpose(1, 2)
            k = rms_norm(k, L.k_norm, c.eps).transpose(1, 2)
            v = v.transpose(1, 2)
            q = self.apply_rope(q, cos, sin)
            k = self.apply_rope(k, cos, sin)
            rep = c.n_head // c.n_kv  # query head j uses kv head j // rep
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)) + mask
            a = torch.softmax(s, dim=-1) @ v
            a = a.transpose(1, 2).reshape(B, T, c.n_head * hd)
            x = x + a @ L.o_proj.t()
            h = rms_norm(x, L.post_attention_layernorm, c.eps).reshape(B * T, -1)
            y, probs, chosen = self.moe(L, h)
            x = x + y.view(B, T, -1)
            if return_aux:  # Switch-style balance: E · Σ_e (share routed to e) · (mean prob of e)
                frac = torch.bincount(chosen.reshape(-1), minlength=c.n_expert).float()
                frac = frac / chosen.numel()
                aux = aux + c.n_expert * (frac * probs.mean(0)).sum()
        logits = rms_norm(x, self.norm, c.eps) @ self.lm_head.t()
        return (logits, aux) if return_aux else logits

    # --- Hugging Face tensor names --------------------------------------------------------
    def hf_tensors(self):
        """(name, f32 tensor) in Hugging Face's qwen3_moe layout."""
        out = [("model.embed_tokens.weight", self.embed_tokens)]
        for i, L in enumerate(self.layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", L.input_layernorm),
                (p + "self_attn.q_proj.weight", L.q_proj),
                (p + "self_attn.k_proj.weight", L.k_proj),
                (p + "self_attn.v_proj.weight", L.v_proj),
                (p + "self_attn.o_proj.weight", L.o_proj),
                (p + "self_attn.q_norm.weight", L.q_norm),
                (p + "self_attn.k_norm.weight", L.k_norm),
                (p + "post_attention_layernorm.weight", L.post_attention_layernorm),
                (p + "mlp.gate.weight", L.gate),
            ]
            for e in range(self.c.n_expert):
                q = f"{p}mlp.experts.{e}."
                out += [(q + "gate_proj.weight", L.experts.gate_proj[e]),
                        (q + "up_proj.weight", L.experts.up_proj[e]),
                        (q + "down_proj.weight", L.experts.down_proj[e])]
        out += [("model.norm.weight", self.norm), ("lm_head.weight", self.lm_head)]
        return [(n, t.detach().float().contiguous()) for n, t in out]

    def load_hf(self, tensors):
        """Sets the parameters from {name: tensor} (any float dtype; widened to f32)."""
        with torch.no_grad():
            for name, _ in self.hf_tensors():
                src = tensors[name].float()
                dst = self._param_for(name)
                dst.copy_(src)

    def _param_for(self, name):
        if name == "model.embed_tokens.weight":
            return self.embed_tokens
        if name == "model.norm.weight":
            return self.norm
        if name == "lm_head.weight":
            return self.lm_head
        parts = name.split(".")
        L = self.layers[int(parts[2])]
        if parts[3] == "mlp" and parts[4] == "experts":
            return getattr(L.experts, parts[6])[int(parts[5])]
        if parts[3] == "mlp":
            return L.gate
        if parts[3] == "self_attn":
            return getattr(L, parts[4])
        return getattr(L, parts[3])


# --- safetensors ------------------------------------------------------------------------------
# File: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
# data_offsets: [begin, end)} relative to the data that follows, "__metadata__": {...}}, data.

kStDtypes = {"BF16": (2, None), "F32": (4, "<f4"), "F8_E4M3": (1, "u1"), "F16": (2, "<f2")}


def bf16_bits(t):
    """f32 tensor -> numpy uint16 of its bf16 rounding (to nearest, ties to even)."""
    return t.detach().float().contiguous().to(torch.bfloat16).view(torch.int16).numpy().view("<u2")


def read_safetensors(path):
    """{name: (dtype string, shape, numpy array of raw values)}; BF16 as uint16 bits."""
    out = {}
    for name, dt, shape, raw in safetensors_io.read_safetensors(path):
        arr = raw.view("<u2") if dt == "BF16" else raw.view(kStDtypes[dt][1])
        out[name] = (dt, shape, arr.reshape(shape))
    return out


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def load_model_dir_tensors(model_dir):
    """{name: f32 torch tensor} of a bf16/f32 model directory (model.safetensors)."""
    out = {}
    for name, (dt, shape, arr) in read_safetensors(os.path.join(model_dir, "model.safetensors")).items():
        if dt == "BF16":
            out[name] = torch.from_numpy(bf16_to_f32(np.asarray(arr)).copy())
        elif dt == "F32":
            out[name] = torch.from_numpy(np.asarray(arr).astype(np.float32))
        else:
            raise ValueError(f"{name}: dtype {dt}")
    return out


def write_index(model_dir, entries, total):
    index = {"metadata": {"total_size": total},
             "weight_map": {name: "model.safetensors" for name, _, _, _ in entries}}
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def save_bf16_model_dir(model, model_dir, template_dir, config_dict):
    """model_dir/{config.json, tokenizer*, generation_config.json, model.safetensors(+index)}."""
    import shutil
    os.makedirs(model_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(template_dir, name), os.path.join(model_dir, name))
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
        f.write("\n")
    entries = [(n, "BF16", t.shape, bf16_bits(t).tobytes()) for n, t in model.hf_tensors()]
    total = safetensors_io.write_safetensors(os.path.join(model_dir, "model.safetensors"), entries)
    write_index(model_dir, entries, total)
