#!/usr/bin/python3
"""Checks of the NumPy reference on its own (no engine needed):

    /usr/bin/python3 tests/reference/selftest.py [-k pattern]

Each architecture and variant runs; logits are causal; a 32-token prefill equals prefill plus
token-by-token decoding through the KV cache; DeepSeek's de-interleaved rope equals rotating
interleaved pairs; naive MLA equals the absorbed (compressed-cache) form; sharded, bf16 and
single-file directories load alike; routing options have the effect the modeling code gives them.
"""

import math
import os
import sys
import tempfile
import unittest

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ref_common import (causal_attention, rms_norm, rope_cos_sin, softmax, top_k,  # noqa: E402
                        yarn_correction_range, yarn_get_mscale, yarn_inv_freq)
from ref_deepseek_v2 import deinterleave  # noqa: E402
from ref_model import greedy, load_model  # noqa: E402
from safetensors_np import TensorStore, bf16_to_f32, f32_to_bf16  # noqa: E402
from tiny_models import make_tiny  # noqa: E402

PROMPT = [(7 * i * i + 3 * i + 1) % 512 for i in range(32)]
YARN_DS = {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32,
           "beta_slow": 1, "original_max_position_embeddings": 4096}

VARIANTS = [
    ("qwen3_moe", {}),
    ("qwen3_moe", {"mlp_only_layers": [0]}),
    ("qwen3_moe", {"decoder_sparse_step": 2}),
    ("qwen3_moe", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}}),
    ("mixtral", {}),
    ("mixtral", {"sliding_window": 8}),
    ("deepseek_v2", {}),
    ("deepseek_v2", {"q_lora_rank": 24}),
    ("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3}),
    ("deepseek_v2", {"rope_scaling": YARN_DS}),
    ("deepseek_v2", {"n_shared_experts": 2, "first_k_dense_replace": 0, "moe_layer_freq": 2}),
]


class TempDirCase(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def model(self, arch, overrides=None, name="m", **kw):
        path = os.path.join(self.tmp, name)
        make_tiny(path, arch, overrides, **kw)
        return load_model(path)


class VariantTest(TempDirCase):
    def test_every_variant_runs_causal_and_cached(self):
        for arch, overrides in VARIANTS:
            with self.subTest(arch=arch, overrides=overrides):
                m = self.model(arch, overrides, name=f"{arch}_{len(overrides)}_{hash(str(overrides)) % 1000}")
                self.assertEqual(m.tensor_name_mismatch(), ([], []))
                full = m.forward(PROMPT)
                self.assertEqual(full.shape, (32, 512))
                self.assertTrue(np.all(np.isfinite(full)))
                self.assertGreater(np.abs(full).max(), 1e-3)
                # Causal: changing tokens after t leaves logits up to t alone.
                changed = PROMPT[:20] + [(t + 101) % 512 for t in PROMPT[20:]]
                other = m.forward(changed)
                np.testing.assert_allclose(other[:20], full[:20], rtol=0, atol=1e-12)
                self.assertGreater(np.abs(other[20:] - full[20:]).max(), 1e-6)
                # Prefill of 20 then one token at a time through the cache equals the full prefill.
                cache = m.new_cache()
                parts = [m.forward(PROMPT[:20], cache)] + [m.forward([t], cache) for t in PROMPT[20:]]
                np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=1e-10)

    def test_greedy_matches_recomputation(self):
        m = self.model("deepseek_v2")
        gen = greedy(m, PROMPT, 4)
        seq = list(PROMPT)
        for token in gen.generated:
            self.assertEqual(token, int(np.argmax(m.forward(seq)[-1])))
            seq.append(token)
        np.testing.assert_allclose(gen.prompt_logits, m.forward(PROMPT), rtol=0, atol=1e-10)


class LoadingTest(TempDirCase):
    def test_sharded_equals_single_file(self):
        for arch in ("qwen3_moe", "deepseek_v2"):
            single = self.model(arch, name=arch + "_1", seed=3).forward(PROMPT)
            sharded = self.model(arch, name=arch + "_3", seed=3, n_shards=3)
            self.assertTrue(os.path.exists(os.path.join(self.tmp, arch + "_3", "model.safetensors.index.json")))
            np.testing.assert_array_equal(sharded.forward(PROMPT), single)

    def test_bf16_directory_reads_the_rounded_weights(self):
        make_tiny(os.path.join(self.tmp, "f32"), "mixtral", seed=5)
        make_tiny(os.path.join(self.tmp, "bf16"), "mixtral", seed=5, dtype="BF16")
        f32, bf16 = TensorStore(os.path.join(self.tmp, "f32")), TensorStore(os.path.join(self.tmp, "bf16"))
        for name in f32.names():
            self.assertEqual(bf16.dtype(name), "BF16")
            want = bf16_to_f32(f32_to_bf16(f32.get(name, np.float32)))
            np.testing.assert_array_equal(bf16.get(name, np.float32), want)
        diff = np.abs(load_model(os.path.join(self.tmp, "bf16")).forward(PROMPT)
                      - load_model(os.path.join(self.tmp, "f32")).forward(PROMPT)).max()
        self.assertGreater(diff, 0)

    def test_bf16_rounding(self):
        x = np.array([1.0, 1.00390625, 1.005859375, -2.5, 3.0e-3], dtype=np.float32)
        # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1.0).
        np.testing.assert_array_equal(bf16_to_f32(f32_to_bf16(x))[:4],
                                      np.array([1.0, 1.0, 1.0078125, -2.5], dtype=np.float32))


