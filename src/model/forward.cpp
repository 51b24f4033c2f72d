#include "model/forward.h"

#include "core/error.h"

namespace duet {

void ForwardInput::add(int32_t seq_id, int64_t n_past, const int32_t* toks, int64_t n,
                       bool all_logits) {
  DUET_CHECK(n > 0, "empty span for seq " << seq_id);
  SeqSpan span{seq_id, n_past, n_tokens(), n};
  const int32_t span_index = static_cast<int32_t>(spans.size());
  spans.push_back(span);
  for (int64_t i = 0; i < n; ++i) {
    tokens.push_back(toks[i]);
    pos.push_back(n_past + i);
    span_of.push_back(span_index);
    if (all_logits || i == n - 1) out_rows.push_back(span.first + i);
  }
}

}  // namespace duet
