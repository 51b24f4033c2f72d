#!/usr/bin/python3
"""Prompts on which the tiny models decide firmly, for tests that compare two numerics.

A test that expects the same greedy tokens from two numerics (f32 against bf16 K/V rows, f32
products against products of inputs rounded to bf16, ...) is only as strong as its model's
decisions are firm: a random tiny model routes some tokens with a top-k margin of 1e-4 and then
any rounding may pick another expert and change every later logit. This module holds the
prompts such tests use (tests/engine/decisive_prompts.json, read by the C++ tests too), checks
that they are decisive, and finds new ones.

Decisive means, for the tiny model of that architecture and weight dtype (seed 1234, as
tests/engine/tiny_models.h makes it) and each prompt followed by its greedy continuation:
  - under each of the four numerics {f32, bf16} K/V rows x {f32, bf16-rounded} product inputs
    (with both, attention's q and probabilities rounded too, as the engine's attention over bf16
    rows on those instruction sets), the reference routes every token to the same experts and
    generates the same tokens;
  - every routing decision's top-k margin (probability units) is at least MIN_ROUTE_MARGIN, and
    every greedy step's top-1/top-2 logit gap is at least MIN_LOGIT_GAP times max(1, max |logit|):
    both well above how far the roundings move them (ROUTE_MOVE / LOGIT_MOVE, measured below).

A key ending in `_int4` (or `_int4_pure`) holds prompts decisive for the model whose matrices
--quantization int4 (int4_pure) quantizes are replaced by their dequantized values (the 4-bit
model departs further from the original than bf16 roundings move it, so the original's decisive
prompts need not be its); int4 keeps the output head at int8, int4_pure makes it int4 too.

    /usr/bin/python3 tests/reference/decisive_prompts.py --duet build/duet check
    /usr/bin/python3 tests/reference/decisive_prompts.py --duet build/duet find [--candidates N] \
        [--quantization int4|int4_pure] [--archs deepseek_v2,...]
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

import shutil

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ref_model import greedy, load_model, read_config, top2_gap  # noqa: E402
from safetensors_np import TensorStore, write_model_dir  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS_FILE = os.path.join(HERE, "..", "engine", "decisive_prompts.json")
SEED = 1234
MAX_TOKENS = 8          # greedy steps the C++ tests take
PROMPT_LENS = (5, 9, 13)  # one request of each length: the tests batch them together
# Measured on the tiny models (prompts of 9 tokens and 8 more, 40 prompts a model, those routed
# alike under all four numerics): the roundings move a top-k margin by at most 4.3e-3 (median
# 0.6e-3 to 1.9e-3) and a logit by at most 9e-3 of its row's scale (median 2e-3 to 5.5e-3). A
# random prompt of ~20 tokens has a margin below 1e-3 about half the time.
MIN_ROUTE_MARGIN = 5e-3
MIN_LOGIT_GAP = 2e-2
STRIDES = (53, 59, 61, 67)  # between a candidate prompt's successive ids
NUMERICS = list(itertools.product((False, True), (False, True)))  # (kv_bf16, act_bf16)


def make_tiny(duet, tmp, arch, dtype):
    path = os.path.join(tmp, f"{arch}-{dtype}")
    if not os.path.exists(path):
        subprocess.run([duet, "make-model", path, "--arch", arch, "--preset", "tiny", "--seed", str(SEED),
                        "--dtype", dtype], check=True, capture_output=True)
    return path


def quantized_at_load(name):
    """As model/quantization.cpp: every matrix but embeddings, routers and MLA's kv_b_proj (which
    is quantized split by head: dequantized_kv_b)."""
    return not name.endswith(("embed_tokens.weight", "mlp.gate.weight", "block_sparse_moe.gate.weight",
                              "self_attn.kv_b_proj.weight"))


def dequantized_kv_b(w, config, dequantize):
    """MLA's kv_b [n_head * (nope + v_dim), rank] as --quantization holds it (model/mla_heads.h,
    MlaKvB): each head's W_UK transposed ([rank, nope], groups along nope) and its W_UV as stored,
    each quantized by `dequantize`'s rule and back, in kv_b's layout."""
    nope, v_dim = config["qk_nope_head_dim"], config["v_head_dim"]
    heads = np.asarray(w, dtype=np.float32).reshape(config["num_attention_heads"], nope + v_dim, -1)
    out = np.empty_like(heads)
    for h, rows in enumerate(heads):
        out[h, :nope] = dequantize(rows[:nope].T).T
        out[h, nope:] = dequantize(rows[nope:])
    return out.reshape(w.shape)


def groups_of_32(w):
    """(w [rows, cols] as f32 in groups of 32 columns [rows, ceil(cols / 32), 32], zero-padded; cols)."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    return np.pad(w, ((0, 0), (0, (-cols) % 32))).reshape(rows, -1, 32), cols


