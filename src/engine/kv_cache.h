// A contiguous KV cache: each sequence owns one growable buffer laid out [layer][pos][width], so
// one layer's rows are consecutive and attention reads them as a stream (a position-major
// layout put each row a page or more from the next, a TLB miss per row), in huge pages once it
// is 2 MiB or more (allocate_streamed). Growing the buffer moves the rows (a paged block pool
// replaces this for serving).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/huge_pages.h"
#include "model/forward.h"

namespace duet {

class KvCache final : public KvStore {
 public:
  // k_width / v_width: elements per position per layer (v_width may be 0, as for MLA), each
  // of `dtype` (kF32 or kBF16).
  KvCache(int64_t n_layer, int64_t k_width, int64_t v_width, DType dtype = DType::kF32);

  // A new empty sequence; ids of removed sequences are reused.
  int32_t add_sequence();
  void remove_sequence(int32_t seq_id);
  // Makes rows for positions [0, n_pos) exist, keeping the rows written so far. Row pointers
  // stay valid until the next reserve.
  void reserve(int32_t seq_id, int64_t n_pos);
  int64_t capacity(int32_t seq_id) const;
  int64_t n_sequences() const;

  DType dtype() const override { return dtype_; }
  void* k(int32_t seq_id, int64_t il, int64_t pos) override;
  void* v(int32_t seq_id, int64_t il, int64_t pos) override;
  // All positions up to the capacity are one run of consecutive rows.
  KvRows rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) override;

 private:
  struct Seq {
    int64_t capacity = 0;      // positions
    HugePtr k;                 // [n_layer, capacity, k_width] dtype_
    HugePtr v;                 // [n_layer, capacity, v_width] dtype_
  };
  Seq& row_seq(int32_t seq_id, int64_t il, int64_t pos);
  Seq& seq(int32_t seq_id);
  const Seq& seq(int32_t seq_id) const;

  int64_t n_layer_, k_width_, v_width_;
  DType dtype_;
  int64_t elem_;                            // bytes of one element
  std::vector<std::unique_ptr<Seq>> seqs_;  // null = free id
};

// Sequences added to a KvCache for one scope (a generate() call), removed however it ends.
class ScopedSequences {
 public:
  explicit ScopedSequences(KvCache& kv) : kv_(kv) {}
  ~ScopedSequences() {
    for (int32_t id : ids_) kv_.remove_sequence(id);
  }
  ScopedSequences(const ScopedSequences&) = delete;
  ScopedSequences& operator=(const ScopedSequences&) = delete;

  int32_t add() { return ids_.emplace_back(kv_.add_sequence()); }
  int32_t operator[](size_t i) const { return ids_[i]; }

 private:
  KvCache& kv_;
  std::vector<int32_t> ids_;
};

}  // namespace duet