class MathTest(TempDirCase):
    def test_deepseek_rope_equals_rotating_interleaved_pairs(self):
        rng = np.random.default_rng(1)
        d, pos = 8, np.arange(5, 11)
        q, k = rng.standard_normal((6, d)), rng.standard_normal((6, d))
        inv_freq = yarn_inv_freq(d, 10000.0, 40.0, 32, 1, 4096)
        cos, sin = rope_cos_sin(inv_freq, pos)

        def gptj(x):  # rotate (x[2i], x[2i+1]) by pos * inv_freq[i]
            ang = np.outer(pos, inv_freq)
            a, b = x[:, 0::2], x[:, 1::2]
            out = np.empty_like(x)
            out[:, 0::2] = a * np.cos(ang) - b * np.sin(ang)
            out[:, 1::2] = a * np.sin(ang) + b * np.cos(ang)
            return out

        def ds(x):
            x = deinterleave(x)
            half = d // 2
            return x * cos + np.concatenate([-x[:, half:], x[:, :half]], axis=1) * sin

        np.testing.assert_allclose(ds(q), deinterleave(gptj(q)), atol=1e-12)
        np.testing.assert_allclose(np.einsum("td,sd->ts", ds(q), ds(k)),
                                   np.einsum("td,sd->ts", gptj(q), gptj(k)), atol=1e-12)

    def test_mla_absorbed_equals_naive(self):
        for overrides in ({}, {"q_lora_rank": 24, "rope_scaling": YARN_DS}):
            m = self.model("deepseek_v2", overrides, name=f"ds{len(overrides)}", seed=7)
            x = np.random.default_rng(2).standard_normal((12, m.n_embd))
            pos = np.arange(12)
            for il in range(m.n_layer):
                np.testing.assert_allclose(absorbed_mla(m, il, x, pos), m.attention(il, x, pos, None),
                                           rtol=1e-10, atol=1e-12)

    def test_attention_against_loops(self):
        rng = np.random.default_rng(3)
        q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 9, 3))
        pos = np.arange(4, 9)
        for window in (None, 3):
            got = causal_attention(q, k, v, pos, 0.5, window)
            for h in range(2):
                for t, p in enumerate(pos):
                    js = [j for j in range(p + 1) if window is None or p - j < window]
                    w = softmax(np.array([q[h, t] @ k[h, j] * 0.5 for j in js]))
                    np.testing.assert_allclose(got[t, h * 3:(h + 1) * 3], w @ v[h, js], atol=1e-12)

    def test_yarn_numbers(self):
        self.assertEqual(yarn_correction_range(32, 1, 8, 10000.0, 4096), (1, 3))
        self.assertAlmostEqual(yarn_get_mscale(40, 0.707), 0.1 * 0.707 * math.log(40) + 1)
        self.assertEqual(yarn_get_mscale(1.0, 5.0), 1.0)
        base = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
        # ramp over [1, 3]: index 0, 1 keep the original frequency, 2 blends half, 3 is divided by 40.
        want = base * np.array([1, 1, 0.5, 0]) + base / 40 * np.array([0, 0, 0.5, 1])
        np.testing.assert_allclose(yarn_inv_freq(8, 10000.0, 40.0, 32, 1, 4096), want, rtol=1e-14)
        np.testing.assert_allclose(yarn_inv_freq(8, 10000.0, 1.0, 32, 1, 4096), base, rtol=1e-14)

    def test_yarn_configs_take_effect(self):
        qwen_yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}}
        q = self.model("qwen3_moe", qwen_yarn, name="qy")
        self.assertAlmostEqual(q.rope_scale, 0.1 * math.log(4.0) + 1.0)
        d = self.model("deepseek_v2", {"rope_scaling": YARN_DS}, name="dy")
        self.assertEqual(d.rope_scale, 1.0)  # mscale == mscale_all_dim
        self.assertAlmostEqual(d.kq_scale, 24 ** -0.5 * (0.1 * 0.707 * math.log(40) + 1) ** 2)
        for arch, overrides in (("qwen3_moe", qwen_yarn), ("deepseek_v2", {"rope_scaling": YARN_DS})):
            plain = self.model(arch, name=arch + "_plain").forward(PROMPT)
            scaled = self.model(arch, overrides, name=arch + "_yarn").forward(PROMPT)
            self.assertGreater(np.abs(scaled - plain).max(), 1e-3)

    def test_top_k_ties_take_the_lower_index(self):
        self.assertEqual(top_k(np.array([0.2, 0.5, 0.5, 0.1, 0.5]), 2).tolist(), [1, 2])


