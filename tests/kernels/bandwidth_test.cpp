#include "kernels/bandwidth.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace duet
