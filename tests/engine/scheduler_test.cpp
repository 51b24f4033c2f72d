// The scheduler stepped with a fake forward pass: every iteration's batch is asserted as a
// layout string. "A[0,5)" is sequence A's tokens 0..4 in this step; a trailing "*" means the
// chunk ends at A's last token, so the step samples A's next token; "-B" means B was preempted
// (its blocks freed, back to the front of the waiting queue).
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "core/error.h"

namespace duet {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  // block_size 4; n_blocks blocks in the pool.
  void init(int64_t n_blocks, int64_t max_num_seqs, int64_t max_num_batched_tokens) {
    pool_ = std::make_unique<BlockPool>(BlockPoolShape{1, 1, 0, 4}, n_blocks);
    kv_ = std::make_unique<PagedKvCache>(*pool_);
    sched_ = std::make_unique<Scheduler>(SchedulerConfig{max_num_seqs, max_num_batched_tokens}, *kv_);
  }

  // A request named `name` with a prompt of n_prompt tokens that generates max_tokens.
  Sequence* add(char name, int64_t n_prompt, int64_t max_tokens) {
    auto s = std::make_unique<Sequence>();
    s->id = static_cast<uint64_t>(seqs_.size() + 1);
    s->tokens.assign(static_cast<size_t>(n_prompt), 7);
    s->n_prompt = n_prompt;
    s->max_tokens = max_tokens;
    names_[s.get()] = name;
    sched_->add(s.get());
    seqs_.push_back(std::move(s));
    return seqs_.back().get();
  }

  // One iteration: schedule, then the fake forward pass appends a token to every sampled
  // sequence and finishes those at max_tokens. Returns the batch layout.
  std::string step() {
    SchedulerStep plan = sched_->schedule();
    std::string out;
    for (const ScheduledChunk& c : plan.chunks) {
      if (!out.empty()) out += " ";
      out += std::string(1, names_[c.seq]) + "[" + std::to_string(c.n_past) + "," +
             std::to_string(c.n_past + c.n_tokens) + ")" + (c.sample ? "*" : "");
      EXPECT_LE(c.n_past + c.n_tokens, kv_->capacity(c.seq->kv_seq)) << "rows not reserved";
    }
    for (Sequence* p : plan.preempted) out += std::string(" -") + names_[p];
    for (const ScheduledChunk& c : plan.chunks) {
      if (!c.sample) continue;
      c.seq->tokens.push_back(1000);
      if (c.seq->n_generated() >= c.seq->max_tokens) sched_->remove(c.seq);
    }
    EXPECT_LE(plan.n_tokens, sched_->config().max_num_batched_tokens);
    return out;
  }

  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<PagedKvCache> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  std::map<const Sequence*, char> names_;
};

// Budget 8 tokens per step. A (3-token prompt, 3 tokens out) and B (20-token prompt, 2 out):
//
//   step 1 | A A A* B B B B B          A prefilled in full, B's first chunk of 5
//   step 2 | A* B B B B B B B          A decodes first; B gets the other 7
//   step 3 | A* B B B B B B B          A's third token: A finishes
//   step 4 | B*                        B's last prompt token: first sample
//   step 5 | B*                        B decodes and finishes
TEST_F(SchedulerTest, DecodesFirstThenChunkedPrefill) {
  init(/*n_blocks=*/64, /*max_num_seqs=*/4, /*max_num_batched_tokens=*/8);
  add('A', 3, 3);
  add('B', 20, 2);
  EXPECT_EQ(step(), "A[0,3)* B[0,5)");
  EXPECT_EQ(step(), "A[3,4)* B[5,12)");
  EXPECT_EQ(step(), "A[4,5)* B[12,19)");
  EXPECT_EQ(step(), "B[19,20)*");
  EXPECT_EQ(step(), "B[20,21)*");
  EXPECT_EQ(step(), "");
  EXPECT_TRUE(sched_->idle());
  EXPECT_EQ(pool_->n_used(), 0);
}

