// The micro-batch splitter: where each kind of batch is cut, what each half's spans, positions
// and logits rows are, and the two-chunk split's continuation of the cut sequence.
#include "engine/micro_batch_split.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "core/error.h"

namespace duet {
namespace {

// A batch of sequences given as (seq_id, n_past, n_tokens), the tokens numbered 100, 101, ...;
// logits for each sequence's last token only, or every token when all_logits.
ForwardInput batch(const std::vector<std::array<int64_t, 3>>& seqs, bool all_logits = false) {
  ForwardInput in;
  int32_t next = 100;
  for (const auto& [seq, n_past, n] : seqs) {
    std::vector<int32_t> toks;
    for (int64_t i = 0; i < n; ++i) toks.push_back(next++);
    in.add(static_cast<int32_t>(seq), n_past, toks.data(), n, all_logits);
  }
  return in;
}

// "seq@n_past+n_tokens ..." of a half, e.g. "3@10+1 4@0+5".
std::string spans(const ForwardInput& in) {
  std::string s;
  for (const SeqSpan& sp : in.spans) {
    if (!s.empty()) s += " ";
    s += std::to_string(sp.seq_id) + "@" + std::to_string(sp.n_past) + "+" +
         std::to_string(sp.n_tokens);
  }
  return s;
}

TEST(MicroBatchSplitTest, DecodeSplitsBySequenceIntoEqualHalves) {
  // 5 sequences decoding one token each: A = seqs 0-2, B = seqs 3-4.
  const ForwardInput in = batch({{0, 7, 1}, {1, 3, 1}, {2, 9, 1}, {3, 1, 1}, {4, 4, 1}});
  const MicroBatchSplit s = split_batch(in);
  EXPECT_EQ(s.cut, 3);
  EXPECT_FALSE(s.two_chunk);
  EXPECT_EQ(spans(s.a), "0@7+1 1@3+1 2@9+1");
  EXPECT_EQ(spans(s.b), "3@1+1 4@4+1");
  EXPECT_EQ(s.b.tokens, (std::vector<int32_t>{103, 104}));
  EXPECT_EQ(s.b.pos, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(s.a.out_rows, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(s.b.out_rows, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s.b.spans[1].first, 1);
}

TEST(MicroBatchSplitTest, MixedBatchesCutAtTheSequenceBoundaryThatBalancesTokens) {
  // Tokens:  | d0 | d1 | p2 p2 p2 p2 p2 p2 | p3 p3 p3 p3 p3 p3 p3 p3 |   (16 tokens)
  // Boundaries at 1, 2 and 8: 8 balances (8 | 8).
  ForwardInput in = batch({{0, 5, 1}, {1, 6, 1}, {2, 0, 6}, {3, 0, 8}});
  in.mode = ForwardMode::kPrefill;
  const MicroBatchSplit s = split_batch(in);
  EXPECT_EQ(s.cut, 8);
  EXPECT_FALSE(s.two_chunk);
  EXPECT_EQ(spans(s.a), "0@5+1 1@6+1 2@0+6");
  EXPECT_EQ(spans(s.b), "3@0+8");
  EXPECT_EQ(s.a.mode, ForwardMode::kPrefill);
  EXPECT_EQ(s.b.mode, ForwardMode::kPrefill);
  EXPECT_EQ(s.a.out_rows, (std::vector<int64_t>{0, 1, 7}));
  EXPECT_EQ(s.b.out_rows, (std::vector<int64_t>{7}));
}

TEST(MicroBatchSplitTest, UnbalancedSequencesTakeTheTwoChunkSplit) {
  // Tokens: | p0 x3 | p1 x13 |: the only boundary (3 | 13) leaves A 3/16 < 0.48 of them, so the
  // cut is the midpoint 8, inside seq 1: its first 5 tokens in A, the other 8 in B, continuing at
  // n_past 2 + 5.
  const ForwardInput in = batch({{0, 0, 3}, {1, 2, 13}}, /*all_logits=*/true);
  const MicroBatchSplit s = split_batch(in);
  EXPECT_EQ(s.cut, 8);
  EXPECT_TRUE(s.two_chunk);
  EXPECT_EQ(spans(s.a), "0@0+3 1@2+5");
  EXPECT_EQ(spans(s.b), "1@7+8");
  EXPECT_EQ(s.b.pos.front(), 7);
  EXPECT_EQ(s.a.out_rows.size() + s.b.out_rows.size(), in.out_rows.size());
  EXPECT_EQ(s.b.out_rows.front(), 0);
  // With a threshold of 0.1 the boundary is good enough.
  EXPECT_EQ(split_batch(in, 0.1).cut, 3);
}

TEST(MicroBatchSplitTest, OneLongPromptIsCutInTwoChunks) {
  const ForwardInput in = batch({{4, 0, 9}});
  const MicroBatchSplit s = split_batch(in);
  EXPECT_TRUE(s.two_chunk);
  EXPECT_EQ(spans(s.a), "4@0+5");
  EXPECT_EQ(spans(s.b), "4@5+4");
  EXPECT_TRUE(s.a.out_rows.empty());  // the prompt's logits are its last token's: B's
  EXPECT_EQ(s.b.out_rows, (std::vector<int64_t>{3}));
}

TEST(MicroBatchSplitTest, TheHalvesJoinBackIntoTheBatch) {
  const ForwardInput in = batch({{0, 0, 3}, {1, 9, 1}, {2, 0, 7}, {3, 4, 2}}, true);
  for (double threshold : {0.0, 0.48, 0.5}) {
    const MicroBatchSplit s = split_batch(in, threshold);
    std::vector<int32_t> toks = s.a.tokens;
    toks.insert(toks.end(), s.b.tokens.begin(), s.b.tokens.end());
    EXPECT_EQ(toks, in.tokens) << threshold;
    std::vector<int64_t> pos = s.a.pos;
    pos.insert(pos.end(), s.b.pos.begin(), s.b.pos.end());
    EXPECT_EQ(pos, in.pos) << threshold;
    std::vector<int64_t> rows = s.a.out_rows;
    for (int64_t r : s.b.out_rows) rows.push_back(r + s.cut);
    EXPECT_EQ(rows, in.out_rows) << threshold;
    EXPECT_GT(s.a.n_tokens(), 0);
    EXPECT_GT(s.b.n_tokens(), 0);
  }
}

TEST(MicroBatchSplitTest, ABatchOfOneTokenCannotSplit) {
  const ForwardInput one = batch({{0, 3, 1}});
  EXPECT_FALSE(can_split_batch(one));
  EXPECT_THROW(split_batch(one), Error);
  EXPECT_TRUE(can_split_batch(batch({{0, 3, 1}, {1, 3, 1}})));
  EXPECT_TRUE(can_split_batch(batch({{0, 0, 2}})));
}

}  // namespace
}  // namespace duet
