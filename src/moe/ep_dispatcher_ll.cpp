// EpDispatcher's low_latency algorithm: fixed-capacity per-expert buffers, one round each way.
// The buffer of (destination r, local expert l) is a block of 1 + C·D f32 words: the row count
// (an int32, bit for bit), then C rows of D. The same layout carries the outputs back, so a
// (token, k) pair's output sits at the word offset its input had.
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"
#include "moe/ep_dispatcher.h"

namespace duet {

namespace {
void put_count(float* p, int64_t v) {
  const int32_t c = static_cast<int32_t>(v);
  std::memcpy(p, &c, 4);
}
int64_t get_count(const float* p) {
  int32_t c;
  std::memcpy(&c, p, 4);
  return c;
}
}  // namespace

void EpDispatcher::ll_dispatch_send() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd, C = opt_.max_tokens_per_rank;
  const int64_t L = placement_.n_local(), BW = 1 + C * D;
  if (tokens_.n_tokens > C) {
    DUET_ERROR("low_latency all-to-all: "
               << tokens_.n_tokens << " tokens exceed the capacity "
               << "of " << C << " per rank (max_tokens_per_rank); use high_throughput for "
               << "large batches");
  }
  const size_t words = static_cast<size_t>(n_rank_ * L * BW);
  send_.resize(words);
  recv_.resize(words);
  std::vector<int64_t> count(static_cast<size_t>(n_rank_ * L), 0);
  slot_of_.resize(static_cast<size_t>(tokens_.n_tokens * K));
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = tokens_.topk_ids[t * K + k];
      const int r = placement_.owner(e);
      const int64_t b = r * L + (e - placement_.begin(r));
      const int64_t off = b * BW + 1 + count[b]++ * D;
      std::memcpy(send_.data() + off, tokens_.x + t * D, static_cast<size_t>(D) * 4);
      slot_of_[t * K + k] = off;
    }
  }
  for (size_t b = 0; b < count.size(); ++b) put_count(send_.data() + b * BW, count[b]);
  dispatch_bytes_ = static_cast<int64_t>(words) * 4;
  const std::vector<int64_t> each = uniform(L * BW * 4);
  pending_ = comm_.start_all_to_all_v(send_.data(), each, recv_.data(), each);
}

// Expert l's rows: those from source 0, then source 1, ...
void EpDispatcher::ll_dispatch_recv() {
  const int64_t D = tokens_.n_embd, C = opt_.max_tokens_per_rank;
  const int64_t L = placement_.n_local(), BW = 1 + C * D;
  batch_.offsets.assign(static_cast<size_t>(L + 1), 0);
  int64_t rows = 0;
  for (int64_t l = 0; l < L; ++l) {
    for (int s = 0; s < n_rank_; ++s) {
      const int64_t c = get_count(recv_.data() + (s * L + l) * BW);
      DUET_CHECK(c >= 0 && c <= C, "low_latency: rank " << s << " sent " << c << " rows");
      src_row_[l * n_rank_ + s] = rows;
      rows += c;
    }
    batch_.offsets[l + 1] = rows;
  }
  batch_.x.resize(static_cast<size_t>(rows * D));
  for (int64_t l = 0; l < L; ++l) {
    for (int s = 0; s < n_rank_; ++s) {
      const float* block = recv_.data() + (s * L + l) * BW;
      std::memcpy(batch_.x.data() + src_row_[l * n_rank_ + s] * D, block + 1,
                  static_cast<size_t>(get_count(block) * D) * 4);
    }
  }
}

void EpDispatcher::ll_combine_send() {
  const int64_t D = tokens_.n_embd, C = opt_.max_tokens_per_rank;
  const int64_t L = placement_.n_local(), BW = 1 + C * D;
  back_.resize(recv_.size());
  ret_.resize(recv_.size());
  for (int64_t l = 0; l < L; ++l) {
    for (int s = 0; s < n_rank_; ++s) {
      const int64_t b = s * L + l;
      std::memcpy(back_.data() + b * BW + 1, batch_.y.data() + src_row_[l * n_rank_ + s] * D,
                  static_cast<size_t>(get_count(recv_.data() + b * BW) * D) * 4);
    }
  }
  combine_bytes_ = static_cast<int64_t>(back_.size()) * 4;
  const std::vector<int64_t> each = uniform(L * BW * 4);
  pending_ = comm_.start_all_to_all_v(back_.data(), each, ret_.data(), each);
}

// The weights are applied here, in k order, exactly as the single-rank dispatcher does.
void EpDispatcher::ll_combine_recv(float* out) {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd;
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      axpy(tokens_.topk_weights[t * K + k], ret_.data() + slot_of_[t * K + k], D, out + t * D);
    }
  }
}

}  // namespace duet