def dequantized_int4(w):
    """w [rows, cols] quantized as kernels/quantize.h's kQ4 and back, in f32: per group of 32
    columns, d = m / -8 (m the first weight of largest magnitude), q = round(w / d) to nearest
    even, clamped to [-8, 7]."""
    g, cols = groups_of_32(w)
    m = np.take_along_axis(g, np.argmax(np.abs(g), axis=2)[..., None], axis=2)
    d = m / np.float32(-8.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d != 0, np.clip(np.rint(g / d), -8, 7), 0).astype(np.float32)
    return (d * q).reshape(g.shape[0], -1)[:, :cols]


def dequantized_int8(w):
    """w [rows, cols] quantized as kernels/quantize.h's kQ8 and back, in f32: per group of 32
    columns, d = max|w| / 127, q = round(w / d) to nearest even (the scales' 16-bit rounding, a
    relative 2^-11 or less, left out: it moves no decision these prompts are chosen by)."""
    g, cols = groups_of_32(w)
    d = np.abs(g).max(axis=2, keepdims=True) / np.float32(127.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d != 0, np.rint(g / d), 0).astype(np.float32)
    return (d * q).reshape(g.shape[0], -1)[:, :cols]


def make_int4(model_dir, pure):
    """A copy of model_dir with its int4-quantized matrices dequantized (f32); the output head
    dequantized from int8 unless `pure`, as --quantization int4 and int4_pure hold it."""
    out = model_dir + ("-int4_pure" if pure else "-int4")
    if not os.path.exists(out):
        store = TensorStore(model_dir)
        config = read_config(model_dir)
        tensors = {}
        for name in store.names():
            w = store.get(name, np.float32)
            if name.endswith("self_attn.kv_b_proj.weight"):
                tensors[name] = dequantized_kv_b(w, config, dequantized_int4)
            elif w.ndim != 2 or not quantized_at_load(name):
                tensors[name] = w
            elif name == "lm_head.weight" and not pure:
                tensors[name] = dequantized_int8(w)
            else:
                tensors[name] = dequantized_int4(w)
        write_model_dir(out, tensors)
        for f in os.listdir(model_dir):
            if not f.endswith((".safetensors", ".index.json")):
                shutil.copy(os.path.join(model_dir, f), out)
    return out


def model_for(duet, tmp, key):
    """The tiny model a key of the prompts file names: <arch>_<dtype>[_int4|_int4_pure]."""
    pure = key.endswith("_int4_pure")
    int4 = pure or key.endswith("_int4")
    arch, dtype = key.removesuffix("_pure").removesuffix("_int4").rsplit("_", 1)
    model_dir = make_tiny(duet, tmp, arch, dtype)
    return make_int4(model_dir, pure) if int4 else model_dir


def run(model_dir, prompt, kv_bf16, act_bf16):
    """(greedy ids, routing picks, smallest logit gap relative to the row scale, last logits)."""
    model = load_model(model_dir)
    model.kv_bf16, model.act_bf16 = kv_bf16, act_bf16
    gen = greedy(model, prompt, MAX_TOKENS)
    scale = max(1.0, float(np.abs(gen.prompt_logits[-1]).max()))
    return gen.generated, model.stats.picks, min(gen.gaps) / scale


