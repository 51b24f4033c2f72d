"""Building blocks shared by the NumPy reference architectures.

Everything is float64. Shapes are written as in the engine: n_tokens, n_embd, n_head, n_head_kv,
n_expert, n_expert_used; "pos" are absolute token positions.
"""

import math

import numpy as np

from safetensors_np import TensorStore, bf16_to_f32, f32_to_bf16


class ConfigError(Exception):
    """config.json asks for something this reference does not implement."""


class Config:
    """config.json with Hugging Face defaults for absent keys."""

    def __init__(self, raw):
        self.raw = raw

    def req(self, key):
        if key not in self.raw:
            raise ConfigError(f"config.json lacks required key {key!r}")
        return self.raw[key]

    def opt(self, key, default):
        """The value, or `default` when the key is absent (an explicit null stays None)."""
        return self.raw.get(key, default)


def rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def swiglu(mm, x, gate, up, down):
    """down(silu(gate(x)) * up(x)) through mm(x, name) = x @ W[name].T; x [n_tokens, n_embd],
    gate/up name [n_ff, n_embd] weights, down [n_embd, n_ff]."""
    return mm(silu(mm(x, gate)) * mm(x, up), down)


def top_k(scores, k):
    """Indices of the k largest of a 1-D array, largest first; exact ties go to the lower index."""
    return np.argsort(-scores, kind="stable")[:k]


def selection_margin(scores, k):
    """Gap between the k-th and (k+1)-th largest score: how close a top-k pick was to flipping."""
    if k >= scores.shape[-1]:
        return math.inf
    s = np.sort(scores)[::-1]
    return float(s[k - 1] - s[k])


class RoutingStats:
    """What the routers did during forward passes, for diagnosing mismatches."""

    def __init__(self):
        self.min_margin = math.inf  # smallest top-k selection margin seen (probability units)
        self.n_routed = 0           # tokens routed
        self.n_group_changed = 0    # tokens whose group-limited pick differs from plain greedy
        self.picks = []             # (sorted expert ids, margin) per routed token, in call order

    def note(self, scores, k):
        margin = selection_margin(scores, k)
        self.min_margin = min(self.min_margin, margin)
        self.n_routed += 1
        self.picks.append((tuple(sorted(top_k(scores, k).tolist())), margin))


def first_parting(a, b):
    """Where two runs of the same model and tokens first route a token differently:
    (index of that routing call, margin in run a, margin in run b), or None. Calls go layer by
    layer, token by token within a forward pass, so the index locates the layer and token."""
    for i, ((ea, ma), (eb, mb)) in enumerate(zip(a.picks, b.picks)):
        if ea != eb:
            return i, ma, mb
    return None


# ---- rotary position embedding -------------------------------------------------------------