// A long prompt never starves running decodes: A and B decode in every step while C's
// 30-token prompt is prefilled 6 tokens at a time in what is left of the budget of 8.
//
//   step 1 | A* B* C C C C C C
//   step 2 | A* B* C C C C C C   ... until C's last chunk ends at its last token.
TEST_F(SchedulerTest, LongPrefillDoesNotStarveDecodes) {
  init(64, 4, 8);
  add('A', 1, 10);
  add('B', 1, 10);
  EXPECT_EQ(step(), "A[0,1)* B[0,1)*");
  add('C', 30, 1);
  EXPECT_EQ(step(), "A[1,2)* B[1,2)* C[0,6)");
  EXPECT_EQ(step(), "A[2,3)* B[2,3)* C[6,12)");
  EXPECT_EQ(step(), "A[3,4)* B[3,4)* C[12,18)");
  EXPECT_EQ(step(), "A[4,5)* B[4,5)* C[18,24)");
  EXPECT_EQ(step(), "A[5,6)* B[5,6)* C[24,30)*");
  EXPECT_EQ(step(), "A[6,7)* B[6,7)*");
}

// max_num_seqs 2: C waits, first come first served, until a slot frees; a later small request
// D never overtakes C.
//
//   step 1 | A A* B B*            C, D wait (two sequences at most)
//   step 2 | A* B*                A finishes
//   step 3 | B* C C C*            C takes A's slot; D still waits
TEST_F(SchedulerTest, WaitingQueueIsFirstComeFirstServed) {
  init(64, 2, 16);
  add('A', 2, 2);
  add('B', 2, 5);
  add('C', 3, 1);
  add('D', 1, 1);
  EXPECT_EQ(step(), "A[0,2)* B[0,2)*");
  EXPECT_EQ(sched_->n_waiting(), 2);
  EXPECT_EQ(step(), "A[2,3)* B[2,3)*");
  EXPECT_EQ(step(), "B[3,4)* C[0,3)*");  // C finishes (1 token)
  EXPECT_EQ(step(), "B[4,5)* D[0,1)*");
}

// The waiting head that lacks blocks blocks the queue; it starts when blocks come back.
// Pool: 3 blocks of 4 positions. A holds 2 (prompt 8), B needs 2 (prompt 5): only 1 block is
// free, so B gets a 4-token chunk, then must wait (it is the newest) until A finishes.
//
//   step 1 | A A A A A A A A*        B B B B (1 block)
//   ...
TEST_F(SchedulerTest, PrefillTakesOnlyFreeBlocks) {
  init(3, 4, 16);
  add('A', 8, 1);
  add('B', 5, 1);
  EXPECT_EQ(step(), "A[0,8)* B[0,4)");  // A finishes: its 2 blocks return
  EXPECT_EQ(step(), "B[4,5)*");
  EXPECT_EQ(pool_->n_used(), 0);
}

// Blocks run out while decoding: the newest running sequence is preempted by recompute and
// later prefills its prompt and generated tokens again.
// Pool: 4 blocks of 4 positions = 16. A and B: 6-token prompts, 6 tokens out each.
//
//   step 1 | A[0,6)* B[0,6)*        2 + 2 blocks: the pool is full
//   step 2 | A[6,7)* B[6,7)*        positions 6 fit in the second blocks
//   step 3 | A[7,8)* B[7,8)*
//   step 4 | A[8,9)* -B             A needs a third block: B (newest) is preempted
//   step 5 | A[9,10)* B[0,4)        B recomputes its 9 tokens as far as the 1 free block allows
//   step 6 | A[10,11)*              A finishes; B, newest and short of blocks, waits
//   step 7 | B[4,9)*                the rest of B's recompute samples its 4th token
//   step 8 | B[9,10)*               ... and B decodes on
TEST_F(SchedulerTest, PreemptsNewestByRecompute) {
  init(4, 4, 16);
  Sequence* a = add('A', 6, 6);
  Sequence* b = add('B', 6, 6);
  EXPECT_EQ(step(), "A[0,6)* B[0,6)*");
  EXPECT_EQ(step(), "A[6,7)* B[6,7)*");
  EXPECT_EQ(step(), "A[7,8)* B[7,8)*");
  EXPECT_EQ(step(), "A[8,9)* -B");
  EXPECT_EQ(b->n_preempted, 1);
  EXPECT_EQ(b->n_computed, 0);
  EXPECT_EQ(b->n_generated(), 3);  // kept: recomputed, not regenerated
  EXPECT_EQ(step(), "A[9,10)* B[0,4)");
  EXPECT_EQ(step(), "A[10,11)*");
  EXPECT_EQ(a->n_generated(), 6);
  EXPECT_EQ(step(), "B[4,9)*");
  EXPECT_EQ(step(), "B[9,10)*");
  EXPECT_EQ(step(), "B[10,11)*");
  EXPECT_EQ(b->n_generated(), 6);
  EXPECT_TRUE(sched_->idle());
  EXPECT_EQ(pool_->n_used(), 0);
}

