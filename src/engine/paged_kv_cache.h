// The serving KV store: every sequence has a block table mapping its positions, block_size at a
// time, onto blocks of a shared BlockPool. GQA models keep K and V rows; MLA models keep the
// compressed latent in the k rows (v width 0), so an MLA block is a "latent block". The rows'
// dtype is the pool's (BlockPoolShape::dtype).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/block_pool.h"
#include "model/forward.h"

namespace duet {

class PagedKvView;

class PagedKvCache final : public KvStore {
 public:
  // The pool must outlive the cache. Not thread-safe: one engine thread owns it.
  explicit PagedKvCache(BlockPool& pool);
  ~PagedKvCache() override;

  // A new sequence with an empty block table; ids of removed sequences are reused.
  int32_t add_sequence();
  // Returns the sequence's blocks to the pool.
  void remove_sequence(int32_t seq_id);

  // Makes rows for positions [0, n_pos) exist, allocating blocks as needed. All or nothing:
  // returns false, changing nothing, when the pool has too few free blocks.
  bool reserve(int32_t seq_id, int64_t n_pos);
  // Positions the sequence could hold after reserve() with the blocks free now.
  int64_t max_reservable(int32_t seq_id) const;
  // Positions the sequence's blocks hold now.
  int64_t capacity(int32_t seq_id) const;
  const std::vector<int32_t>& block_table(int32_t seq_id) const;
  // The block tables of the sequences `in` runs over, copied: a forward pass on another thread
  // reads them while this cache goes on reserving and freeing for the next step (overlapped
  // scheduler). The rows themselves are the pool's, which stays put.
  PagedKvView snapshot(const ForwardInput& in) const;

  // Blocks a sequence of n_pos positions needs.
  int64_t blocks_for(int64_t n_pos) const;
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  int64_t n_sequences() const;

  DType dtype() const override { return pool_.shape().dtype; }
  void* k(int32_t seq_id, int64_t il, int64_t pos) override;
  void* v(int32_t seq_id, int64_t il, int64_t pos) override;
  // A run ends at the end of a block: a block's rows of one layer are contiguous.
  KvRows rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) override;

 private:
  struct Seq {
    bool live = false;
    std::vector<int32_t> blocks;  // block table: positions [i * block_size, (i + 1) * block_size)
  };
  Seq& seq(int32_t seq_id);
  const Seq& seq(int32_t seq_id) const;

  BlockPool& pool_;
  int64_t block_size_;
  std::vector<Seq> seqs_;
};

// One step's view of a PagedKvCache (PagedKvCache::snapshot): the same rows, through block tables
// that no longer change. The pool must outlive it; blocks freed after the snapshot was taken must
// not be written by anyone else until the step that reads it has ended (the engine runs its steps
// one after another, so a block freed meanwhile is reused only by a later step).
class PagedKvView final : public KvStore {
 public:
  PagedKvView(BlockPool& pool, std::vector<std::vector<int32_t>> tables)
      : pool_(&pool), block_size_(pool.shape().block_size), tables_(std::move(tables)) {}

  DType dtype() const override { return pool_->shape().dtype; }
  void* k(int32_t seq_id, int64_t il, int64_t pos) override;
  void* v(int32_t seq_id, int64_t il, int64_t pos) override;
  KvRows rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) override;

 private:
  BlockPool* pool_;
  int64_t block_size_;
  std::vector<std::vector<int32_t>> tables_;  // [seq id] block table (empty: not in the step)
};

}  // namespace duet
