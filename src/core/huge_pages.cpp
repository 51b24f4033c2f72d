#include "core/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace duet {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 64;

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

void FreeHuge::operator()(void* p) const {
  std::free(p);
}

HugePtr allocate_huge(size_t bytes) {
  const size_t n = round_up(std::max<size_t>(bytes, 1), kHugePage);
  void* p = std::aligned_alloc(kHugePage, n);
  if (!p) DUET_ERROR("out of memory: " << n << " bytes in huge pages");
  madvise(p, n, MADV_HUGEPAGE);  // a hint: without huge pages the memory is as good, slower
  return HugePtr(p);
}

HugePtr allocate_streamed(size_t bytes) {
  if (bytes >= kHugePage) return allocate_huge(bytes);
  void* p = std::aligned_alloc(kAlign, round_up(std::max<size_t>(bytes, 1), kAlign));
  if (!p) DUET_ERROR("out of memory: " << bytes << " bytes");
  return HugePtr(p);
}

void* HugePageArena::allocate(size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1), kAlign);
  if (bytes > kSlabBytes / 2) {  // a slab of its own, the current one left for smaller buffers
    slabs_.push_back(allocate_huge(bytes));
    reserved_ += round_up(bytes, kHugePage);
    return slabs_.back().get();
  }
  if (bytes > left_) {
    slabs_.push_back(allocate_huge(kSlabBytes));
    reserved_ += kSlabBytes;
    next_ = static_cast<char*>(slabs_.back().get());
    left_ = kSlabBytes;
  }
  void* p = next_;
  next_ += bytes;
  left_ -= bytes;
  return p;
}

}  // namespace duet
