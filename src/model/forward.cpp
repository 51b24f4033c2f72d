#include "model/forward.h"

#include <algorithm>

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

namespace {

// dst[0, n) = src[0, n) in `dtype` (kF32 or kBF16).
void convert_row(DType dtype, const float* src, int64_t n, void* dst) {
  if (dtype == DType::kBF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else {
    DUET_CHECK(dtype == DType::kF32, "KV rows of dtype " << dtype_name(dtype));
    std::copy_n(src, n, static_cast<float*>(dst));
  }
}

}  // namespace

void KvStore::store_k(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n) {
  convert_row(dtype(), src, n, k(seq_id, il, pos));
}

void KvStore::store_v(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n) {
  convert_row(dtype(), src, n, v(seq_id, il, pos));
}

}  // namespace duet
