#!/usr/bin/env python3
"""Converts a Hugging Face qwen3_moe directory (bf16 safetensors) into a GGUF v3 file that
llama.cpp loads as arch "qwen3moe", so llama.cpp can be benchmarked on the same weights as duet.

Usage: to_gguf.py MODEL_DIR OUT.gguf [--f16]

Matrices stay bf16 byte for byte (or, with --f16, are rounded to f16: the same bytes per weight,
for CPUs without AVX-512 BF16, where llama.cpp's f16 kernels may be the faster ones); norm vectors and the MoE router are widened to f32 (as
llama.cpp's own converter does). Each layer's experts are stacked into one 3-D tensor per projection. Only numpy is needed.

GGUF facts this relies on (read from llama.cpp's gguf docs and src/models/qwen3moe.cpp):
  - header: "GGUF", u32 version 3, u64 n_tensors, u64 n_kv; then the key/values; then per tensor
    name, u32 n_dims, u64 ne[n_dims] (fastest-varying first, i.e. numpy's shape reversed),
    u32 ggml_type, u64 offset into the data section; the data section starts at the next multiple
    of general.alignment (32) and each tensor's offset is a multiple of it too.
  - ggml_type F32 = 0, F16 = 1, BF16 = 30.
"""

import json
import os
import struct
import sys

import numpy as np

kAlignment = 32
kGgmlF32 = 0
kGgmlF16 = 1
kGgmlBf16 = 30
kFileTypeMostlyF16 = 1  # LLAMA_FTYPE_MOSTLY_F16
kFileTypeMostlyBf16 = 32  # llama_ftype LLAMA_FTYPE_MOSTLY_BF16

# GGUF metadata value types.
kU32, kI32, kF32, kBool, kString, kArray = 4, 5, 6, 7, 8, 9

# llama_token_type values stored in tokenizer.ggml.token_type.
kTokenNormal, kTokenControl = 1, 3


class SafetensorsShards:
    """Reads tensors of a sharded safetensors checkpoint without loading whole files."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        self.entries_ = {}  # name -> (memmap of the shard, header entry, data start)
        for shard in sorted(set(weight_map.values())):
            path = os.path.join(model_dir, shard)
            with open(path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
            data = np.memmap(path, dtype=np.uint8, mode="r")
            for name, entry in header.items():
                if name != "__metadata__":
                    self.entries_[name] = (data, entry, 8 + header_len)

    def raw_bf16(self, name):
        """Returns the tensor's bytes as a uint16 array of its shape (bf16 bit patterns)."""
        data, entry, start = self.entries_[name]
        if entry["dtype"] != "BF16":
            raise ValueError(f"{name}: expected BF16, got {entry['dtype']}")
        begin, end = entry["data_offsets"]
        return data[start + begin : start + end].view(np.uint16).reshape(entry["shape"])


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class GgufWriter:
    """Collects key/values and tensors, then writes one GGUF v3 file."""

    def __init__(self):
        self.kv_ = []  # (key, encoded type+value bytes)
        self.tensors_ = []  # (name, numpy array in row-major order, ggml type)

    def add_u32(self, key, v):
        self.kv_.append((key, struct.pack("<I", kU32) + struct.pack("<I", v)))

    def add_i32(self, key, v):
        self.kv_.append((key, struct.pack("<I", kI32) + struct.pack("<i", v)))

    def add_f32(self, key, v):
        self.kv_.append((key, struct.pack("<I", kF32) + struct.pack("<f", v)))

    def add_bool(self, key, v):
        self.kv_.append((key, struct.pack("<I", kBool) + struct.pack("<B", int(v))))

    def add_string(self, key, v):
        self.kv_.append((key, struct.pack("<I", kString) + _gguf_string(v)))

    def add_string_array(self, key, values):
        body = b"".join(_gguf_string(v) for v in values)
        head = struct.pack("<IIQ", kArray, kString, len(values))
        self.kv_.append((key, head + body))

    def add_i32_array(self, key, values):
        arr = np.asarray(values, dtype="<i4")
        head = struct.pack("<IIQ", kArray, kI32, len(arr))
        self.kv_.append((key, head + arr.tobytes()))

    def add_tensor(self, name, array, ggml_type):
        self.tensors_.append((name, array, ggml_type))

    def write(self, path):
        infos = []
        offset = 0
        for name, array, ggml_type in self.tensors_:
            ne = list(reversed(array.shape))  # GGUF lists the fastest-varying dim first
            info = _gguf_string(name) + struct.pack("<I", len(ne))
            info += b"".join(struct.pack("<Q", n) for n in ne)
            info += struct.pack("<IQ", ggml_type, offset)
            infos.append(info)
            offset = _align(offset + array.nbytes)
        with open(path, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors_), len(self.kv_)))
            for key, value in self.kv_:
                f.write(_gguf_string(key) + value)
            for info in infos:
                f.write(info)
            f.write(b"\0" * (_align(f.tell()) - f.tell()))
            data_start = f.tell()
            for name, array, _ in self.tensors_:
                f.write(np.ascontiguousarray(array).tobytes())
                f.write(b"\0" * (_align(f.tell() - data_start) - (f.tell() - data_start)))


def _gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _align(n):
    return (n + kAlignment - 1) // kAlignment * kAlignment


