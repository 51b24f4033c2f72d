// Memory for buffers that are streamed from end to end again and again (weights, one pass per
// decode step), in 2 MiB pages where the kernel grants them (transparent huge pages, asked for
// with MADV_HUGEPAGE, which "madvise" mode requires). In 4 KiB pages such a pass misses the TLB
// every 4 KiB: a 1 GiB read on 2 threads ran 1.05-1.10x faster in huge pages (Zen 4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace duet {

struct FreeHuge {
  void operator()(void* p) const;
};
using HugePtr = std::unique_ptr<void, FreeHuge>;

// `bytes` (rounded up to 2 MiB) on a 2 MiB boundary, advised MADV_HUGEPAGE (a no-op where
// transparent huge pages are off). Throws Error when the memory cannot be had.
HugePtr allocate_huge(size_t bytes);

// `bytes` for a buffer streamed like the weights but grown and freed as it goes (a sequence's KV
// rows): from allocate_huge when it is a huge page or more, else 64-byte aligned heap memory (a
// small buffer in a huge page of its own would hold 2 MiB once touched). Uninitialised.
HugePtr allocate_streamed(size_t bytes);

// Many buffers cut from slabs of allocate_huge memory, each 64-byte aligned and living as long
// as the arena: the weights of a model, matrix by matrix (a routed expert's matrices are a few
// hundred KiB, too small for huge pages of their own). Not thread-safe: one loader fills it.
class HugePageArena {
 public:
  // `bytes` of 64-byte aligned memory, uninitialised.
  void* allocate(size_t bytes);
  // Bytes of the slabs taken so far (what the arena holds, used or not).
  uint64_t reserved_bytes() const { return reserved_; }

 private:
  static constexpr size_t kSlabBytes = size_t{32} << 20;
  std::vector<HugePtr> slabs_;
  char* next_ = nullptr;  // the free tail of the last slab of kSlabBytes
  size_t left_ = 0;
  uint64_t reserved_ = 0;
};

}  // namespace duet
