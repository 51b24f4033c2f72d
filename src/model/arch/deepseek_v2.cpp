// DeepSeek-V2 (DeepseekV2ForCausalLM, following DeepSeek's modeling_deepseek.py): multi-head
// latent attention (MLA) with an optional low-rank query, interleaved rope on a separate rope
// part of q and k, yarn scaling with the mscale softmax factor; the first first_k_dense_replace
// layers dense, then MoE every moe_layer_freq layers, with shared experts and greedy or
// group-limited-greedy routing. DeepSeek-V3 (DeepseekV3ForCausalLM, also Kimi K2's) is the same
// model with noaux_tc routing (RouterParams::noaux_tc, its mlp.gate.e_score_correction_bias);
// its multi-token-prediction layers (model.layers.{num_hidden_layers + i}) are never loaded.
//
// The KV store keeps MLA's compressed latent, never expanded K/V: per position
// [kv_lora_rank] normed c_kv followed by [qk_rope_head_dim] roped k_pe. Attention runs in the
// absorbed form: q_nope is multiplied into the latent space by W_UK, scores are taken against
// c_kv directly, and the latent output is expanded by W_UV.
#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/attend.h"
#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "model/attention.h"
#include "model/gqa_attention.h"
#include "model/layers.h"
#include "model/mla_heads.h"
#include "model/model.h"

namespace duet {
namespace {

struct MlaWeights {
  const float* norm = nullptr;       // [n_embd] input_layernorm
  Matrix wq;                         // [n_head * qk_dim, n_embd] (no q_lora_rank)
  Matrix wq_a;                       // [q_lora_rank, n_embd]
  const float* q_a_norm = nullptr;   // [q_lora_rank]
  Matrix wq_b;                       // [n_head * qk_dim, q_lora_rank]
  Matrix wkv_a;                      // [kv_lora_rank + rope_dim, n_embd]
  const float* kv_a_norm = nullptr;  // [kv_lora_rank]
  MlaKvB kv_b;                       // kv_b_proj [n_head * (nope + v_dim), kv_lora_rank]
  Matrix wo;                         // [n_embd, n_head * v_dim]
};

class DeepseekV2 final : public Model {
 public:
  explicit DeepseekV2(const ModelConfig& c)
      : Model(c), rope_(rope_params(c, c.qk_rope_head_dim)), scale_(softmax_scale(c)) {}

  int64_t kv_k_width() const override { return config_.kv_lora_rank + config_.qk_rope_head_dim; }
  int64_t kv_v_width() const override { return 0; }

 protected:
  void load_weights(WeightSource& src) override;
  void attention(ForwardState& s, int64_t il) const override;

 private:
  static float softmax_scale(const ModelConfig& c) {
    double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
    if (!c.rope_scaling.type.empty() && c.rope_scaling.mscale_all_dim != 0) {
      const double m = yarn_get_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
      scale *= m * m;
    }
    return static_cast<float>(scale);
  }

  MlaHeads mla_heads() const {
    const ModelConfig& c = config_;
    return {c.n_head, c.qk_head_dim(), c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank};
  }
  void project_h(ForwardState& s, const MlaWeights& w) const;
  void project_q(ForwardState& s, const MlaWeights& w) const;
  void write_latents(ForwardState& s, int64_t il, const MlaWeights& w) const;
  void absorbed_attention(ForwardState& s, int64_t il, const MlaWeights& w) const;

