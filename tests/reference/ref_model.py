#!/usr/bin/python3
"""Independent NumPy reference for duet's architectures: loads a Hugging Face model directory and
computes float64 logits, or a greedy continuation.

    /usr/bin/python3 tests/reference/ref_model.py DIR --prompt-ids 1,2,3 [--max-tokens 4]
        [--dump-logits OUT.json] [--kv-cache-dtype f32|bf16]

writes the same JSON as `duet generate --dump-logits`: {"tokens", "logits", "generated"}.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ref_common import Config, ConfigError, load_store  # noqa: E402
from ref_deepseek_v2 import DeepseekV2  # noqa: E402
from ref_deepseek_v3 import DeepseekV3  # noqa: E402
from ref_mixtral import Mixtral  # noqa: E402
from ref_qwen3_moe import Qwen3Moe  # noqa: E402

ARCHS = {
    "qwen3_moe": Qwen3Moe,
    "Qwen3MoeForCausalLM": Qwen3Moe,
    "deepseek_v2": DeepseekV2,
    "DeepseekV2ForCausalLM": DeepseekV2,
    "deepseek_v3": DeepseekV3,
    "DeepseekV3ForCausalLM": DeepseekV3,
    "kimi_k2": DeepseekV3,  # Kimi K2: DeepseekV3ForCausalLM's code under its own model_type
    "mixtral": Mixtral,
    "MixtralForCausalLM": Mixtral,
}


def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def load_model(model_dir):
    """The reference model for a directory, chosen by model_type (or architectures[0])."""
    raw = read_config(model_dir)
    kind = raw.get("model_type") or (raw.get("architectures") or [None])[0]
    if kind not in ARCHS:
        raise ConfigError(f"{model_dir}: architecture {kind!r} is not one of {sorted(ARCHS)}")
    return ARCHS[kind](Config(raw), load_store(model_dir))


def top2_gap(row):
    """Difference of the two largest values of a 1-D array."""
    s = np.partition(row, -2)[-2:]
    return float(s[1] - s[0])


class Generation:
    def __init__(self, prompt_logits, generated, gaps):
        self.prompt_logits = prompt_logits  # [n_prompt, n_vocab] float64
        self.generated = generated          # greedy ids, one per step
        self.gaps = gaps                    # top-1 minus top-2 logit at each greedy step


def greedy(model, prompt, n_new):
    """Prefills `prompt` through a KV cache, then takes n_new argmax steps (lower id on ties).
    Never stops early: the caller decides what an end-of-sequence id means."""
    cache = model.new_cache()
    prompt_logits = model.forward(prompt, cache)
    last = prompt_logits[-1]
    generated, gaps = [], []
    for step in range(n_new):
        token = int(np.argmax(last))
        generated.append(token)
        gaps.append(top2_gap(last))
        if step + 1 < n_new:
            last = model.forward([token], cache)[-1]
    return Generation(prompt_logits, generated, gaps)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--dump-logits", help="write {tokens, logits, generated} JSON here")
    ap.add_argument("--kv-cache-dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: round the cached K/V (MLA: latent) to bf16, as duet's bf16 KV cache")
    args = ap.parse_args(argv)
    prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    model = load_model(args.model_dir)
    model.kv_bf16 = args.kv_cache_dtype == "bf16"
    missing, extra = model.tensor_name_mismatch()
    if missing or extra:
        print(f"warning: tensors missing {missing[:5]}, unexpected {extra[:5]}", file=sys.stderr)
    gen = greedy(model, prompt, args.max_tokens)
    print(f"generated {gen.generated}; smallest routing margin {model.stats.min_margin:.3g}")
    if args.dump_logits:
        with open(args.dump_logits, "w") as f:
            json.dump({"tokens": prompt, "logits": gen.prompt_logits.tolist(), "generated": gen.generated}, f)
    return 0 if math.isfinite(float(np.abs(gen.prompt_logits).max())) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
