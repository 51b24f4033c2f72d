// The element conversions of core/dtype.h that have no file format to check them: f32 -> f16
// (the group scales of int8 and int4 weights) against F16C's vcvtps2ph.
#include "core/dtype.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <random>

namespace duet {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

__attribute__((target("f16c"))) uint16_t f16c_round(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

TEST(DtypeTest, F16RoundTripsEveryF16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN payloads
    EXPECT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(DtypeTest, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie: to 1 (even)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: up to even
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);             // half the least subnormal: 0
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);           // above half: the least
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);         // 1.5 units: to 2 (even)
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-30f), 0x0400);  // rounds up to the least normal
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);             // the largest
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);             // below half-way to 2^16
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);             // half-way: infinity
  EXPECT_EQ(f32_to_f16(-1e-30f), 0x8000);              // signed zero
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

// Random bit patterns over the whole f32 range, and values near f16's boundaries, give
// vcvtps2ph's bits (round to nearest even).
TEST(DtypeTest, F16IsF16CsRounding) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C";
  std::mt19937 rng(4);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> near(0x32800000u, 0x47ffffffu);  // 2^-26 .. 2^16
  for (int i = 0; i < 2000000; ++i) {
    const float f = from_bits(i % 2 ? any(rng) : near(rng));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), f16c_round(f)) << std::hexfloat << f;
  }
}

}  // namespace
}  // namespace duet
