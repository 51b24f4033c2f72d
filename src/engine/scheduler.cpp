#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace duet {

Scheduler::Scheduler(const SchedulerConfig& config, PagedKvCache& kv) : config_(config), kv_(kv) {
  if (config.max_num_seqs < 1) DUET_ERROR("max_num_seqs must be >= 1, got " << config.max_num_seqs);
  if (config.max_num_batched_tokens < config.max_num_seqs) {
    DUET_ERROR("max_num_batched_tokens (" << config.max_num_batched_tokens
                                          << ") must be >= max_num_seqs (" << config.max_num_seqs
                                          << ") so that every running sequence can decode");
  }
}

bool Scheduler::can_fit(int64_t n_pos) const {
  return kv_.blocks_for(n_pos) <= kv_.pool().n_blocks();
}

void Scheduler::add(Sequence* seq) {
  DUET_CHECK(seq->status == SeqStatus::kWaiting && seq->kv_seq < 0 && !seq->tokens.empty(),
             "sequence " << seq->id << " is not a fresh waiting sequence");
  waiting_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  if (seq->kv_seq >= 0) kv_.remove_sequence(seq->kv_seq);
  seq->kv_seq = -1;
  seq->status = SeqStatus::kFinished;
}

Sequence* Scheduler::preempt_newest(SchedulerStep& step, int64_t& budget) {
  Sequence* victim = running_.back();
  running_.pop_back();
  // A victim already in this step's batch gives its tokens back.
  for (auto c = step.chunks.begin(); c != step.chunks.end(); ++c) {
    if (c->seq != victim) continue;
    budget += c->n_tokens;
    step.n_tokens -= c->n_tokens;
    step.chunks.erase(c);
    break;
  }
  kv_.remove_sequence(victim->kv_seq);
  victim->kv_seq = -1;
  victim->n_computed = 0;
  victim->status = SeqStatus::kWaiting;
  ++victim->n_preempted;
  waiting_.push_front(victim);
  step.preempted.push_back(victim);
  return victim;
}

void Scheduler::push_chunk(SchedulerStep& step, Sequence* seq, int64_t n) {
  ScheduledChunk c;
  c.seq = seq;
  c.n_past = seq->n_computed;
  c.n_tokens = n;
  c.sample = seq->n_computed + n == static_cast<int64_t>(seq->tokens.size());
  seq->n_computed += n;
  step.chunks.push_back(c);
  step.n_tokens += n;
}

int64_t Scheduler::reserve_chunk(Sequence* seq, int64_t want) {
  const int64_t n = std::min(want, kv_.max_reservable(seq->kv_seq) - seq->n_computed);
  if (n <= 0) return 0;
  DUET_CHECK(kv_.reserve(seq->kv_seq, seq->n_computed + n), "reserve failed for seq " << seq->id);
  return n;
}

void Scheduler::schedule_decodes(SchedulerStep& step, int64_t& budget) {
  // Index-based: preemption shrinks running_ from the back, never before index i.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    if (seq->in_prefill()) continue;
    // Its last token (a placeholder of the step in flight) is its last: it finishes with it.
    if (seq->n_generated() >= seq->max_tokens) continue;
    bool self_preempted = false;
    while (!kv_.reserve(seq->kv_seq, seq->n_computed + 1)) {
      if (preempt_newest(step, budget) == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // seq was the newest: nothing after it is running
    push_chunk(step, seq, 1);
    --budget;
  }
}

void Scheduler::schedule_running_prefills(SchedulerStep& step, int64_t& budget) {
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    if (!seq->in_prefill()) continue;
    int64_t n = 0;
    // An older prefill takes blocks from newer sequences rather than wait behind them.
    while ((n = reserve_chunk(seq, std::min(budget, seq->n_uncomputed()))) == 0 &&
           running_.back() != seq)
      preempt_newest(step, budget);
    if (n == 0) break;  // seq is the newest running sequence; it waits for blocks
    push_chunk(step, seq, n);
    budget -= n;
  }
}

void Scheduler::schedule_waiting(SchedulerStep& step, int64_t& budget) {
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    // A sequence preempted in this very step waits for the next one.
    if (std::find(step.preempted.begin(), step.preempted.end(), seq) != step.preempted.end())
      break;
    seq->kv_seq = kv_.add_sequence();
    const int64_t n = reserve_chunk(seq, std::min(budget, seq->n_uncomputed()));
    if (n == 0) {
      kv_.remove_sequence(seq->kv_seq);
      seq->kv_seq = -1;
      break;
    }
    waiting_.pop_front();
    seq->status = SeqStatus::kRunning;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), seq,
                                     [](const Sequence* a, const Sequence* b) {
                                       return a->id < b->id;
                                     }),
                    seq);
    push_chunk(step, seq, n);
    budget -= n;
  }
}

int64_t Scheduler::reserve_lookahead(const SchedulerStep& step, int64_t n, int64_t max_pos) {
  if (step.chunks.empty()) return 1;
  for (const ScheduledChunk& c : step.chunks)
    if (c.n_tokens != 1 || !c.sample) return 1;
  int64_t steps = n;
  for (const ScheduledChunk& c : step.chunks) {
    const int64_t want = std::min(steps, max_pos - c.n_past);
    const int64_t kv_seq = c.seq->kv_seq;
    const int64_t can = std::min(want, kv_.max_reservable(kv_seq) - c.n_past);
    steps = std::max<int64_t>(1, can);
    DUET_CHECK(kv_.reserve(kv_seq, c.n_past + steps), "lookahead reserve of seq " << c.seq->id);
  }
  return steps;
}

void Scheduler::advance(const SchedulerStep& step, int64_t n) {
  for (const ScheduledChunk& c : step.chunks) c.seq->n_computed += n - 1;
}

SchedulerStep Scheduler::schedule() {
  SchedulerStep step;
  int64_t budget = config_.max_num_batched_tokens;
  schedule_decodes(step, budget);
  schedule_running_prefills(step, budget);
  schedule_waiting(step, budget);
  return step;
}

}  // namespace duet
