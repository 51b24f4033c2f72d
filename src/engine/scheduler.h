// The serving scheduler: continuous batching with chunked prefill under a token budget.
//
// Every step it builds one batch from three sources, in this order:
//   1. running sequences that decode (one uncomputed token each, which may be a placeholder for
//      a token the step in flight has not sampled yet; none whose placeholders already reach
//      max_tokens: it ends with the step in flight), oldest first, so long
//      prefills never starve them; when the pool has no block for one, the newest running
//      sequence is preempted by recompute (its blocks freed, it goes back to the front of the
//      waiting queue and later recomputes prompt + generated tokens);
//   2. running sequences still in prefill, oldest first, each a chunk of what is left of the
//      budget (an older one short of blocks preempts newer ones, as a decode does);
//   3. waiting sequences, first come first served, while there is budget, a free sequence slot
//      and KV blocks; the queue is never overtaken (a head that does not fit blocks the rest).
// A sequence's n_computed advances when it is scheduled; only a chunk that reaches the end of
// its tokens asks for logits (the next token is sampled from them).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/paged_kv_cache.h"
#include "engine/request.h"

namespace duet {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;             // running sequences at once
  int64_t max_num_batched_tokens = 512;  // tokens per forward pass (>= max_num_seqs)
};

// One sequence's share of a step: tokens [n_past, n_past + n_tokens) of seq->tokens.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t n_past = 0;
  int64_t n_tokens = 0;
  bool sample = false;  // the chunk ends at the sequence's last token: sample from its logits
};

struct SchedulerStep {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<Sequence*> preempted;    // sent back to waiting during this step
  int64_t n_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  // The cache must outlive the scheduler. Throws duet::Error on a bad config.
  Scheduler(const SchedulerConfig& config, PagedKvCache& kv);

  // Queues a sequence (status kWaiting, no blocks). The caller has checked that it can ever fit
  // (can_fit) and keeps it alive until it is finished or removed.
  void add(Sequence* seq);
  // Whether a sequence of n_pos positions could run alone in the whole pool.
  bool can_fit(int64_t n_pos) const;

  // Plans the next forward pass and reserves its KV rows. Empty when there is nothing to run.
  SchedulerStep schedule();

  // Multi-step (--num-scheduler-steps): reserves KV rows for up to n decode steps of `step` and
  // returns how many every chunk has rows for: at least 1, and 1 unless every chunk is one token
  // that samples (a decode-only batch). No position reaches max_pos (the model's context).
  // n_computed does not move: advance() does, once the group has agreed on the count.
  int64_t reserve_lookahead(const SchedulerStep& step, int64_t n, int64_t max_pos);
  // The batch `step` runs n decode steps (n <= reserve_lookahead's): each chunk's sequence has
  // n - 1 more positions computed than schedule() counted.
  static void advance(const SchedulerStep& step, int64_t n);

  // Takes a sequence out (finished or aborted) and frees its blocks.
  void remove(Sequence* seq);

  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  const SchedulerConfig& config() const { return config_; }

 private:
  // Frees the newest running sequence's blocks, drops its chunk from `step` (returning the
  // tokens to `budget`) and puts it at the front of waiting.
  Sequence* preempt_newest(SchedulerStep& step, int64_t& budget);
  void schedule_decodes(SchedulerStep& step, int64_t& budget);
  void schedule_running_prefills(SchedulerStep& step, int64_t& budget);
  void schedule_waiting(SchedulerStep& step, int64_t& budget);
  // Reserves rows for a chunk of up to `want` tokens as far as free blocks allow; 0 if none.
  int64_t reserve_chunk(Sequence* seq, int64_t want);
  static void push_chunk(SchedulerStep& step, Sequence* seq, int64_t n);

  SchedulerConfig config_;
  PagedKvCache& kv_;
  std::deque<Sequence*> waiting_;  // FCFS; preempted sequences return to the front
  std::vector<Sequence*> running_; // sorted by id: back() is the newest
};

}  // namespace duet