class RoutingTest(TempDirCase):
    def test_group_limited_changes_some_choices(self):
        m = self.model("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                                       "num_experts_per_tok": 3})
        m.forward(PROMPT)
        self.assertGreater(m.stats.n_group_changed, 0)
        # With top-2 and 2 kept groups the restriction can never bind.
        m2 = self.model("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
                        name="m2")
        m2.forward(PROMPT)
        self.assertEqual(m2.stats.n_group_changed, 0)

    def test_routed_scaling_applies_only_without_normalisation(self):
        def logits(overrides, name):
            return self.model("deepseek_v2", overrides, name=name, seed=4).forward(PROMPT)

        norm1 = logits({"norm_topk_prob": True, "routed_scaling_factor": 1.0}, "a")
        norm16 = logits({"norm_topk_prob": True, "routed_scaling_factor": 16.0}, "b")
        np.testing.assert_array_equal(norm1, norm16)
        raw1 = logits({"norm_topk_prob": False, "routed_scaling_factor": 1.0}, "c")
        raw25 = logits({"norm_topk_prob": False, "routed_scaling_factor": 2.5}, "d")
        self.assertGreater(np.abs(raw25 - raw1).max(), 1e-3)
        self.assertGreater(np.abs(norm1 - raw1).max(), 1e-3)

    def test_dense_layer_placement(self):
        q = self.model("qwen3_moe", {"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
        self.assertEqual([q.is_sparse(il) for il in range(4)], [False, True, False, False])
        d = self.model("deepseek_v2", {"num_hidden_layers": 4, "first_k_dense_replace": 0, "moe_layer_freq": 2},
                       name="d")
        self.assertEqual([d.is_moe(il) for il in range(4)], [True, False, True, False])


def absorbed_mla(m, il, x, pos):
    """MLA with kv_b_proj folded into the query and the output: attends over the compressed
    cache [kv_lora_rank] plus the shared rope key, never materialising per-head keys."""
    p = f"model.layers.{il}.self_attn."
    n = x.shape[0]
    if m.q_lora_rank is None:
        q = x @ m.w(p + "q_proj.weight").T
    else:
        q = rms_norm(x @ m.w(p + "q_a_proj.weight").T, m.w(p + "q_a_layernorm.weight"), m.eps)
        q = q @ m.w(p + "q_b_proj.weight").T
    q = q.reshape(n, m.n_head, m.n_nope + m.n_rope)
    kv_a = x @ m.w(p + "kv_a_proj_with_mqa.weight").T
    c = rms_norm(kv_a[:, :m.kv_lora_rank], m.w(p + "kv_a_layernorm.weight"), m.eps)  # [n, r]
    w_kvb = m.w(p + "kv_b_proj.weight").reshape(m.n_head, m.n_nope + m.n_v, m.kv_lora_rank)
    w_uk, w_uv = w_kvb[:, :m.n_nope], w_kvb[:, m.n_nope:]  # [h, nope, r], [h, v, r]
    cos, sin = rope_cos_sin(m.inv_freq, pos, m.rope_scale)
    q_pe = m.rope(q[:, :, m.n_nope:].transpose(1, 0, 2), cos, sin)  # [h, n, rope]
    k_pe = m.rope(kv_a[:, m.kv_lora_rank:], cos, sin)  # [n, rope]
    q_lat = np.einsum("thd,hdr->htr", q[:, :, :m.n_nope], w_uk)  # [h, n, r]
    scores = (np.einsum("htr,sr->hts", q_lat, c) + np.einsum("htd,sd->hts", q_pe, k_pe)) * m.kq_scale
    scores = np.where(np.tril(np.ones((n, n), dtype=bool))[None], scores, -np.inf)
    ctx = np.einsum("hts,sr->htr", softmax(scores), c)  # [h, n, r]
    out = np.einsum("htr,hvr->thv", ctx, w_uv).reshape(n, m.n_head * m.n_v)
    return out @ m.w(p + "o_proj.weight").T


if __name__ == "__main__":
    unittest.main()
