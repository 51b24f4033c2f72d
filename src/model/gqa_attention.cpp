#include "model/gqa_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/layers.h"

namespace duet {

GqaWeights load_gqa(WeightSource& src, const std::string& p, const ModelConfig& c, bool qk_norm) {
  const int64_t D = c.n_embd, hd = c.head_dim;
  GqaWeights w;
  w.norm = src.vector(p + "input_layernorm.weight", D);
  w.wq = src.matrix(p + "self_attn.q_proj.weight", c.n_head * hd, D, Layout::kPanels);
  w.wk = src.matrix(p + "self_attn.k_proj.weight", c.n_head_kv * hd, D, Layout::kPanels);
  w.wv = src.matrix(p + "self_attn.v_proj.weight", c.n_head_kv * hd, D, Layout::kPanels);
  w.wo = src.matrix(p + "self_attn.o_proj.weight", D, c.n_head * hd, Layout::kPanels);
  if (qk_norm) {
    w.q_norm = src.vector(p + "self_attn.q_norm.weight", hd);
    w.k_norm = src.vector(p + "self_attn.k_norm.weight", hd);
  }
  return w;
}

void GqaMoeModel::load_weights(WeightSource& src) {
  load_embeddings(src);
  attn_.resize(static_cast<size_t>(config_.n_layer));
  for (int64_t il = 0; il < config_.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    attn_[il] = load_gqa(src, p, config_, qk_norm_);
    ffn_[il].norm = src.vector(p + "post_attention_layernorm.weight", config_.n_embd);
    load_ffn(src, p, il, ffn_[il]);
  }
  load_output(src);
}

RopeParams rope_params(const ModelConfig& c, int64_t dim) {
  RopeParams p;
  p.dim = dim;
  p.theta = c.rope_theta;
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "yarn") {
    p.yarn = true;
    p.factor = rs.factor;
    p.beta_fast = rs.beta_fast;
    p.beta_slow = rs.beta_slow;
    p.original_max_position = rs.original_max_position;
    if (rs.attention_factor >= 0) {
      p.cos_sin_scale = rs.attention_factor;
    } else if (is_deepseek(c.arch) || (rs.mscale != 0 && rs.mscale_all_dim != 0)) {
      p.cos_sin_scale = yarn_get_mscale(rs.factor, rs.mscale) /
                        yarn_get_mscale(rs.factor, rs.mscale_all_dim);
    } else {
      p.cos_sin_scale = yarn_get_mscale(rs.factor, 1.0);
    }
  }
  return p;
}

namespace {

// q[n, q_w], k[n, kv_w], v[n, kv_w] = s.h · (wq, wk, wv)ᵀ as one pool job: one wake-up of the
// workers instead of three, and the threads share out the blocks of all three products (k and
// v alone are too small to keep both busy to the end).
void project_qkv(ForwardState& s, const GqaWeights& w, float* k, float* v) {
  const int64_t n = s.n_tokens();
  s.proj.resize(3);
  s.proj[0] = MatmulGroup{w.wq, s.h.data(), n, s.q.data()};
  s.proj[1] = MatmulGroup{w.wk, s.h.data(), n, k};
  s.proj[2] = MatmulGroup{w.wv, s.h.data(), n, v};
  matmul_grouped(*s.pool, s.proj);
}

// attention_gqa's prepare: per token of [t0, t1), the q/k norms of KV head kvh and its query
// heads, their rope (the step's angles), and the head's new K/V slices into the cache, whose rows
// the engine reserved before the step.
struct RopeStore {
  ForwardState& s;
  int64_t il;
  const GqaWeights& w;
  const ModelConfig& c;
  const Rope& rope;
  float* k;        // [n_tokens, n_head_kv * head_dim]
  const float* v;  // [n_tokens, n_head_kv * head_dim]

  void operator()(int64_t t0, int64_t t1, int64_t kvh) const {
    const int64_t hd = c.head_dim, q_w = c.n_head * hd, kv_w = c.n_head_kv * hd;
    const int64_t group = c.n_head / c.n_head_kv;
    const float eps = static_cast<float>(c.rms_norm_eps);
    for (int64_t t = t0; t < t1; ++t) {
      float* qt = s.q.data() + t * q_w + kvh * group * hd;
      float* kt = k + t * kv_w + kvh * hd;
      if (w.q_norm) rms_norm(qt, w.q_norm, group, hd, eps, qt);
      if (w.k_norm) rms_norm(kt, w.k_norm, 1, hd, eps, kt);
      const float* cos = s.rope_angles.cos(t);
      const float* sin = s.rope_angles.sin(t);
      rope.rotate(qt, group, hd, cos, sin, RopeStyle::kNeox);
      rope.rotate(kt, 1, hd, cos, sin, RopeStyle::kNeox);
      const int32_t seq = s.in->spans[s.in->span_of[t]].seq_id;
      s.kv->store_k(seq, il, s.in->pos[t], kt, hd, kvh * hd);
      s.kv->store_v(seq, il, s.in->pos[t], v + t * kv_w + kvh * hd, hd, kvh * hd);
    }
  }
};

}  // namespace

void gqa_attention(ForwardState& s, int64_t il, const GqaWeights& w, const ModelConfig& c,
                   const Rope& rope) {
  const int64_t n = s.n_tokens(), hd = c.head_dim;
  const int64_t q_w = c.n_head * hd, kv_w = c.n_head_kv * hd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  SubOpTimer qkv_time(s, "attn.qkv");  // with the norm before it
  norm_into_h(s, w.norm, c.n_embd, eps);
  s.q.resize(static_cast<size_t>(n * q_w));
  s.kv_new.resize(static_cast<size_t>(2 * n * kv_w));
  float* k = s.kv_new.data();          // [n, kv_w]
  float* v = k + n * kv_w;             // [n, kv_w]
  project_qkv(s, w, k, v);
  qkv_time.stop();
  // Norms, rope and the K/V store of each (token block, KV head) inside attention's task for it
  // (attention_gqa): in decode no thread waits for a serial pass over the new rows.
  SubOpTimer attend_time(s, "attn.attend");
  s.rope_angles.update(*s.pool, rope, s.in->pos.data(), n);
  const RopeStore rope_store{s, il, w, c, rope, k, v};
  s.attn_out.resize(static_cast<size_t>(n * q_w));
  const GqaShape shape{c.n_head, c.n_head_kv, hd, static_cast<float>(1.0 / std::sqrt(double(hd)))};
  attention_gqa(*s.pool, *s.in, *s.kv, il, shape, s.q.data(), s.attn_out.data(), rope_store);
  attend_time.stop();
  SubOpTimer o_time(s, "attn.o");
  s.scratch.resize(static_cast<size_t>(n * c.n_embd));
  matmul(*s.pool, w.wo, s.attn_out.data(), n, s.scratch.data());
  add_inplace(s.scratch.data(), n * c.n_embd, s.x.data());
}

}  // namespace duet