def add_hparams(w, cfg, file_type):
    arch = "qwen3moe"
    w.add_string("general.architecture", arch)
    w.add_string("general.name", "qwen3-moe-small")
    w.add_u32("general.alignment", kAlignment)
    w.add_u32("general.file_type", file_type)
    w.add_u32(f"{arch}.block_count", cfg["num_hidden_layers"])
    w.add_u32(f"{arch}.context_length", cfg["max_position_embeddings"])
    w.add_u32(f"{arch}.embedding_length", cfg["hidden_size"])
    w.add_u32(f"{arch}.feed_forward_length", cfg["intermediate_size"])
    w.add_u32(f"{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    w.add_u32(f"{arch}.expert_count", cfg["num_experts"])
    w.add_u32(f"{arch}.expert_used_count", cfg["num_experts_per_tok"])
    w.add_u32(f"{arch}.attention.head_count", cfg["num_attention_heads"])
    w.add_u32(f"{arch}.attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_u32(f"{arch}.attention.key_length", cfg["head_dim"])
    w.add_u32(f"{arch}.attention.value_length", cfg["head_dim"])
    w.add_f32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_u32(f"{arch}.rope.dimension_count", cfg["head_dim"])
    w.add_f32(f"{arch}.rope.freq_base", cfg["rope_theta"])
    if not cfg.get("norm_topk_prob", False):
        # llama.cpp's qwen3moe graph always renormalises the top-k weights.
        raise ValueError("norm_topk_prob=false is not what llama.cpp's qwen3moe computes")


def add_tokenizer(w, model_dir, cfg):
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        tok_cfg = json.load(f)
    if tok["model"]["type"] != "BPE":
        raise ValueError("only byte-level BPE tokenizers are handled")
    n_vocab = cfg["vocab_size"]
    tokens = [None] * n_vocab
    types = [kTokenNormal] * n_vocab
    for text, i in tok["model"]["vocab"].items():
        tokens[i] = text
    for added in tok["added_tokens"]:
        tokens[added["id"]] = added["content"]
        if added.get("special", False):
            types[added["id"]] = kTokenControl
    for i, t in enumerate(tokens):
        if t is None:  # ids the tokenizer never produces (vocab padded past the tokenizer)
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")  # the tokenizer's split regex is Qwen2's
    w.add_string_array("tokenizer.ggml.tokens", tokens)
    w.add_i32_array("tokenizer.ggml.token_type", types)
    w.add_string_array("tokenizer.ggml.merges", merges)
    w.add_u32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    w.add_u32("tokenizer.ggml.eos_token_id", cfg["eos_token_id"])
    w.add_u32("tokenizer.ggml.padding_token_id", cfg["bos_token_id"])
    w.add_bool("tokenizer.ggml.add_bos_token", bool(tok_cfg.get("add_bos_token", False)))
    if "chat_template" in tok_cfg:
        w.add_string("tokenizer.chat_template", tok_cfg["chat_template"])


def add_tensors(w, st, cfg, f16):
    f32 = lambda name: bf16_to_f32(st.raw_bf16(name))
    # The matrices' dtype: bf16 bits as stored, or rounded to f16.
    mat = (lambda name: f32(name).astype(np.float16)) if f16 else st.raw_bf16
    kMat = kGgmlF16 if f16 else kGgmlBf16
    w.add_tensor("token_embd.weight", mat("model.embed_tokens.weight"), kMat)
    w.add_tensor("output_norm.weight", f32("model.norm.weight"), kGgmlF32)
    w.add_tensor("output.weight", mat("lm_head.weight"), kMat)
    for il in range(cfg["num_hidden_layers"]):
        hf = f"model.layers.{il}."
        blk = f"blk.{il}."
        w.add_tensor(blk + "attn_norm.weight", f32(hf + "input_layernorm.weight"), kGgmlF32)
        for ours, theirs in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")):
            # HF [out, in] row-major == GGUF ne [in, out]
            w.add_tensor(blk + f"attn_{ours}.weight", mat(hf + f"self_attn.{theirs}_proj.weight"),
                         kMat)
        w.add_tensor(blk + "attn_q_norm.weight", f32(hf + "self_attn.q_norm.weight"), kGgmlF32)
        w.add_tensor(blk + "attn_k_norm.weight", f32(hf + "self_attn.k_norm.weight"), kGgmlF32)
        w.add_tensor(blk + "ffn_norm.weight", f32(hf + "post_attention_layernorm.weight"), kGgmlF32)
        # [n_expert, n_embd] -> GGUF ne [n_embd, n_expert]; f32 as llama.cpp's converter keeps
        # the router (ggml then multiplies it by f32 activations, not ones rounded to bf16)
        w.add_tensor(blk + "ffn_gate_inp.weight", f32(hf + "mlp.gate.weight"), kGgmlF32)
        for proj in ("gate", "up", "down"):
            # [n_expert, out, in] -> GGUF ne [in, out, n_expert]
            stacked = np.stack([mat(hf + f"mlp.experts.{e}.{proj}_proj.weight")
                                for e in range(cfg["num_experts"])])
            w.add_tensor(blk + f"ffn_{proj}_exps.weight", stacked, kMat)


def main():
    args = [a for a in sys.argv[1:] if a != "--f16"]
    f16 = len(args) != len(sys.argv) - 1
    if len(args) != 2:
        sys.exit(__doc__)
    model_dir, out_path = args
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg["model_type"] != "qwen3_moe" or cfg.get("tie_word_embeddings", False):
        raise ValueError("expects an untied qwen3_moe checkpoint")
    w = GgufWriter()
    add_hparams(w, cfg, kFileTypeMostlyF16 if f16 else kFileTypeMostlyBf16)
    add_tokenizer(w, model_dir, cfg)
    add_tensors(w, SafetensorsShards(model_dir), cfg, f16)
    w.write(out_path)
    print(f"wrote {out_path}: {len(w.tensors_)} tensors, {os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    main()
