#include "core/huge_pages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace duet {
namespace {

// kB of anonymous huge pages (smaps' AnonHugePages) in this process's mapping that holds p; -1
// when no mapping holds it.
int64_t anon_huge_kb_at(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= a && a < end;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stoll(line.substr(14));
    }
  }
  return -1;
}

// Whether the kernel hands out transparent huge pages to memory advised MADV_HUGEPAGE.
bool huge_pages_on_advice() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(f, modes);
  return modes.find("[always]") != std::string::npos ||
         modes.find("[madvise]") != std::string::npos;
}

TEST(HugePagesTest, AllocationIsOnA2MiBBoundaryAndInHugePagesWhereTheKernelGivesThem) {
  const size_t bytes = size_t{8} << 20;
  HugePtr p = allocate_huge(bytes);
  ASSERT_NE(p.get(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % (size_t{2} << 20), 0u);
  std::memset(p.get(), 1, bytes);  // the pages come at the first touch
  if (!huge_pages_on_advice()) GTEST_SKIP() << "transparent huge pages are off on this machine";
  // Not every page need be huge (the kernel may lack a free 2 MiB frame), but some are.
  EXPECT_GT(anon_huge_kb_at(p.get()), 0);
}

TEST(HugePagesTest, ArenaHandsOutAlignedDisjointBuffersAndSlabsForLargeOnes) {
  HugePageArena arena;
  EXPECT_EQ(arena.reserved_bytes(), 0u);
  std::vector<std::pair<char*, size_t>> got;
  // Small buffers share a 32 MiB slab; one above half a slab gets a slab of its own (rounded to
  // 2 MiB) and the small ones after it go on filling the first.
  for (size_t bytes :
       {size_t{1}, size_t{100}, size_t{3} << 20, size_t{20} << 20, size_t{64}, size_t{5} << 20}) {
    auto* p = static_cast<char*>(arena.allocate(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    std::memset(p, static_cast<int>(got.size()), bytes);
    got.emplace_back(p, bytes);
  }
  EXPECT_EQ(arena.reserved_bytes(), (size_t{32} << 20) + (size_t{20} << 20));
  for (size_t i = 0; i < got.size(); ++i) {
    const auto [p, n] = got[i];
    EXPECT_TRUE(std::all_of(p, p + n, [&](char c) { return c == static_cast<char>(i); })) << i;
    for (size_t j = 0; j < i; ++j) {
      EXPECT_TRUE(p + n <= got[j].first || got[j].first + got[j].second <= p) << i << " " << j;
    }
  }
  // About 8 MiB of the slab are used: 15 MiB more fit in its tail, another 15 start a new slab.
  arena.allocate(size_t{15} << 20);
  EXPECT_EQ(arena.reserved_bytes(), (size_t{32} << 20) + (size_t{20} << 20));
  arena.allocate(size_t{15} << 20);
  EXPECT_EQ(arena.reserved_bytes(), (size_t{64} << 20) + (size_t{20} << 20));
}

}  // namespace
}  // namespace duet
