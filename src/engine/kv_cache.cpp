#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace duet {

KvCache::KvCache(int64_t n_layer, int64_t k_width, int64_t v_width, DType dtype)
    : n_layer_(n_layer),
      k_width_(k_width),
      v_width_(v_width),
      dtype_(dtype),
      elem_(static_cast<int64_t>(dtype_size(dtype))) {
  DUET_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
             "KV cache of dtype " << dtype_name(dtype));
}

int32_t KvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i]) {
      seqs_[i] = std::make_unique<Seq>();
      return static_cast<int32_t>(i);
    }
  }
  seqs_.push_back(std::make_unique<Seq>());
  return static_cast<int32_t>(seqs_.size() - 1);
}

void KvCache::remove_sequence(int32_t seq_id) {
  seq(seq_id);  // checks the id
  seqs_[seq_id].reset();
}

KvCache::Seq& KvCache::seq(int32_t seq_id) {
  DUET_CHECK(seq_id >= 0 && seq_id < static_cast<int32_t>(seqs_.size()) && seqs_[seq_id],
             "unknown sequence " << seq_id);
  return *seqs_[seq_id];
}

const KvCache::Seq& KvCache::seq(int32_t seq_id) const {
  return const_cast<KvCache*>(this)->seq(seq_id);
}

namespace {

// old [n_layer, old_cap, row] → [n_layer, cap, row] (rows of row_bytes); the rows past old_cap
// are zero.
HugePtr regrow(const HugePtr& old, int64_t n_layer, int64_t old_cap, int64_t cap,
               int64_t row_bytes) {
  HugePtr grown = allocate_streamed(static_cast<size_t>(n_layer * cap * row_bytes));
  const auto* from = static_cast<const std::byte*>(old.get());
  auto* to = static_cast<std::byte*>(grown.get());
  for (int64_t il = 0; il < n_layer; ++il) {
    if (old_cap > 0) std::copy_n(from + il * old_cap * row_bytes, old_cap * row_bytes, to);
    std::fill_n(to + old_cap * row_bytes, (cap - old_cap) * row_bytes, std::byte{0});
    to += cap * row_bytes;
  }
  return grown;
}

}  // namespace

void KvCache::reserve(int32_t seq_id, int64_t n_pos) {
  Seq& s = seq(seq_id);
  if (n_pos <= s.capacity) return;
  // Grow geometrically so a decode loop reallocates (and moves) O(log n) times.
  const int64_t cap = std::max(n_pos, s.capacity * 2);
  s.k = regrow(s.k, n_layer_, s.capacity, cap, k_width_ * elem_);
  s.v = regrow(s.v, n_layer_, s.capacity, cap, v_width_ * elem_);
  s.capacity = cap;
}

int64_t KvCache::capacity(int32_t seq_id) const { return seq(seq_id).capacity; }

int64_t KvCache::n_sequences() const {
  return std::count_if(seqs_.begin(), seqs_.end(), [](const auto& s) { return s != nullptr; });
}

// The row of (seq_id, il, pos), checked: pos must be reserved, il a layer.
KvCache::Seq& KvCache::row_seq(int32_t seq_id, int64_t il, int64_t pos) {
  Seq& s = seq(seq_id);
  DUET_CHECK(pos >= 0 && pos < s.capacity && il >= 0 && il < n_layer_,
             "KV position " << pos << " of layer " << il << " of seq " << seq_id << " (capacity "
                            << s.capacity << ", " << n_layer_ << " layers)");
  return s;
}

void* KvCache::k(int32_t seq_id, int64_t il, int64_t pos) {
  Seq& s = row_seq(seq_id, il, pos);
  return static_cast<std::byte*>(s.k.get()) + (il * s.capacity + pos) * k_width_ * elem_;
}

void* KvCache::v(int32_t seq_id, int64_t il, int64_t pos) {
  Seq& s = row_seq(seq_id, il, pos);
  return static_cast<std::byte*>(s.v.get()) + (il * s.capacity + pos) * v_width_ * elem_;
}

KvRows KvCache::rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) {
  Seq& s = seq(seq_id);
  DUET_CHECK(pos >= 0 && pos < s.capacity && n_max >= 1,
             "KV position " << pos << " of seq " << seq_id << " (capacity " << s.capacity << ")");
  KvRows r;
  r.k = k(seq_id, il, pos);
  r.v = v_width_ > 0 ? v(seq_id, il, pos) : nullptr;
  r.k_stride = k_width_;
  r.v_stride = v_width_;
  r.n = std::min(n_max, s.capacity - pos);
  return r;
}

}  // namespace duet
