// A fixed pool of KV blocks for serving. A block holds the KV rows of block_size consecutive
// positions of one sequence for every layer; blocks are handed out and taken back through a free
// list, so sequences of any length share one preallocated arena without copying.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/huge_pages.h"

namespace duet {

struct BlockPoolShape {
  int64_t n_layer = 0;
  int64_t k_width = 0;        // elements per position per layer in the k rows
  int64_t v_width = 0;        // ... in the v rows (0 for MLA, whose latent lives in k)
  int64_t block_size = 16;    // positions per block
  DType dtype = DType::kF32;  // of the elements: kF32 or kBF16 (half the bytes per block)
};

class BlockPool {
 public:
  // n_blocks blocks of `shape`. The arena is allocated uninitialised, so pages the server never
  // touches cost no memory.
  BlockPool(const BlockPoolShape& shape, int64_t n_blocks);

  // How many blocks fit in `bytes` (a bf16 pool holds twice an f32 pool's blocks).
  static int64_t blocks_in(const BlockPoolShape& shape, uint64_t bytes);
  static uint64_t bytes_per_block(const BlockPoolShape& shape);

  // A free block's id, or -1 if none is left.
  int32_t alloc();
  void free(int32_t block);

  int64_t n_blocks() const { return n_blocks_; }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used() const { return n_blocks_ - n_free(); }
  const BlockPoolShape& shape() const { return shape_; }

  // [k_width] row (of shape().dtype) of layer il at offset `off` (< block_size) inside `block`.
  void* k(int32_t block, int64_t il, int64_t off) {
    return static_cast<std::byte*>(k_.get()) + row(block, il, off) * k_row_;
  }
  // [v_width] row; nullptr when v_width is 0 (MLA), which no caller reads.
  void* v(int32_t block, int64_t il, int64_t off) {
    return static_cast<std::byte*>(v_.get()) + row(block, il, off) * v_row_;
  }

 private:
  int64_t row(int32_t block, int64_t il, int64_t off) const {
    return (block * shape_.n_layer + il) * shape_.block_size + off;
  }

  BlockPoolShape shape_;
  int64_t n_blocks_;
  int64_t k_row_, v_row_;           // bytes of a k / v row
  // In huge pages: every decode step streams a sequence's rows, and the blocks scattered over
  // the pool are far apart.
  HugePtr k_;                       // [n_blocks, n_layer, block_size, k_width] shape_.dtype
  HugePtr v_;                       // [n_blocks, n_layer, block_size, v_width] shape_.dtype
  std::vector<int32_t> free_;       // stack of free block ids; lowest ids handed out first
  std::vector<uint8_t> in_use_;     // [n_blocks] catches double frees
};

}  // namespace duet
