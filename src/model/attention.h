// Causal attention of a batch's new tokens over their sequences' cached K/V rows (GQA).
#pragma once

#include <cstdint>
#include <functional>
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

// prepare(t0, t1, kvh): makes the final queries of KV head kvh's query heads for tokens
// [t0, t1) (one sequence's consecutive positions) in q, and writes those tokens' K/V rows of head
// kvh into the store; it touches nothing else.
using GqaPrepare = std::function<void(int64_t t0, int64_t t1, int64_t kvh)>;

// For every token t (sequence s, position p) and head h: softmax over j in [0, p] of
// scale · q[t, h] · k(s, il, j)[kvh] and the weighted sum of v(s, il, j)[kvh], where
// kvh = h / (n_head / n_head_kv). q, out: [n_tokens, n_head * head_dim] f32.
//
// The K/V rows of the batch's own tokens must be in the store before their attention: either
// already (prepare empty), or written by prepare, which runs once for every (token block, KV
// head). Where no two token blocks belong to one sequence (decode) it runs inside the task that
// then attends for that block and head, so no thread waits for a serial pass over the new rows;
// otherwise (a sequence's prefill in several blocks) as a job of its own before attention.
void attention_gqa(ThreadPool& pool, const ForwardInput& in, KvStore& kv, int64_t il,
                   const GqaShape& shape, float* q, float* out, const GqaPrepare& prepare = {});

}  // namespace duet
