#!/usr/bin/env python3
"""Writes an fp8 copy of a bf16 (or f32) qwen3_moe model directory in DeepSeek-V3's published
format, as duet's `make-model --dtype fp8` writes it (src/model/fp8_checkpoint.cpp):

  - every 2-D tensor whose name ends in "_proj.weight" (attention q/k/v/o and the experts'
    gate/up/down) becomes F8_E4M3 codes plus "<name>_scale_inv", F32 [ceil(rows/128),
    ceil(cols/128)]: per 128 × 128 block, scale = max |w| / 448 (in f32), code = E4M3 of w / scale
    rounded to nearest, ties to even (saturating at 448; a block of zeros has scale 0, codes 0);
    the weight is code × scale_inv;
  - everything else (embeddings, norms, router, lm_head) stays bf16;
  - config.json gains quantization_config {quant_method fp8, fmt e4m3, weight_block_size
    [128, 128], activation_scheme dynamic}; the tokenizer files are copied.

Usage: to_fp8.py IN_DIR OUT_DIR      (numpy only; IN_DIR holds model.safetensors)
"""
import json
import os
import shutil
import sys

import numpy as np

import safetensors_io

kBlock = 128
kMax = 448.0


def to_f32(dtype, raw, shape):
    if dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F32":
        return raw.view("<f4").astype(np.float32).reshape(shape)
    raise ValueError(f"dtype {dtype}")


def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)  # round to nearest, ties to even (no NaNs here)
    return (u >> 16).astype("<u2")


def f32_to_e4m3(q):
    """E4M3 codes (uint8) of f32 values q, |q| <= 448 expected; round to nearest even."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    u = q.view(np.uint32)
    sign = ((u >> 31) << 7).astype(np.uint32)
    a = u & np.uint32(0x7FFFFFFF)
    sub = a < np.uint32(121 << 23)  # below 2^-6: subnormal, a multiple of 2^-9
    code_sub = np.rint(np.abs(q) * np.float32(512.0)).astype(np.uint32)  # rint: ties to even
    r = (a - np.uint32(120 << 23)).astype(np.uint32)  # wraps for subnormals: masked below
    r = r + np.uint32(0x7FFFF) + ((r >> 20) & np.uint32(1))
    code_norm = np.minimum(r >> 20, np.uint32(0x7E))
    code = np.where(sub, code_sub, code_norm)
    return (sign | code).astype(np.uint8)


def quantize_blocks(w):
    rows, cols = w.shape
    nbr, nbc = -(-rows // kBlock), -(-cols // kBlock)
    scale = np.zeros((nbr, nbc), dtype=np.float32)
    codes = np.zeros((rows, cols), dtype=np.uint8)
    for i in range(nbr):
        for j in range(nbc):
            blk = w[i * kBlock:(i + 1) * kBlock, j * kBlock:(j + 1) * kBlock]
            amax = np.float32(np.abs(blk).max())
            s = np.float32(amax / np.float32(kMax))
            scale[i, j] = s
            if s > 0:
                codes[i * kBlock:(i + 1) * kBlock, j * kBlock:(j + 1) * kBlock] = \
                    f32_to_e4m3(blk / s)
    return codes, scale


def is_fp8(name, shape):
    return len(shape) == 2 and name.endswith("_proj.weight")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                  "weight_block_size": [kBlock, kBlock],
                                  "activation_scheme": "dynamic"}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    entries = []
    n_fp8 = 0
    for name, dtype, shape, raw in safetensors_io.read_safetensors(os.path.join(src, "model.safetensors")):
        w = to_f32(dtype, raw, shape)
        if is_fp8(name, shape):
            codes, scale = quantize_blocks(w)
            entries.append((name, "F8_E4M3", shape, codes.tobytes()))
            entries.append((name + "_scale_inv", "F32", list(scale.shape),
                            scale.astype("<f4").tobytes()))
            n_fp8 += 1
        else:
            entries.append((name, "BF16", shape, f32_to_bf16_bits(w).tobytes()))

    off = safetensors_io.write_safetensors(os.path.join(dst, "model.safetensors"), entries)
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": off},
                   "weight_map": {n: "model.safetensors" for n, _, _, _ in entries}}, f, indent=2)
        f.write("\n")
    print(f"{n_fp8} tensors fp8, {len(entries) - 2 * n_fp8} bf16 -> {dst}", file=sys.stderr)


if __name__ == "__main__":
    main()
