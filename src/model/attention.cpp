#include "model/attention.h"

#include <vector>

#include "kernels/attend.h"

namespace duet {

namespace {

// Below this many KV rows (a 64-position decode step of one sequence with 4 KV heads) attention
// runs on the calling thread: waking a worker costs more than the work. Above it the KV heads are
// shared out even for one sequence, the worker being awake between a decode step's jobs: at one
// sequence and 128-192 positions (qwen3_moe small, int4, Zen 4 VM, 5 alternating pairs) `attend`
// took 0.18-0.37 ms a step instead of 0.43-0.47 with 2048 here, and decode gained 3-7 %.
constexpr int64_t kMinParallelKvRows = 256;

// Query positions attended together (sharing each K/V row read): × the group's heads, 32 query
// rows of head_dim 128 stay in L1 beside the keys they meet.
constexpr int64_t kTokenBlock = 8;

// The first tokens of runs of at most kTokenBlock tokens of one sequence at consecutive
// positions, then n_tokens: [n_blocks + 1].
std::vector<int64_t> token_blocks(const ForwardInput& in) {
  std::vector<int64_t> first;
  for (int64_t t = 0; t < in.n_tokens(); ++t) {
    const bool joins = !first.empty() && t - first.back() < kTokenBlock &&
                       in.span_of[t] == in.span_of[t - 1] && in.pos[t] == in.pos[t - 1] + 1;
    if (!joins) first.push_back(t);
  }
  first.push_back(in.n_tokens());
  return first;
}

}  // namespace

void kv_spans(KvStore& kv, int32_t seq_id, int64_t il, int64_t n_ctx, int64_t k_offset,
              int64_t v_offset, std::vector<KvSpan>& spans) {
  spans.clear();
  const DType dtype = kv.dtype();
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t pos = 0; pos < n_ctx;) {
    const KvRows r = kv.rows(seq_id, il, pos, n_ctx - pos);
    const void* k = static_cast<const char*>(r.k) + k_offset * elem;
    const void* v = r.v ? static_cast<const char*>(r.v) + v_offset * elem : nullptr;
    spans.push_back(KvSpan{k, v, r.k_stride, r.v_stride, r.n, dtype});
    pos += r.n;
  }
}

namespace {

// The attention of KV head kvh's query heads for the tokens [blocks[b], blocks[b + 1]): one
// sequence's consecutive positions, sharing each K/V row read.
void attend_block(const ForwardInput& in, KvStore& kv, int64_t il, const GqaShape& shape,
                  const std::vector<int64_t>& blocks, int64_t b, int64_t kvh, const float* q,
                  float* out) {
  thread_local std::vector<KvSpan> spans;
  thread_local std::vector<float> scores;  // [n_t * group, n_ctx]
  const int64_t hd = shape.head_dim;
  const int64_t group = shape.n_head / shape.n_head_kv;
  const int64_t q_w = shape.n_head * hd;  // floats of one token's query heads
  const int64_t t0 = blocks[b], t1 = blocks[b + 1];
  const SeqSpan& span = in.spans[in.span_of[t0]];
  kv_spans(kv, span.seq_id, il, in.pos[t1 - 1] + 1, kvh * hd, kvh * hd, spans);
  AttendShape a{group, hd, hd, hd, hd, shape.scale};
  a.n_t = t1 - t0;
  a.ldq_t = q_w;
  a.ldo_t = q_w;
  const int64_t head = t0 * shape.n_head + kvh * group;  // the group's first query head
  attend(a, q + head * hd, spans, out + head * hd, scores);
}

// Whether no token block shares its sequence with another: then no task reads the K/V rows
// another task writes.
bool blocks_apart(const ForwardInput& in, const std::vector<int64_t>& blocks) {
  thread_local std::vector<bool> seen;
  seen.assign(in.spans.size(), false);
  for (size_t b = 0; b + 1 < blocks.size(); ++b) {
    const int32_t span = in.span_of[blocks[b]];
    if (seen[span]) return false;
    seen[span] = true;
  }
  return true;
}

}  // namespace

void attention_gqa(ThreadPool& pool, const ForwardInput& in, KvStore& kv, int64_t il,
                   const GqaShape& shape, float* q, float* out, const GqaPrepare& prepare) {
  const std::vector<int64_t> blocks = token_blocks(in);
  const int64_t n_blocks = static_cast<int64_t>(blocks.size() - 1);
  const int64_t n_tasks = n_blocks * shape.n_head_kv;
  int64_t kv_rows = 0;  // positions attended to × KV heads: the work
  for (int64_t t = 0; t < in.n_tokens(); ++t) kv_rows += (in.pos[t] + 1) * shape.n_head_kv;
  const int64_t chunk = kv_rows < kMinParallelKvRows ? n_tasks : 1;
  const bool prepare_in_tasks = prepare && blocks_apart(in, blocks);
  if (prepare && !prepare_in_tasks) {  // a block reads rows an earlier one of its sequence writes
    pool.parallel_for(
        n_tasks,
        [&](int64_t begin, int64_t end) {
          for (int64_t task = begin; task < end; ++task) {
            const int64_t b = task / shape.n_head_kv;
            prepare(blocks[b], blocks[b + 1], task % shape.n_head_kv);
          }
        },
        chunk);
  }
  pool.parallel_for(
      n_tasks,
      [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; ++task) {
          const int64_t b = task / shape.n_head_kv, kvh = task % shape.n_head_kv;
          if (prepare_in_tasks) prepare(blocks[b], blocks[b + 1], kvh);
          attend_block(in, kv, il, shape, blocks, b, kvh, q, out);
        }
      },
      chunk);
}

}  // namespace duet
