// Causal attention of a batch's new tokens over their sequences' cached K/V rows (GQA).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "model/forward.h"

namespace duet {

struct GqaShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // applied to q·k
};

// For every token t (sequence s, position p) and head h: softmax over j in [0, p] of
// scale · q[t, h] · k(s, il, j)[kvh] and the weighted sum of v(s, il, j)[kvh], where
// kvh = h / (n_head / n_head_kv). The K/V rows of the batch's own tokens must already be in the
// store. q, out: [n_tokens, n_head * head_dim] f32.
void attention_gqa(ThreadPool& pool, const ForwardInput& in, KvStore& kv, int64_t il,
                   const GqaShape& shape, const float* q, float* out);

}  // namespace duet