def judge(model_dir, prompt):
    """(decisive?, smallest routing margin, smallest relative logit gap) over the four numerics."""
    runs = [run(model_dir, prompt, kv, act) for kv, act in NUMERICS]
    same = all(r[0] == runs[0][0] and [p[0] for p in r[1]] == [p[0] for p in runs[0][1]] for r in runs)
    margin = min(m for r in runs for _, m in r[1])
    gap = min(r[2] for r in runs)
    return same and margin >= MIN_ROUTE_MARGIN and gap >= MIN_LOGIT_GAP, margin, gap


def load_prompts():
    with open(PROMPTS_FILE) as f:
        return json.load(f)


def check(duet):
    """Every prompt set in the file is decisive; returns the number of failures."""
    failures = 0
    with tempfile.TemporaryDirectory(prefix="duet_decisive_") as tmp:
        for key, prompts in sorted(load_prompts()["prompts"].items()):
            model_dir = model_for(duet, tmp, key)
            for prompt in prompts:
                ok, margin, gap = judge(model_dir, prompt)
                print(f"{key} {prompt}: routing margin {margin:.3g}, logit gap {gap:.3g} "
                      f"{'decisive' if ok else 'NOT DECISIVE'}", file=sys.stderr)
                failures += not ok
    return failures


ARCHS = ("qwen3_moe", "deepseek_v2", "mixtral")


def find(duet, n_candidates, quantization, archs=ARCHS):
    """Searches prompt formulas for each architecture (of `archs`) and weight dtype; prints the
    JSON."""
    out = {}
    suffix = "" if quantization == "none" else "_" + quantization
    with tempfile.TemporaryDirectory(prefix="duet_decisive_") as tmp:
        for arch in archs:
            for dtype in ("f32", "bf16"):
                model_dir = model_for(duet, tmp, f"{arch}_{dtype}{suffix}")
                n_vocab = int(read_config(model_dir)["vocab_size"])
                chosen = []
                for length in PROMPT_LENS:
                    best = None
                    for c in range(n_candidates):
                        # n_vocab candidates per stride (31 · c cycles through the vocabulary),
                        # then the next stride
                        stride = STRIDES[(c // n_vocab) % len(STRIDES)]
                        prompt = [(stride * j + 31 * c + 17 * length + 2) % n_vocab for j in range(length)]
                        first = run(model_dir, prompt, False, False)
                        margin = min(m for _, m in first[1])
                        if margin < MIN_ROUTE_MARGIN or first[2] < MIN_LOGIT_GAP:
                            continue
                        ok, margin, gap = judge(model_dir, prompt)
                        if ok and (best is None or min(margin / MIN_ROUTE_MARGIN, gap / MIN_LOGIT_GAP) > best[0]):
                            best = (min(margin / MIN_ROUTE_MARGIN, gap / MIN_LOGIT_GAP), prompt, margin, gap)
                    if best is None:
                        raise SystemExit(f"no decisive prompt of length {length} for {arch} {dtype}")
                    print(f"{arch}_{dtype} len {length}: margin {best[2]:.3g} gap {best[3]:.3g}", file=sys.stderr)
                    chosen.append(best[1])
                out[f"{arch}_{dtype}{suffix}"] = chosen
    print(json.dumps({"prompts": out}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default=os.environ.get("DUET"), required=False)
    ap.add_argument("command", choices=["check", "find"])
    ap.add_argument("--candidates", type=int, default=400)
    ap.add_argument("--quantization", choices=["none", "int4", "int4_pure"], default="none",
                    help="find: prompts for the models dequantized from this quantization")
    ap.add_argument("--archs", default=",".join(ARCHS), help="find: these architectures only")
    args = ap.parse_args()
    if not args.duet:
        ap.error("--duet PATH is needed (make-model writes the tiny models)")
    if args.command == "find":
        find(os.path.abspath(args.duet), args.candidates, args.quantization, args.archs.split(","))
        return 0
    return 1 if check(os.path.abspath(args.duet)) else 0


if __name__ == "__main__":
    sys.exit(main())
