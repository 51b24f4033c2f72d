#include "engine/block_pool.h"

#include "core/error.h"

namespace duet {

uint64_t BlockPool::bytes_per_block(const BlockPoolShape& s) {
  return static_cast<uint64_t>(s.block_size * s.n_layer * (s.k_width + s.v_width)) *
         dtype_size(s.dtype);
}

int64_t BlockPool::blocks_in(const BlockPoolShape& s, uint64_t bytes) {
  const uint64_t per = bytes_per_block(s);
  DUET_CHECK(per > 0, "empty KV block shape: layers " << s.n_layer << " block_size "
                                                      << s.block_size << " widths " << s.k_width
                                                      << "/" << s.v_width);
  return static_cast<int64_t>(bytes / per);
}

BlockPool::BlockPool(const BlockPoolShape& shape, int64_t n_blocks)
    : shape_(shape),
      n_blocks_(n_blocks),
      k_row_(shape.k_width * static_cast<int64_t>(dtype_size(shape.dtype))),
      v_row_(shape.v_width * static_cast<int64_t>(dtype_size(shape.dtype))) {
  DUET_CHECK(n_blocks > 0 && n_blocks < (int64_t{1} << 31), "n_blocks " << n_blocks);
  DUET_CHECK(shape.block_size > 0 && shape.n_layer > 0 && shape.k_width > 0 && shape.v_width >= 0,
             "block_size " << shape.block_size << " n_layer " << shape.n_layer << " widths "
                           << shape.k_width << "/" << shape.v_width);
  DUET_CHECK(shape.dtype == DType::kF32 || shape.dtype == DType::kBF16,
             "KV blocks of dtype " << dtype_name(shape.dtype));
  const int64_t rows = n_blocks * shape.n_layer * shape.block_size;
  k_ = allocate_huge(static_cast<size_t>(rows * k_row_));
  if (shape.v_width > 0) v_ = allocate_huge(static_cast<size_t>(rows * v_row_));
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  in_use_.assign(static_cast<size_t>(n_blocks), 0);
}

int32_t BlockPool::alloc() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  in_use_[b] = 1;
  return b;
}

void BlockPool::free(int32_t block) {
  DUET_CHECK(block >= 0 && block < n_blocks_ && in_use_[block],
             "freeing block " << block << " of " << n_blocks_ << " that is not in use");
  in_use_[block] = 0;
  free_.push_back(block);
}

}  // namespace duet
