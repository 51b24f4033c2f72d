// E4M3 codes and fp8 rows: every code's value against the format's definition, rounding to
// nearest even at every midpoint, saturation, and rows with per-group scales within the format's
// error, the AVX-512 versions equal to the scalar ones bit for bit.
#include "kernels/fp8_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace duet {
namespace {

// The value of E4M3 code c from the format's definition.
double defined_value(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (c & 0x80) ? -v : v;
}

TEST(Fp8RowsTest, EveryCodeHasItsValueAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(double(e4m3_to_f32(static_cast<uint8_t>(c))), defined_value(c)) << c;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(Fp8RowsTest, RoundsToNearestEvenAndSaturates) {
  for (int c = 0; c < 0x7e; ++c) {  // each pair of neighbours among the positive codes
    const float lo = e4m3_to_f32(static_cast<uint8_t>(c));
    const float hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact in f32
    EXPECT_EQ(f32_to_e4m3(mid), (c % 2 == 0) ? c : c + 1) << "midpoint after " << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), c) << "below the midpoint after " << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.0f)), c + 1) << "above the midpoint after " << c;
    EXPECT_EQ(f32_to_e4m3(-mid), 0x80 | ((c % 2 == 0) ? c : c + 1)) << "negative, after " << c;
  }
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(460.0f), 0x7e);  // past 448: saturated, never NaN
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(1e-30f), 0);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
}

// Mixed magnitudes, some groups all zero, some values tiny against their group's largest.
std::vector<float> random_row(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 10), pick(0, 9);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    x[i] = p == 0 ? 0.0f : p <= 2 ? std::ldexp(normal(rng), exponent(rng)) : normal(rng);
  }
  if (n > kFp8Group) std::fill(x.begin(), x.begin() + kFp8Group, 0.0f);  // a group of zeros
  return x;
}

TEST(Fp8RowsTest, RowsMatchTheScalarVersionAndStayWithinTheFormatsError) {
  std::mt19937 rng(17);
  for (int64_t n : {1, 15, 16, 17, 127, 128, 129, 300, 1024, 2050}) {
    const std::vector<float> x = random_row(rng, n);
    const int64_t g = fp8_groups(n);
    std::vector<float> scales(static_cast<size_t>(g)), want_scales(scales.size());
    std::vector<uint8_t> codes(static_cast<size_t>(n)), want_codes(codes.size());
    f32_to_fp8_row(x.data(), n, scales.data(), codes.data());
    fp8_impl::f32_to_fp8_row_scalar(x.data(), n, want_scales.data(), want_codes.data());
    const std::string what = "n " + std::to_string(n);
    EXPECT_EQ(scales, want_scales) << what;
    EXPECT_EQ(codes, want_codes) << what;

    std::vector<float> y(static_cast<size_t>(n)), want_y(y.size());
    fp8_to_f32_row(scales.data(), codes.data(), n, y.data());
    fp8_impl::fp8_to_f32_row_scalar(scales.data(), codes.data(), n, want_y.data());
    EXPECT_EQ(std::memcmp(y.data(), want_y.data(), y.size() * 4), 0) << what;
    for (int64_t i = 0; i < n; ++i) {
      const float scale = scales[i / kFp8Group];
      const double err = std::fabs(double(y[i]) - x[i]);
      EXPECT_LE(err, std::fabs(x[i]) * 0x1p-4 + scale * 0x1p-10 * 1.0001) << what << " i " << i;
    }
    if (n > kFp8Group) {
      EXPECT_EQ(scales[0], 0.0f) << what;
    }

    std::vector<float> acc = random_row(rng, n), want_acc = acc;
    axpy_fp8(0.37f, scales.data(), codes.data(), n, acc.data());
    fp8_impl::axpy_fp8_scalar(0.37f, scales.data(), codes.data(), n, want_acc.data());
    EXPECT_EQ(std::memcmp(acc.data(), want_acc.data(), acc.size() * 4), 0) << what;
  }
}

}  // namespace
}  // namespace duet
