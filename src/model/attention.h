// Causal attention of a batch's new tokens over their sequences' cached K/V rows (GQA).
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/attend.h"
#include "model/forward.h"

namespace duet {

struct GqaShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // applied to q·k
};

// spans = the k and v rows of positions [0, n_ctx) of (seq_id, layer il) as runs of the store,
// in its dtype, each row offset by k_offset / v_offset elements (a KV head's slice; v_offset is
// ignored where the store keeps no v rows).
void kv_spans(KvStore& kv, int32_t seq_id, int64_t il, int64_t n_ctx, int64_t k_offset,
              int64_t v_offset, std::vector<KvSpan>& spans);

// For every token t (sequence s, position p) and head h: softmax over j in [0, p] of
// scale · q[t, h] · k(s, il, j)[kvh] and the weighted sum of v(s, il, j)[kvh], where
// kvh = h / (n_head / n_head_kv). The K/V rows of the batch's own tokens must already be in the
// store. q, out: [n_tokens, n_head * head_dim] f32.
void attention_gqa(ThreadPool& pool, const ForwardInput& in, KvStore& kv, int64_t il,
                   const GqaShape& shape, const float* q, float* out);

}  // namespace duet