  Rope rope_;
  float scale_;
  std::vector<MlaWeights> attn_;  // [n_layer]
};

void DeepseekV2::load_weights(WeightSource& src) {
  const ModelConfig& c = config_;
  const int64_t D = c.n_embd, H = c.n_head, qk = c.qk_head_dim();
  load_embeddings(src);
  attn_.resize(static_cast<size_t>(c.n_layer));
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    MlaWeights& a = attn_[il];
    a.norm = src.vector(p + "input_layernorm.weight", D);
    if (c.q_lora_rank == 0) {
      a.wq = src.matrix(p + "self_attn.q_proj.weight", H * qk, D, Layout::kPanels);
    } else {
      a.wq_a = src.matrix(p + "self_attn.q_a_proj.weight", c.q_lora_rank, D, Layout::kPanels);
      a.q_a_norm = src.vector(p + "self_attn.q_a_layernorm.weight", c.q_lora_rank);
      a.wq_b = src.matrix(p + "self_attn.q_b_proj.weight", H * qk, c.q_lora_rank, Layout::kPanels);
    }
    a.wkv_a = src.matrix(p + "self_attn.kv_a_proj_with_mqa.weight",
                         c.kv_lora_rank + c.qk_rope_head_dim, D, Layout::kPanels);
    a.kv_a_norm = src.vector(p + "self_attn.kv_a_layernorm.weight", c.kv_lora_rank);
    a.kv_b = src.mla_kv_b(p + "self_attn.kv_b_proj.weight", mla_heads());
    a.wo = src.matrix(p + "self_attn.o_proj.weight", D, H * c.v_head_dim, Layout::kPanels);

    FfnWeights& f = ffn_[il];
    f.norm = src.vector(p + "post_attention_layernorm.weight", D);
    f.is_moe = c.is_moe_layer(il);
    if (!f.is_moe) {
      f.dense = load_mlp(src, p + "mlp", D, c.n_ff, Layout::kPanels);
      continue;
    }
    f.router = src.matrix(p + "mlp.gate.weight", c.n_expert, D);
    f.route.n_expert = c.n_expert;
    f.route.n_expert_used = c.n_expert_used;
    // modeling_deepseek.py (V2): renormalise only when top_k > 1 and norm_topk_prob; otherwise
    // multiply by routed_scaling_factor.
    f.route.norm_topk_prob = c.norm_topk_prob && c.n_expert_used > 1;
    f.route.routed_scaling_factor = f.route.norm_topk_prob ? 1.0 : c.routed_scaling_factor;
    f.route.norm_eps = 1e-20;
    if (c.topk_method != TopkMethod::kGreedy) {
      f.route.n_group = c.n_group;
      f.route.topk_group = c.topk_group;
    }
    if (c.topk_method == TopkMethod::kNoauxTc) {  // V3: renormalise, then always scale
      f.route.noaux_tc = true;
      f.route.norm_topk_prob = c.norm_topk_prob;
      f.route.routed_scaling_factor = c.routed_scaling_factor;
      f.route.score_bias = src.vector(p + "mlp.gate.e_score_correction_bias", c.n_expert);
    }
    for (int64_t e = expert_begin_; e < expert_end_; ++e) {
      f.experts.push_back(load_mlp(src, p + "mlp.experts." + std::to_string(e), D, c.n_ff_exp));
    }
    if (c.n_expert_shared > 0) {
      f.has_shared = true;
      f.shared = load_mlp(src, p + "mlp.shared_experts", D, c.n_ff_exp * c.n_expert_shared,
                          Layout::kPanels);
    }
  }
  load_output(src);
}

// The layer's two products of s.h as one job of the pool: the queries' first (wq into s.q, or
// wq_a into s.scratch with a q_lora_rank) and the latents' (wkv_a into s.kv_new).
void DeepseekV2::project_h(ForwardState& s, const MlaWeights& w) const {
  const ModelConfig& c = config_;
  const int64_t n = s.n_tokens();
  s.q.resize(static_cast<size_t>(n * c.n_head * c.qk_head_dim()));
  s.scratch.resize(static_cast<size_t>(n * c.q_lora_rank));
  s.kv_new.resize(static_cast<size_t>(n * kv_k_width()));
  const bool low_rank = c.q_lora_rank > 0;
  matmul_grouped(
      *s.pool, {{low_rank ? w.wq_a : w.wq, s.h.data(), n, low_rank ? s.scratch.data() : s.q.data()},
                {w.wkv_a, s.h.data(), n, s.kv_new.data()}});
}

// s.q = [n_tokens, n_head, nope + rope] queries, rope part rotated.
void DeepseekV2::project_q(ForwardState& s, const MlaWeights& w) const {
  const ModelConfig& c = config_;
  const int64_t n = s.n_tokens(), qk = c.qk_head_dim();
  if (c.q_lora_rank > 0) {  // s.scratch holds h · wq_aᵀ (project_h, which sized s.q)
    rms_norm(s.scratch.data(), w.q_a_norm, n, c.q_lora_rank, static_cast<float>(c.rms_norm_eps),
             s.scratch.data());
    matmul(*s.pool, w.wq_b, s.scratch.data(), n, s.q.data());
  }
  s.rope_angles.update(*s.pool, rope_, s.in->pos.data(), n);
  s.pool->parallel_for(n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      rope_.rotate(s.q.data() + t * c.n_head * qk + c.qk_nope_head_dim, c.n_head, qk,
                   s.rope_angles.cos(t), s.rope_angles.sin(t), RopeStyle::kInterleaved);
    }
  });
}

