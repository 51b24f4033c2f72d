// Cutting one rank's step batch into two micro-batches, A and B, each with its own forward input
// (tokens, positions, sequence spans: the attention metadata) — the piece of the overlap modes
// (TBO, DBO) whose history in vLLM and SGLang changed most, so it stands alone and is tested as a
// unit.
//
// - Decode batches (one token per sequence) split by sequence into two equal halves, A taking the
//   larger when the count is odd.
// - Prefill and mixed batches split by sequence at the point that best balances tokens. When even
//   that leaves a half with less than `distribution_threshold` of the tokens (SGLang's
//   --tbo-token-distribution-threshold, 0.48), the two-chunk split cuts at the token midpoint
//   instead: the sequence spanning it has its first part in A and the rest in B. B's part attends
//   over A's part, whose KV rows A writes in the same layer: the executors run A's stage of a
//   layer no later than B's (micro-batch A always leads).
//
// Logits rows: A's rows then B's are the whole batch's rows in order (in.out_rows ascend).
#pragma once

#include <cstdint>

#include "model/forward.h"

namespace duet {

struct MicroBatchSplit {
  ForwardInput a;  // tokens [0, cut) of the batch
  ForwardInput b;  // tokens [cut, n_tokens)
  int64_t cut = 0;
  bool two_chunk = false;  // a sequence is cut in two
};

inline constexpr double kDefaultTboDistributionThreshold = 0.48;

// Whether `in` can be split into two non-empty micro-batches: two sequences or more, or one of two
// tokens or more.
bool can_split_batch(const ForwardInput& in);

// Splits `in` (which can_split_batch) as described above. Both halves keep in.mode.
MicroBatchSplit split_batch(const ForwardInput& in,
                            double distribution_threshold = kDefaultTboDistributionThreshold);

// The part of `in` with tokens [begin, end): its spans clipped to the range (a span cut at
// `begin` continues at its n_past + the tokens before), its logits rows those in the range,
// renumbered. For the splitter and its tests.
ForwardInput slice_batch(const ForwardInput& in, int64_t begin, int64_t end);

}  // namespace duet