def rotate_half(x):
    """[x1, x2] -> [-x2, x1] over halves of the last axis (NeoX / Llama layout)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_cos_sin(inv_freq, pos, scale=1.0):
    """cos, sin [n_tokens, 2 * len(inv_freq)] for emb = cat(freqs, freqs), times `scale`."""
    freqs = np.outer(np.asarray(pos, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb) * scale, np.sin(emb) * scale


def apply_rope_neox(x, cos, sin):
    """x [..., n_tokens, d]; cos/sin [n_tokens, d]."""
    return x * cos + rotate_half(x) * sin


def default_inv_freq(dim, theta):
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def yarn_get_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_dim(n_rot, dim, base, max_pos):
    return (dim * math.log(max_pos / (n_rot * 2 * math.pi))) / (2 * math.log(base))


def yarn_correction_range(beta_fast, beta_slow, dim, base, max_pos, truncate=True):
    low = yarn_correction_dim(beta_fast, dim, base, max_pos)
    high = yarn_correction_dim(beta_slow, dim, base, max_pos)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_linear_ramp(low, high, n):
    if low == high:
        high += 0.001  # as HF and DeepSeek: avoid dividing by zero
    return np.clip((np.arange(n, dtype=np.float64) - low) / (high - low), 0.0, 1.0)


def yarn_inv_freq(dim, base, factor, beta_fast, beta_slow, original_max_pos, truncate=True):
    """YaRN blend: interpolated (1/factor) frequencies below the ramp, original ones above."""
    extra = default_inv_freq(dim, base)
    inter = extra / factor
    low, high = yarn_correction_range(beta_fast, beta_slow, dim, base, original_max_pos, truncate)
    extra_weight = 1.0 - yarn_linear_ramp(low, high, dim // 2)
    return inter * (1.0 - extra_weight) + extra * extra_weight


def rope_scaling_of(cfg):
    """The rope scaling dict (HF's rope_scaling, or rope_parameters of newer configs), or None."""
    rs = cfg.opt("rope_scaling", None)
    if rs is None:
        rp = cfg.opt("rope_parameters", None)
        if rp is not None and rp.get("rope_type", rp.get("type", "default")) != "default":
            rs = rp
    if rs is None:
        return None
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return None
    return rs


def rope_theta_of(cfg, default):
    rp = cfg.opt("rope_parameters", None)
    if "rope_theta" not in cfg.raw and rp is not None and "rope_theta" in rp:
        return float(rp["rope_theta"])
    return float(cfg.opt("rope_theta", default))


def hf_rope(cfg, dim, theta):
    """(inv_freq [dim/2], attention_factor) as transformers' ROPE_INIT_FUNCTIONS for
    "default" and "yarn" (modeling_rope_utils._compute_yarn_parameters, current version:
    the configured factor is used even when original_max_position_embeddings is given).
    The attention factor multiplies both cos and sin."""
    rs = rope_scaling_of(cfg)
    if rs is None:
        return default_inv_freq(dim, theta), 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind != "yarn":
        raise ConfigError(f"rope scaling type {kind!r} is not implemented by the reference")
    factor = float(rs["factor"])
    original = rs.get("original_max_position_embeddings") or cfg.req("max_position_embeddings")
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    inv_freq = yarn_inv_freq(dim, theta, factor, rs.get("beta_fast") or 32, rs.get("beta_slow") or 1,
                             original, rs.get("truncate", True))
    return inv_freq, float(attention_factor)


# ---- attention -----------------------------------------------------------------------------

def bf16_round(x):
    """x rounded to bf16 (nearest, ties to even) from float32, as duet's bf16 KV cache stores
    the float32 rows it computed; returned as float64."""
    return bf16_to_f32(f32_to_bf16(np.asarray(x, dtype=np.float32))).astype(np.float64)


def causal_attention(q, k, v, q_pos, scale, sliding_window=None, round_bf16=False):
    """Softmax attention with a causal mask.

    q [n_head, n_tokens, d_k]; k [n_head, n_kv, d_k]; v [n_head, n_kv, d_v], key j at position j.
    Returns [n_tokens, n_head * d_v] (heads concatenated, head-major). round_bf16: as
    attention_probs.
    """
    probs = attention_probs(q, k, q_pos, scale, sliding_window, round_bf16)
    out = np.einsum("hts,hsd->htd", probs, v)
    return out.transpose(1, 0, 2).reshape(q.shape[1], -1)


def attention_probs(q, k, q_pos, scale, sliding_window=None, round_bf16=False):
    """Causal softmax(q·kᵀ · scale) [n_head, n_tokens, n_kv]; shapes as causal_attention. With
    round_bf16, q is rounded to bf16 before its products and the probabilities after the softmax,
    as duet's attention over a bf16 KV cache does where it multiplies bf16 pairs
    (DecoderModel.attn_bf16)."""
    k_pos = np.arange(k.shape[1])
    q_pos = np.asarray(q_pos)
    visible = k_pos[None, :] <= q_pos[:, None]  # [n_tokens, n_kv]
    if sliding_window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
    scores = np.einsum("htd,hsd->hts", bf16_round(q) if round_bf16 else q, k) * scale
    scores = np.where(visible[None], scores, -np.inf)
    probs = softmax(scores, axis=-1)
    return bf16_round(probs) if round_bf16 else probs


class LayerCache:
    """Per-layer growing arrays (keys, values, ...) along the token axis."""

    def __init__(self):
        self.arrays = {}

    def extend(self, name, x, axis):
        """Appends x along `axis` and returns everything cached so far."""
        if name in self.arrays:
            self.arrays[name] = np.concatenate([self.arrays[name], x], axis=axis)
        else:
            self.arrays[name] = x
        return self.arrays[name]


class KvCache:
    def __init__(self, n_layer):
        self.layers = [LayerCache() for _ in range(n_layer)]
        self.n_past = 0


def extend_or_pass(cache, name, x, axis):
    return x if cache is None else cache.extend(name, x, axis)


# ---- the decoder skeleton ------------------------------------------------------------------

class DecoderModel:
    """Pre-norm decoder: x += attn(norm(x)); x += ffn(norm(x)); logits = lm_head(norm(x)).

    Subclasses provide attention(il, x, pos, layer_cache) and ffn(il, x), each mapping
    [n_tokens, n_embd] -> [n_tokens, n_embd], and the tensor names each reads.
    """

    def __init__(self, cfg, store, eps_default):
        self.cfg = cfg
        self.store = store
        self._weights = {}
        self.stats = RoutingStats()
        self.n_layer = int(cfg.req("num_hidden_layers"))
        self.n_embd = int(cfg.req("hidden_size"))
        self.n_vocab = int(cfg.req("vocab_size"))
        self.eps = float(cfg.opt("rms_norm_eps", eps_default))
        act = cfg.opt("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act {act!r} is not implemented by the reference")
        self.tied = bool(cfg.opt("tie_word_embeddings", False))
        # Round what the KV cache holds (GQA keys and values, MLA's latent) to bf16 before
        # attending, as duet does with a bf16 KV cache (`--kv-cache-dtype bf16`, and `auto` on
        # bf16 weights). Off: the cache is float64 like everything else.
        self.kv_bf16 = False
        # Round the input of every product with a bf16 weight to bf16 (nearest even) before
        # multiplying, as duet's kernels do on CPUs with AVX-512 BF16 (vdpbf16ps multiplies bf16
        # pairs; DUET_MATMUL_ISA=avx512bf16 or its emulation), and as llama.cpp and oneDNN do there.
        # Products with f32 weights keep their input.
        self.act_bf16 = False

    @property
    def attn_bf16(self):
        """Whether attention multiplies bf16 pairs: q and the probabilities rounded to bf16, as
        duet does over a bf16 KV cache on the instruction sets that round products' inputs."""
        return self.kv_bf16 and self.act_bf16

    def kv_round(self, x):
        """x as the KV cache keeps it (see kv_bf16)."""
        return bf16_round(x) if self.kv_bf16 else x

    def act_round(self, x, name):
        """x as duet's kernels read it for a product with the weight `name` (see act_bf16)."""
        return bf16_round(x) if self.act_bf16 and self.store.dtype(name) == "BF16" else x

    def mm(self, x, name):
        """x @ W.T for the weight `name` [n_out, n_in]; x [n_tokens, n_in] -> [n_tokens, n_out]."""
        return self.act_round(x, name) @ self.w(name).T

    def w(self, name):
        """A weight as float64, loaded once."""
        if name not in self._weights:
            self._weights[name] = self.store.get(name)
        return self._weights[name]

    def expected_tensors(self):
        """Every tensor name the Hugging Face layout of this config has."""
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not self.tied:
            names.append("lm_head.weight")
        for il in range(self.n_layer):
            p = f"model.layers.{il}."
            names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
            names += [p + n for n in self.attention_tensors(il) + self.ffn_tensors(il)]
        return names

    def tensor_name_mismatch(self):
        """(missing, unexpected) tensor names of the directory against expected_tensors()."""
        want, have = set(self.expected_tensors()), set(self.store.names())
        return sorted(want - have), sorted(have - want)

    def forward(self, ids, cache=None):
        """Logits [n_tokens, n_vocab] for `ids` following the cache's n_past tokens."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"token id out of range [0, {self.n_vocab})")
        n_past = 0 if cache is None else cache.n_past
        pos = np.arange(n_past, n_past + len(ids))
        embd = self.w("model.embed_tokens.weight")  # [n_vocab, n_embd]
        x = embd[ids]  # [n_tokens, n_embd]
        for il in range(self.n_layer):
            p = f"model.layers.{il}."
            lc = None if cache is None else cache.layers[il]
            x = x + self.attention(il, rms_norm(x, self.w(p + "input_layernorm.weight"), self.eps), pos, lc)
            x = x + self.ffn(il, rms_norm(x, self.w(p + "post_attention_layernorm.weight"), self.eps))
        if cache is not None:
            cache.n_past += len(ids)
        x = rms_norm(x, self.w("model.norm.weight"), self.eps)
        return self.mm(x, "model.embed_tokens.weight" if self.tied else "lm_head.weight")

    def new_cache(self):
        return KvCache(self.n_layer)

    def attention(self, il, x, pos, cache):
        raise NotImplementedError

    def ffn(self, il, x):
        raise NotImplementedError

    def attention_tensors(self, il):
        """Names under model.layers.{il}. read by attention()."""
        raise NotImplementedError

    def ffn_tensors(self, il):
        """Names under model.layers.{il}. read by ffn()."""
        raise NotImplementedError

    def dense_mlp(self, prefix, x):
        return swiglu(self.mm, x, prefix + "gate_proj.weight", prefix + "up_proj.weight",
                      prefix + "down_proj.weight")

    def routed_experts(self, x, experts, weights, expert_fn):
        """sum_j weights[t, j] * expert_fn(experts[t, j], x[t]) for every token t.

        experts/weights [n_tokens, n_expert_used]; expert_fn(e, x_sub) -> [len(x_sub), n_embd].
        """
        out = np.zeros_like(x)
        for e in np.unique(experts):
            rows, slots = np.nonzero(experts == e)
            out[rows] += weights[rows, slots][:, None] * expert_fn(int(e), x[rows])
        return out


def load_store(model_dir):
    return TensorStore(model_dir)
