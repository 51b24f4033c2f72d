#include "model/layers.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace duet {

MlpWeights load_mlp(WeightSource& src, const std::string& prefix, int64_t n_embd, int64_t n_ff,
                    Layout layout, const MlpNames& names) {
  MlpWeights w;
  w.gate = src.matrix(prefix + "." + names.gate + ".weight", n_ff, n_embd, layout);
  w.up = src.matrix(prefix + "." + names.up + ".weight", n_ff, n_embd, layout);
  w.down = src.matrix(prefix + "." + names.down + ".weight", n_embd, n_ff, layout);
  return w;
}

void embed_tokens(ForwardState& s, const Matrix& tok_embd) {
  const int64_t n = s.n_tokens(), D = tok_embd.cols;
  s.x.resize(static_cast<size_t>(n * D));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = s.in->tokens[t];
    DUET_CHECK(id >= 0 && id < tok_embd.rows, "token id " << id << " vocab " << tok_embd.rows);
    float* dst = s.x.data() + t * D;
    if (tok_embd.dtype == DType::kF32) {
      std::memcpy(dst, static_cast<const float*>(tok_embd.data) + id * D, D * sizeof(float));
    } else {
      const auto* row = static_cast<const uint16_t*>(tok_embd.data) + id * D;
      for (int64_t i = 0; i < D; ++i) dst[i] = bf16_to_f32(row[i]);
    }
  }
}

void norm_into_h(ForwardState& s, const float* w, int64_t n_embd, float eps) {
  s.h.resize(s.x.size());
  rms_norm(s.x.data(), w, s.n_tokens(), n_embd, eps, s.h.data());
}

void output_logits(ForwardState& s, const float* norm, float eps, const Matrix& output) {
  const int64_t D = output.cols, n_out = static_cast<int64_t>(s.in->out_rows.size());
  s.h.resize(static_cast<size_t>(n_out * D));
  for (int64_t r = 0; r < n_out; ++r) {
    rms_norm(s.x.data() + s.in->out_rows[r] * D, norm, 1, D, eps, s.h.data() + r * D);
  }
  s.logits.resize(static_cast<size_t>(n_out * output.rows));
  matmul(*s.pool, output, s.h.data(), n_out, s.logits.data());
}

namespace {

void dense_ffn(ForwardState& s, const FfnWeights& w, int64_t D, float eps) {
  norm_into_h(s, w.norm, D, eps);
  s.scratch.resize(s.h.size());
  mlp_forward(*s.pool, w.dense, s.h.data(), s.n_tokens(), s.mlp, s.scratch.data());
  add_inplace(s.scratch.data(), static_cast<int64_t>(s.scratch.size()), s.x.data());
}

void moe_route(ForwardState& s, const FfnWeights& w, int64_t D, float eps) {
  const int64_t n = s.n_tokens(), E = w.route.n_expert, K = w.route.n_expert_used;
  norm_into_h(s, w.norm, D, eps);
  s.router_logits.resize(static_cast<size_t>(n * E));
  matmul(*s.pool, w.router, s.h.data(), n, s.router_logits.data());
  s.topk_ids.resize(static_cast<size_t>(n * K));
  s.topk_weights.resize(static_cast<size_t>(n * K));
  route_topk(w.route, s.router_logits.data(), n, s.topk_ids.data(), s.topk_weights.data());
}

void dispatch_send(ForwardState& s, const FfnWeights& w, int64_t D) {
  RoutedTokens rt;
  rt.x = s.h.data();
  rt.topk_ids = s.topk_ids.data();
  rt.topk_weights = s.topk_weights.data();
  rt.n_tokens = s.n_tokens();
  rt.n_embd = D;
  rt.n_expert_used = w.route.n_expert_used;
  rt.out = s.x.data();
  s.dispatcher->dispatch_send(rt);
}

}  // namespace

void append_ffn_ops(std::vector<Operation>& ops, int64_t il, const FfnWeights& w, int64_t n_embd,
                    float eps, SharedExpertsAt shared_at) {
  const FfnWeights* wp = &w;  // the weights outlive the operation list (both owned by the model)
  const int64_t D = n_embd;
  const auto add = [&](OpKind kind, std::function<void(ForwardState&)> run) {
    Operation op;
    op.kind = kind;
    op.il = static_cast<int32_t>(il);
    op.run = std::move(run);
    ops.push_back(std::move(op));
  };
  if (!w.is_moe) {
    add(OpKind::kMlp, [wp, D, eps](ForwardState& s) { dense_ffn(s, *wp, D, eps); });
    return;
  }
  const auto add_shared = [&] {
    if (!w.has_shared) return;
    add(OpKind::kSharedExperts, [wp](ForwardState& s) {
      s.shared_out.resize(s.h.size());
      mlp_forward(*s.pool, wp->shared, s.h.data(), s.n_tokens(), s.mlp, s.shared_out.data());
    });
  };
  add(OpKind::kMoeRoute, [wp, D, eps](ForwardState& s) { moe_route(s, *wp, D, eps); });
  if (shared_at == SharedExpertsAt::kSerial) add_shared();
  add(OpKind::kDispatchSend, [wp, D](ForwardState& s) { dispatch_send(s, *wp, D); });
  add(OpKind::kYield, nullptr);
  if (shared_at == SharedExpertsAt::kDispatch) add_shared();
  add(OpKind::kDispatchRecv,
      [](ForwardState& s) { s.expert_batch = &s.dispatcher->dispatch_recv(); });
  const bool shared_in_experts = w.has_shared && shared_at == SharedExpertsAt::kExperts;
  add(OpKind::kExperts, [wp, shared_in_experts](ForwardState& s) {
    DUET_CHECK(s.expert_batch->first_expert == wp->first_expert,
               "dispatcher's experts start at " << s.expert_batch->first_expert
                                                << ", the model's at " << wp->first_expert);
    // One rank: the expert batch's output rows are s.x's, and the shared experts' follow them.
    const SharedExperts shared{&wp->shared, s.h.data(), s.x.data(), s.n_tokens()};
    s.expert_bytes_read += run_experts(*s.pool, wp->experts, *s.expert_batch, s.mlp,
                                       shared_in_experts ? &shared : nullptr);
  });
  add(OpKind::kCombineSend, [](ForwardState& s) {
    s.dispatcher->combine_send();
    s.expert_batch = nullptr;
  });
  add(OpKind::kYield, nullptr);
  if (shared_at == SharedExpertsAt::kCombine) add_shared();
  add(OpKind::kCombineRecv, [wp, shared_in_experts](ForwardState& s) {
    s.dispatcher->combine_recv();
    if (wp->has_shared && !shared_in_experts) {
      add_inplace(s.shared_out.data(), static_cast<int64_t>(s.shared_out.size()), s.x.data());
    }
  });
}

}  // namespace duet