// Computes [normed c_kv | roped k_pe] for each token and stores it as the token's latent row
// (in the store's dtype: bf16 rounds it).
void DeepseekV2::write_latents(ForwardState& s, int64_t il, const MlaWeights& w) const {
  const ModelConfig& c = config_;
  const int64_t n = s.n_tokens(), width = kv_k_width();
  // s.kv_new [n, width] holds h · wkv_aᵀ (project_h).
  // Tokens write disjoint rows of the cache, which the engine reserved before the step.
  s.rope_angles.update(*s.pool, rope_, s.in->pos.data(), n);  // made by project_q: found there
  s.pool->parallel_for(n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = s.kv_new.data() + t * width;
      rms_norm(row, w.kv_a_norm, 1, c.kv_lora_rank, static_cast<float>(c.rms_norm_eps), row);
      rope_.rotate(row + c.kv_lora_rank, 1, c.qk_rope_head_dim, s.rope_angles.cos(t),
                   s.rope_angles.sin(t), RopeStyle::kInterleaved);
      const int32_t seq = s.in->spans[s.in->span_of[t]].seq_id;
      s.kv->store_k(seq, il, s.in->pos[t], row, width);
    }
  });
}

// s.attn_out = [n_tokens, n_head * v_dim] from s.q and the latent cache.
void DeepseekV2::absorbed_attention(ForwardState& s, int64_t il, const MlaWeights& w) const {
  const ModelConfig& c = config_;
  const int64_t n = s.n_tokens(), H = c.n_head, L = c.kv_lora_rank, vd = c.v_head_dim;
  // q_lat [H, n, L] = q_nope[h] · W_UK[h], W_UK[h] = rows [h * (nope + vd), + nope) of kv_b.
  std::vector<float>& q_lat = s.scratch;
  std::vector<float>& o_lat = s.scratch2;  // [H, n, L]
  q_lat.resize(static_cast<size_t>(H * n * L));
  o_lat.resize(q_lat.size());
  const MlaHeads heads = mla_heads();
  const int64_t job_heads = mla_heads_per_job(heads, n);
  thread_local std::vector<float> buf;  // the heads' copies, reused across layers and steps
  mla_absorb_queries(*s.pool, w.kv_b, heads, s.q.data(), n, job_heads, q_lat.data(), buf);
  // Every head of a token attends over the same latent rows (keys [c_kv | k_pe], values c_kv).
  thread_local std::vector<int64_t> n_ctx_list;  // reused; by reference for the pool's threads
  thread_local std::vector<float> partials;
  std::vector<int64_t>& n_ctx = n_ctx_list;
  n_ctx.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) n_ctx[t] = s.in->pos[t] + 1;
  mla_attend(
      *s.pool, heads, q_lat.data(), s.q.data(), n, n_ctx, scale_,
      [&](int64_t t, std::vector<KvSpan>& spans) {
        kv_spans(*s.kv, s.in->spans[s.in->span_of[t]].seq_id, il, n_ctx[t], 0, 0, spans);
      },
      o_lat.data(), partials);
  // attn_out[t, h] = W_UV[h] · o_lat[h, t], W_UV[h] = the vd rows of kv_b after W_UK[h].
  s.attn_out.resize(static_cast<size_t>(n * H * vd));
  mla_head_outputs(*s.pool, w.kv_b, heads, o_lat.data(), n, job_heads, s.attn_out.data(), buf);
}

void DeepseekV2::attention(ForwardState& s, int64_t il) const {
  const MlaWeights& w = attn_[il];
  const int64_t n = s.n_tokens(), D = config_.n_embd;
  SubOpTimer q_time(s, "attn.q");  // with the norm before it and the latents' product
  norm_into_h(s, w.norm, D, static_cast<float>(config_.rms_norm_eps));
  project_h(s, w);
  project_q(s, w);
  q_time.stop();
  SubOpTimer latent_time(s, "attn.latents");
  write_latents(s, il, w);
  latent_time.stop();
  SubOpTimer attend_time(s, "attn.attend");
  absorbed_attention(s, il, w);
  attend_time.stop();
  SubOpTimer o_time(s, "attn.o");
  s.scratch.resize(static_cast<size_t>(n * D));
  matmul(*s.pool, w.wo, s.attn_out.data(), n, s.scratch.data());
  add_inplace(s.scratch.data(), n * D, s.x.data());
}

}  // namespace

std::unique_ptr<Model> make_deepseek_v2(const ModelConfig& config) {
  return std::make_unique<DeepseekV2>(config);
}

}  // namespace duet