TEST_F(SchedulerTest, RequestLargerThanThePoolCanNeverFit) {
  init(4, 4, 16);
  EXPECT_TRUE(sched_->can_fit(16));
  EXPECT_FALSE(sched_->can_fit(17));
}

TEST_F(SchedulerTest, RemovingARunningSequenceFreesItsBlocks) {
  init(8, 4, 16);
  Sequence* a = add('A', 9, 5);
  EXPECT_EQ(step(), "A[0,9)*");
  EXPECT_EQ(pool_->n_used(), 3);
  sched_->remove(a);
  EXPECT_EQ(pool_->n_used(), 0);
  EXPECT_TRUE(sched_->idle());
  EXPECT_EQ(step(), "");
}

TEST_F(SchedulerTest, BudgetMustCoverEveryRunningSequence) {
  BlockPool pool({1, 1, 0, 4}, 4);
  PagedKvCache kv(pool);
  EXPECT_THROW(Scheduler({8, 4}, kv), Error);
}

// The overlapped scheduler appends the step in flight's token as a placeholder: a sequence whose
// placeholders already reach max_tokens ends with that step and is not scheduled again.
TEST_F(SchedulerTest, ASequenceWhosePendingTokenIsItsLastIsNotScheduled) {
  init(8, 4, 16);
  Sequence* a = add('A', 3, 2);
  Sequence* b = add('B', 3, 5);
  SchedulerStep s1 = sched_->schedule();  // both prefill
  ASSERT_EQ(s1.chunks.size(), 2u);
  a->tokens.push_back(-1);  // placeholders of step 1's samples
  b->tokens.push_back(-2);
  SchedulerStep s2 = sched_->schedule();  // both decode their placeholder
  ASSERT_EQ(s2.chunks.size(), 2u);
  a->tokens.push_back(-3);  // A's second token: its last
  b->tokens.push_back(-4);
  SchedulerStep s3 = sched_->schedule();
  ASSERT_EQ(s3.chunks.size(), 1u);
  EXPECT_EQ(s3.chunks[0].seq, b);
}

// Multi-step: a decode-only batch reserves rows for up to n steps; the count is what every chunk
// has rows for, never past the context, and 1 for a batch with prompt tokens.
TEST_F(SchedulerTest, LookaheadReservesRowsForEveryStep) {
  init(8, 4, 16);  // 8 blocks of 4 positions
  Sequence* a = add('A', 3, 20);
  Sequence* b = add('B', 6, 20);
  SchedulerStep s1 = sched_->schedule();
  EXPECT_EQ(sched_->reserve_lookahead(s1, 4, 100), 1) << "a prefill batch runs one step";
  a->tokens.push_back(1);
  b->tokens.push_back(1);
  SchedulerStep s2 = sched_->schedule();  // A at 3, B at 6
  EXPECT_EQ(sched_->reserve_lookahead(s2, 4, 100), 4);
  EXPECT_GE(kv_->capacity(a->kv_seq), 3 + 4);
  EXPECT_GE(kv_->capacity(b->kv_seq), 6 + 4);
  Scheduler::advance(s2, 4);
  EXPECT_EQ(a->n_computed, 3 + 4);
  EXPECT_EQ(b->n_computed, 6 + 4);
  for (int i = 0; i < 4; ++i) {
    a->tokens.push_back(1);
    b->tokens.push_back(1);
  }
  // The context: B's positions may not pass 12.
  SchedulerStep s3 = sched_->schedule();  // A at 7, B at 10
  EXPECT_EQ(sched_->reserve_lookahead(s3, 8, 12), 2);
}

TEST_F(SchedulerTest, LookaheadIsBoundedByFreeBlocks) {
  init(4, 4, 16);  // 16 positions in all
  Sequence* a = add('A', 7, 20);
  Sequence* b = add('B', 3, 20);
  sched_->schedule();  // A: 2 blocks, B: 1 block; 1 left
  a->tokens.push_back(1);
  b->tokens.push_back(1);
  SchedulerStep s = sched_->schedule();  // A at 7 (room for 8), B at 3 (room for 4)
  // A takes the free block (to position 12 at most: 5 steps); B has then only its own block,
  // room for its position 3: one step. The batch runs one.
  EXPECT_EQ(sched_->reserve_lookahead(s, 8, 100), 1);
  EXPECT_EQ(pool_->n_free(), 0);
}

}  // namespace
}  // namespace duet
