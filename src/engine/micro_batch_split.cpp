#include "engine/micro_batch_split.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace duet {

bool can_split_batch(const ForwardInput& in) {
  return in.spans.size() >= 2 || in.n_tokens() >= 2;
}

ForwardInput slice_batch(const ForwardInput& in, int64_t begin, int64_t end) {
  DUET_CHECK(0 <= begin && begin < end && end <= in.n_tokens(),
             "slice_batch: tokens [" << begin << ", " << end << ") of " << in.n_tokens());
  ForwardInput out;
  out.mode = in.mode;
  for (const SeqSpan& span : in.spans) {
    const int64_t lo = std::max(begin, span.first);
    const int64_t hi = std::min(end, span.first + span.n_tokens);
    if (lo >= hi) continue;
    const int32_t index = static_cast<int32_t>(out.spans.size());
    out.spans.push_back({span.seq_id, span.n_past + (lo - span.first), lo - begin, hi - lo});
    for (int64_t t = lo; t < hi; ++t) {
      out.tokens.push_back(in.tokens[static_cast<size_t>(t)]);
      out.pos.push_back(in.pos[static_cast<size_t>(t)]);
      out.span_of.push_back(index);
    }
  }
  for (int64_t row : in.out_rows) {
    if (row >= begin && row < end) out.out_rows.push_back(row - begin);
  }
  return out;
}

MicroBatchSplit split_batch(const ForwardInput& in, double distribution_threshold) {
  DUET_CHECK(can_split_batch(in), "split_batch: " << in.spans.size() << " sequences, "
                                                  << in.n_tokens() << " tokens");
  DUET_CHECK(std::is_sorted(in.out_rows.begin(), in.out_rows.end()),
             "split_batch: logits rows out of order");
  const int64_t n = in.n_tokens();
  const bool decode = static_cast<int64_t>(in.spans.size()) == n;
  MicroBatchSplit s;
  if (decode) {
    s.cut = in.spans[(in.spans.size() + 1) / 2].first;
  } else {
    // The sequence boundary closest to the token midpoint (the earlier one on a tie).
    int64_t best = -1;
    for (size_t i = 1; i < in.spans.size(); ++i) {
      const int64_t at = in.spans[i].first;
      if (best < 0 || std::llabs(2 * at - n) < std::llabs(2 * best - n)) best = at;
    }
    const double smaller = best < 0 ? 0.0 : static_cast<double>(std::min(best, n - best)) / n;
    if (best < 0 || smaller < distribution_threshold) {
      s.cut = (n + 1) / 2;  // the two-chunk split: A takes the larger half
      s.two_chunk = in.spans[static_cast<size_t>(in.span_of[static_cast<size_t>(s.cut)])].first != s.cut;
    } else {
      s.cut = best;
    }
  }
  s.a = slice_batch(in, 0, s.cut);
  s.b = slice_batch(in, s.cut, n);
  return s;
}

}  // namespace duet
