"""Random tiny Hugging Face model directories for testing the reference without the engine.

The configs mirror duet's "tiny" presets (hidden 64, vocab 512); weights are N(0, 1/fan_in)
matrices and norm weights near 1, from a seeded NumPy generator.
"""

import json
import os

import numpy as np

from safetensors_np import write_model_dir

BASE = {
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False,
    },
    "mixtral": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 32, "num_local_experts": 8,
        "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
        "max_position_embeddings": 4096, "sliding_window": None, "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
    "deepseek_v2": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "greedy", "n_group": 1,
        "topk_group": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
        "scoring_func": "softmax", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False,
    },
}


def _mlp(prefix, n_embd, n_ff):
    return {prefix + "gate_proj.weight": (n_ff, n_embd), prefix + "up_proj.weight": (n_ff, n_embd),
            prefix + "down_proj.weight": (n_embd, n_ff)}


def _qwen3_moe_shapes(c):
    h, hd = c["hidden_size"], c["head_dim"]
    s = {}
    for il in range(c["num_hidden_layers"]):
        p = f"model.layers.{il}."
        s.update({p + "self_attn.q_proj.weight": (c["num_attention_heads"] * hd, h),
                  p + "self_attn.k_proj.weight": (c["num_key_value_heads"] * hd, h),
                  p + "self_attn.v_proj.weight": (c["num_key_value_heads"] * hd, h),
                  p + "self_attn.o_proj.weight": (h, c["num_attention_heads"] * hd),
                  p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        sparse = (il not in c["mlp_only_layers"] and c["num_experts"] > 0
                  and (il + 1) % c["decoder_sparse_step"] == 0)
        if sparse:
            s[p + "mlp.gate.weight"] = (c["num_experts"], h)
            for e in range(c["num_experts"]):
                s.update(_mlp(f"{p}mlp.experts.{e}.", h, c["moe_intermediate_size"]))
        else:
            s.update(_mlp(p + "mlp.", h, c["intermediate_size"]))
    return s


def _mixtral_shapes(c):
    h = c["hidden_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    s = {}
    for il in range(c["num_hidden_layers"]):
        p = f"model.layers.{il}."
        s.update({p + "self_attn.q_proj.weight": (c["num_attention_heads"] * hd, h),
                  p + "self_attn.k_proj.weight": (c["num_key_value_heads"] * hd, h),
                  p + "self_attn.v_proj.weight": (c["num_key_value_heads"] * hd, h),
                  p + "self_attn.o_proj.weight": (h, c["num_attention_heads"] * hd),
                  p + "block_sparse_moe.gate.weight": (c["num_local_experts"], h)})
        for e in range(c["num_local_experts"]):
            q = f"{p}block_sparse_moe.experts.{e}."
            ff = c["intermediate_size"]
            s.update({q + "w1.weight": (ff, h), q + "w3.weight": (ff, h), q + "w2.weight": (h, ff)})
    return s


def _deepseek_v2_shapes(c):
    h, nh = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    s = {}
    for il in range(c["num_hidden_layers"]):
        p = f"model.layers.{il}.self_attn."
        if c["q_lora_rank"] is None:
            s[p + "q_proj.weight"] = (nh * qk, h)
        else:
            s.update({p + "q_a_proj.weight": (c["q_lora_rank"], h), p + "q_a_layernorm.weight": (c["q_lora_rank"],),
                      p + "q_b_proj.weight": (nh * qk, c["q_lora_rank"])})
        s.update({p + "kv_a_proj_with_mqa.weight": (c["kv_lora_rank"] + c["qk_rope_head_dim"], h),
                  p + "kv_a_layernorm.weight": (c["kv_lora_rank"],),
                  p + "kv_b_proj.weight": (nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]),
                  p + "o_proj.weight": (h, nh * c["v_head_dim"])})
        p = f"model.layers.{il}.mlp."
        moe = (c["n_routed_experts"] is not None and il >= c["first_k_dense_replace"]
               and il % c["moe_layer_freq"] == 0)
        if moe:
            s[p + "gate.weight"] = (c["n_routed_experts"], h)
            for e in range(c["n_routed_experts"]):
                s.update(_mlp(f"{p}experts.{e}.", h, c["moe_intermediate_size"]))
            if c["n_shared_experts"]:
                s.update(_mlp(p + "shared_experts.", h, c["moe_intermediate_size"] * c["n_shared_experts"]))
        else:
            s.update(_mlp(p, h, c["intermediate_size"]))
    return s


SHAPES = {"qwen3_moe": _qwen3_moe_shapes, "mixtral": _mixtral_shapes, "deepseek_v2": _deepseek_v2_shapes}


def tiny_tensors(config, seed):
    """{name: float32 array} of the Hugging Face layout of `config`, random."""
    rng = np.random.default_rng(seed)
    h, v = config["hidden_size"], config["vocab_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (v, h)
    for il in range(config["num_hidden_layers"]):
        shapes[f"model.layers.{il}.input_layernorm.weight"] = (h,)
        shapes[f"model.layers.{il}.post_attention_layernorm.weight"] = (h,)
    shapes.update(SHAPES[config["model_type"]](config))
    tensors = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if len(shape) == 1:  # norm weights
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name == "model.embed_tokens.weight":
            tensors[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            tensors[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return tensors


def make_tiny(model_dir, arch, overrides=None, seed=0, dtype="F32", n_shards=1):
    """Writes config.json and weights of a random tiny `arch` model; returns the config."""
    config = dict(BASE[arch])
    config.update(overrides or {})
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_model_dir(model_dir, tiny_tensors(config, seed), dtype, n_shards)
    return config
