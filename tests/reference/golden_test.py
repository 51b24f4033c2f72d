#!/usr/bin/python3
"""Golden-logits test: duet against the independent NumPy reference.

    /usr/bin/python3 tests/reference/golden_test.py --duet build/duet [--isa NAME] [-k pattern] [-v]
    (or DUET=build/duet /usr/bin/python3 tests/reference/golden_test.py)

--isa runs the engine's kernels on that instruction set (DUET_MATMUL_ISA: avx512bf16,
avx512bf16-emulated, avx512, avx2, scalar); a CPU without it exits with 77 (CTest: skipped).

For each configuration: `duet make-model` writes a random model directory (fixed seed), `duet
generate --dump-logits` runs a 32-token prompt and 4 greedy steps, and the reference recomputes
both from the same directory (float64, from the stored weights).

Metric, f32 weights: at every prompt position t,
    max_j |duet[t, j] - ref[t, j]|  <=  1e-4 * max(1, max_j |ref[t, j]|)
and the printed "max rel err" is the largest left side divided by the right side's scale. The
greedy ids must equal the reference's greedy continuation (run through its KV cache).

bf16 weights: the reference reads the same bf16 tensors widened to f32 and computes with the
numerics the engine uses on the instruction set in use:
  - it rounds the K/V rows it caches (DeepSeek: the latent) to bf16, as duet's KV cache does by
    default for bf16 weights (`--kv-cache-dtype auto`);
  - where the engine multiplies bf16 pairs (avx512bf16 and its emulation: vdpbf16ps, as llama.cpp
    and oneDNN on such CPUs), it rounds the input of every product with a bf16 weight to bf16
    (ref_common.DecoderModel.act_bf16), and attention's q and probabilities (attn_bf16, as the
    engine's attention over bf16 K/V rows there); elsewhere it keeps them f32, as the engine does.
    Rounding a probability is a step: where the reference's float64 softmax and the engine's f32
    one fall on either side of a bf16 rounding boundary (about one probability in 2^15), a
    probability moves by one bf16 step, and at these short prompts (probabilities up to 0.5) the
    logits after it by up to 5e-3 (deepseek_v3_bf16 from position 9; the other cases agree to
    1e-7). Those cases are held to BF16_PAIRS_RTOL; the attention kernel itself is checked
    against its rounded textbook version and its emulation in tests/kernels/attend_test.cpp.
The logits must be within 2e-3 * max(1, max |ref row|) at every position and the argmax must agree
wherever the reference's top-1/top-2 gap exceeds 1e-3 of that scale. Measured (Zen 4): f32
products 5e-7 (DeepSeek), 5e-5 (Qwen3), 3e-4 (Mixtral); bf16-rounded products 3e-4 (Qwen3), 6e-4
(Mixtral, DeepSeek), median 6e-8. Against a reference that does not round the products' inputs,
the bf16 path is off by 5e-3 (Qwen3), 7e-2 (DeepSeek) and 0.32 (Mixtral): there rounding alone
sends one token of one layer to another expert (a top-2 margin of 7e-4); the report line names
where the two references first route apart, with both margins.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ref_common import first_parting  # noqa: E402
from ref_model import greedy, load_model, read_config, top2_gap  # noqa: E402

SEED = 1234
N_PROMPT = 32
MAX_TOKENS = 4
RTOL = 1e-4          # f32 logits, relative to max(1, max |ref row|)
BF16_TIE_RTOL = 1e-3  # bf16: argmax compared where the reference's top-2 gap is larger than this
BF16_RTOL = 2e-3  # bf16 logits against the reference of the same numerics (measured 5e-7 to 6e-4)
# The same where attention also rounds its probabilities to bf16 (a step function: see below).
BF16_PAIRS_RTOL = 1e-2
SKIP_EXIT = 77  # CTest's SKIP_RETURN_CODE: the CPU lacks the requested instruction set
ISA = ""  # --isa: the engine's instruction set (DUET_MATMUL_ISA); "" = the engine's choice
COMMAND_TIMEOUT = 120

YARN_DS = {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32,
           "beta_slow": 1, "original_max_position_embeddings": 4096}


class Case:
    def __init__(self, name, arch, overrides=None, dtype="f32", n_prompt=N_PROMPT):
        self.name, self.arch, self.overrides, self.dtype = name, arch, overrides or {}, dtype
        self.n_prompt = n_prompt


CASES = [
    Case("qwen3_moe_tiny", "qwen3_moe"),
    Case("qwen3_moe_dense_layer0", "qwen3_moe", {"mlp_only_layers": [0]}),
    Case("qwen3_moe_sparse_step2", "qwen3_moe", {"decoder_sparse_step": 2}),
    # HF yarn: the configured factor is used although original_max_position_embeddings is given
    # (transformers before the fix of issue 38224 replaced it by max_position_embeddings / 1024).
    Case("qwen3_moe_yarn", "qwen3_moe",
         {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}}),
    Case("mixtral_tiny", "mixtral"),
    Case("deepseek_v2_tiny", "deepseek_v2"),
    Case("deepseek_v2_q_lora", "deepseek_v2", {"q_lora_rank": 24}),
    # top-3 from 2 of 4 groups: with top-2 the group limit could never change a choice.
    Case("deepseek_v2_group_limited", "deepseek_v2",
         {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3}),
    Case("deepseek_v2_yarn", "deepseek_v2", {"rope_scaling": YARN_DS}),
    Case("deepseek_v2_norm_topk_scaling16", "deepseek_v2", {"norm_topk_prob": True, "routed_scaling_factor": 16.0}),
    Case("deepseek_v2_scaling2_5", "deepseek_v2", {"norm_topk_prob": False, "routed_scaling_factor": 2.5}),
    Case("deepseek_v2_shared2_freq2", "deepseek_v2",
         {"n_shared_experts": 2, "first_k_dense_replace": 0, "moe_layer_freq": 2}),
    # The preset: noaux_tc over 4 groups of 2 experts (2 kept), top-2, renormalised and scaled by
    # 2.5, the correction bias, a dense first layer, a low-rank query, one MTP layer in the files.
    Case("deepseek_v3_tiny", "deepseek_v3"),
    Case("deepseek_v3_no_groups", "deepseek_v3", {"n_group": 1, "topk_group": 1}),
    Case("deepseek_v3_top3_unnormalised", "deepseek_v3",
         {"num_experts_per_tok": 3, "norm_topk_prob": False, "routed_scaling_factor": 1.5}),
    Case("deepseek_v3_no_mtp", "deepseek_v3", {"num_nextn_predict_layers": 0}),
    # Past 512 positions MLA attends in parts of 512 merged by their log-sum-exp (mla_attend).
    Case("deepseek_v3_long_context", "deepseek_v3", n_prompt=600),
    Case("deepseek_v3_bf16", "deepseek_v3", dtype="bf16"),
    # Kimi K2's layout (model_type kimi_k2): one expert group, no MTP layer, scaling 2.827, rope
    # theta 50000, and a tiktoken tokenizer (prompts here are ids).
    Case("deepseek_v3_kimi_k2", "kimi_k2"),
    Case("qwen3_moe_bf16", "qwen3_moe", dtype="bf16"),
    Case("mixtral_bf16", "mixtral", dtype="bf16"),
    Case("deepseek_v2_bf16", "deepseek_v2", dtype="bf16"),
]

DUET = None  # path of the engine binary, set by main()


def prompt_ids(n_vocab, n=N_PROMPT):
    """A fixed prompt of n ids spread over the vocabulary."""
    return [(7 * i * i + 3 * i + 1) % n_vocab for i in range(n)]


def run(cmd):
    """Runs a command (the engine on ISA); fails the test with its output when it exits non-zero."""
    env = dict(os.environ, DUET_MATMUL_ISA=ISA) if ISA else None
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                          timeout=COMMAND_TIMEOUT, env=env)
    if done.returncode != 0:
        raise AssertionError(f"command failed ({done.returncode}): {' '.join(cmd)}\n"
                             f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}")
    return done


def eos_ids(model_dir):
    """End-of-sequence ids from config.json / generation_config.json (the engine may stop there)."""
    ids = set()
    for file in ("config.json", "generation_config.json"):
        path = os.path.join(model_dir, file)
        if os.path.exists(path):
            with open(path) as f:
                value = json.load(f).get("eos_token_id")
            if value is not None:
                ids.update(value if isinstance(value, list) else [value])
    return ids


def accepted_generations(ref_ids, eos):
    """The engine's greedy ids may be the full reference continuation, or stop at the first
    end-of-sequence id (with or without emitting it)."""
    ok = [list(ref_ids)]
    for i, t in enumerate(ref_ids):
        if t in eos:
            ok += [list(ref_ids[:i]), list(ref_ids[:i + 1])]
            break
    return ok


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return set(f.read().split())
    except OSError:
        return set()


AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"}
ISA_FLAGS = {"avx512bf16": AVX512 | {"avx512_bf16"}, "avx512bf16-emulated": AVX512, "avx512": AVX512,
             "avx2": {"avx2", "fma"}, "scalar": set()}


def engine_isa():
    """The instruction set the engine's kernels use: ISA, else DUET_MATMUL_ISA, else the widest
    the CPU runs (as simd::choose_isa)."""
    isa = ISA or os.environ.get("DUET_MATMUL_ISA", "")
    if isa:
        return isa
    flags = cpu_flags()
    return next(name for name in ("avx512bf16", "avx512", "avx2", "scalar") if ISA_FLAGS[name] <= flags)


def rounds_activations():
    """Whether duet's kernels round the inputs of products with bf16 weights to bf16 (vdpbf16ps
    or its emulation)."""
    return engine_isa() in ("avx512bf16", "avx512bf16-emulated")


def row_scale(ref):
    return np.maximum(1.0, np.abs(ref).max(axis=1))  # [n_prompt]


def report(case, msg):
    print(f"golden {case.name}: {msg}", file=sys.stderr, flush=True)


class GoldenTest(unittest.TestCase):
    def check(self, case):
        if not DUET:
            self.skipTest("no engine: pass --duet PATH or set DUET")
        with tempfile.TemporaryDirectory(prefix="duet_golden_") as tmp:
            model_dir = os.path.join(tmp, "model")
            cmd = [DUET, "make-model", model_dir, "--arch", case.arch, "--preset", "tiny",
                   "--seed", str(SEED), "--dtype", case.dtype]
            if case.overrides:
                cmd += ["--hf-overrides", json.dumps(case.overrides)]
            t0 = time.monotonic()
            run(cmd)
            config = read_config(model_dir)
            for key, value in case.overrides.items():
                self.assertEqual(config.get(key), value, f"make-model did not apply override {key}")
            prompt = prompt_ids(int(config["vocab_size"]), case.n_prompt)
            dump = os.path.join(tmp, "logits.json")
            run([DUET, "generate", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
                 "--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--dump-logits", dump])
            t_engine = time.monotonic() - t0
            with open(dump) as f:
                got = json.load(f)

            model = load_model(model_dir)
            # duet's default --kv-cache-dtype auto keeps bf16 K/V rows for bf16 weights: the
            # reference rounds what it caches the same way.
            model.kv_bf16 = case.dtype == "bf16"
            model.act_bf16 = rounds_activations()
            missing, extra = model.tensor_name_mismatch()
            self.assertEqual((missing[:8], extra[:8]), ([], []), "tensor names differ from the HF layout")
            ref = greedy(model, prompt, MAX_TOKENS)
            self.assertEqual(got["tokens"], prompt)
            duet = np.asarray(got["logits"], dtype=np.float64)
            self.assertEqual(duet.shape, ref.prompt_logits.shape, "logits shape [n_prompt, n_vocab]")
            self.assertTrue(np.all(np.isfinite(duet)), "non-finite engine logits")
            if case.dtype == "f32":
                self.check_f32(case, model, ref, duet, got["generated"], eos_ids(model_dir))
            else:
                self.check_bf16(case, ref, duet, BF16_PAIRS_RTOL if model.attn_bf16 else BF16_RTOL)
                if model.act_bf16:
                    self.report_rounding(case, model_dir, prompt, model, duet)
            report(case, f"engine {t_engine:.2f}s")

    def check_f32(self, case, model, ref, duet, generated, eos):
        scale = row_scale(ref.prompt_logits)
        err = np.abs(duet - ref.prompt_logits).max(axis=1) / scale  # [n_prompt]
        worst = int(np.argmax(err))
        report(case, f"max rel err {err.max():.3g} (position {worst}), smallest routing margin "
                     f"{model.stats.min_margin:.3g}, generated {generated} vs reference {ref.generated}")
        self.assertLessEqual(
            err.max(), RTOL,
            f"logits differ at positions {np.nonzero(err > RTOL)[0].tolist()}; worst position {worst}: "
            f"rel err {err[worst]:.3g}, duet argmax {int(np.argmax(duet[worst]))} vs reference "
            f"{int(np.argmax(ref.prompt_logits[worst]))}. Smallest routing margin in the reference "
            f"{model.stats.min_margin:.3g} (near 0 means an expert choice is ill-posed)")
        # Logits within RTOL * scale of the reference cannot flip an argmax whose gap exceeds twice that.
        well_posed = next((i for i, g in enumerate(ref.gaps) if g <= 2 * RTOL * scale.max()), len(ref.gaps))
        if well_posed < len(ref.gaps):
            report(case, f"greedy step {well_posed} is a near tie; comparing the first {well_posed} ids only")
        accepted = [a[:well_posed] for a in accepted_generations(ref.generated, eos)]
        self.assertIn(list(generated)[:well_posed], accepted,
                      f"greedy ids {generated} differ from the reference's {ref.generated}")

    def check_bf16(self, case, ref, duet, rtol=BF16_RTOL):
        scale = row_scale(ref.prompt_logits)
        err = np.abs(duet - ref.prompt_logits).max(axis=1) / scale
        gaps = np.array([top2_gap(row) for row in ref.prompt_logits])
        decidable = gaps > BF16_TIE_RTOL * scale
        agree = np.argmax(duet, axis=1) == np.argmax(ref.prompt_logits, axis=1)
        report(case, f"max rel err {err.max():.3g}, argmax agrees at {int(agree.sum())}/{len(agree)} positions "
                     f"({int((~decidable).sum())} near ties)")
        bad = np.nonzero(decidable & ~agree)[0]
        self.assertEqual(bad.tolist(), [], f"argmax differs; reference top-2 gaps there {gaps[bad].tolist()}")
        self.assertLessEqual(
            err.max(), rtol,
            f"bf16 logits differ at positions {np.nonzero(err > rtol)[0].tolist()} "
            f"(worst rel err {err.max():.3g})")

    def report_rounding(self, case, model_dir, prompt, rounding, duet):
        """What rounding the products' inputs does: the engine against a reference that does not
        round them, and where the two references first route a token apart."""
        plain = load_model(model_dir)
        plain.kv_bf16 = True
        plain_logits = plain.forward(prompt)
        err = np.abs(duet - plain_logits).max(axis=1) / row_scale(plain_logits)
        parting = first_parting(plain.stats, rounding.stats)
        # Routing calls go MoE layer by MoE layer, prompt token by token.
        moe_layer, token = divmod(parting[0], len(prompt)) if parting else (0, 0)
        where = "no token routed apart" if parting is None else (
            f"token {token} first routed apart in MoE layer {moe_layer} (0-based), top-k margin "
            f"{parting[1]:.3g} unrounded, {parting[2]:.3g} rounded")
        report(case, f"against unrounded products: max rel err {err.max():.3g} at position "
                     f"{int(np.argmax(err))}; {where}")


def _make_test(case):
    def test(self):
        self.check(case)
    test.__doc__ = f"{case.name}: {case.arch} {case.dtype} {json.dumps(case.overrides)}"
    return test


for _case in CASES:
    setattr(GoldenTest, "test_" + _case.name, _make_test(_case))


def main():
    global DUET, ISA
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--duet", default=os.environ.get("DUET"))
    ap.add_argument("--isa", default="", choices=[""] + sorted(ISA_FLAGS))
    args, rest = ap.parse_known_args()
    if args.isa and not ISA_FLAGS[args.isa] <= cpu_flags():
        print(f"golden_test: this CPU lacks {args.isa}; skipped", file=sys.stderr)
        return SKIP_EXIT
    ISA = args.isa
    if args.duet:
        DUET = os.path.abspath(args.duet)
        if not os.access(DUET, os.X_OK):
            print(f"golden_test: engine binary {DUET} is missing or not executable", file=sys.stderr)
            return 2
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
