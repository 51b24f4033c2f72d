#include "kernels/bandwidth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/thread_pool.h"

namespace duet {
namespace {

// Each read() counts exactly its bytes and some time; reads go on past the buffer's end by
// wrapping around (a 1 GiB buffer for reads of 64 MiB: the 17th read starts over).
TEST(StepReadsTest, CountsEachReadsBytesAndWrapsAround) {
  ThreadPool pool(2);
  const size_t per_read = size_t{64} << 20;
  StepReads reads(pool, per_read);
  EXPECT_DOUBLE_EQ(reads.bytes_per_read(), static_cast<double>(per_read));
  for (int i = 0; i < 20; ++i) reads.read();
  EXPECT_DOUBLE_EQ(reads.bytes(), 20.0 * static_cast<double>(per_read));
  EXPECT_GT(reads.seconds(), 0.0);
  reads.reset();
  EXPECT_EQ(reads.bytes(), 0.0);
  EXPECT_EQ(reads.seconds(), 0.0);
  reads.read();
  EXPECT_DOUBLE_EQ(reads.bytes(), static_cast<double>(per_read));
}

// A read covers whole 256 bytes (4 cache lines, one step of its loop), at least one step.
TEST(StepReadsTest, ReadsWholeStepsOfFourCacheLines) {
  ThreadPool pool(2);
  EXPECT_DOUBLE_EQ(StepReads(pool, 1000).bytes_per_read(), 768.0);
  EXPECT_DOUBLE_EQ(StepReads(pool, 10).bytes_per_read(), 256.0);
  EXPECT_GT(measure_read_bandwidth(pool, 1000, 1), 0.0);
}

TEST(CacheSizeTest, ParsesSysfsSizes) {
  EXPECT_EQ(parse_cache_size("48K"), size_t{48} << 10);
  EXPECT_EQ(parse_cache_size("307200K"), size_t{307200} << 10);
  EXPECT_EQ(parse_cache_size("32M\n"), size_t{32} << 20);
  EXPECT_EQ(parse_cache_size("1G"), size_t{1} << 30);
  EXPECT_EQ(parse_cache_size("512"), size_t{512});
  EXPECT_EQ(parse_cache_size(""), size_t{0});
  EXPECT_EQ(parse_cache_size("K"), size_t{0});
  EXPECT_EQ(parse_cache_size("12Q"), size_t{0});
}

// The highest level among data and unified caches, whatever the order of the index directories;
// instruction caches and unreadable entries are skipped; no directory gives 0.
TEST(CacheSizeTest, LastLevelIsTheHighestDataOrUnifiedCache) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) / "duet_cache_sysfs";
  fs::remove_all(dir);
  const auto add = [&](const std::string& name, const std::string& level, const std::string& type,
                       const std::string& size) {
    fs::create_directories(dir / name);
    std::ofstream(dir / name / "level") << level << "\n";
    std::ofstream(dir / name / "type") << type << "\n";
    std::ofstream(dir / name / "size") << size << "\n";
  };
  add("index0", "1", "Data", "48K");
  add("index1", "1", "Instruction", "32K");
  add("index3", "3", "Unified", "307200K");
  add("index2", "2", "Unified", "2048K");
  add("index4", "4", "Instruction", "1G");  // not a data cache
  fs::create_directories(dir / "index5");   // no files: skipped
  fs::create_directories(dir / "power");    // not an index
  EXPECT_EQ(last_level_cache_bytes(dir.string()), size_t{307200} << 10);
  EXPECT_EQ(last_level_cache_bytes((dir / "missing").string()), size_t{0});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace duet
