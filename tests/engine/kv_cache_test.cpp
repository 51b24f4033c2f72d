// The contiguous KV cache in both element types: f32 rows are stored as given, bf16 rows rounded
// to nearest even and handed back at the same places through k / v and rows(), also after the
// buffer grows; and the --kv-cache-dtype choice (parse, auto).
#include "engine/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "engine/kv_dtype.h"
#include "engine/tiny_models.h"

namespace duet {
namespace {

// Values whose bf16 rounding is decided by the rule: ties go to the even neighbour (down from
// 1 + 2^-8, up from 1 + 3 · 2^-8), just above a tie goes up, negatives round by magnitude, and
// values already bf16 stay.
const std::vector<float> kRows = {
    1.0f + 0x1p-8f,                // tie; 1.0 is even: 0x3F80
    1.0f + 3 * 0x1p-8f,            // tie; 1 + 2^-6 is even: 0x3F82
    1.0f + 0x1p-8f + 0x1p-20f,     // above the tie: 0x3F81
    -(1.0f + 0x1p-8f + 0x1p-20f),  // 0xBF81
    3.0f,                          // exact: 0x4040
    -0.0f,                         // 0x8000
    65504.0f,                      // 0x477FE0 rounds up to 0x4780 (65536)
};
const std::vector<uint16_t> kRowsBf16 = {0x3F80, 0x3F82, 0x3F81, 0xBF81, 0x4040, 0x8000, 0x4780};

uint16_t bits_at(const void* row, size_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(row) + 2 * i, 2);
  return h;
}

TEST(KvCacheTest, Bf16RowsRoundToNearestEvenAndSurviveGrowth) {
  const int64_t width = static_cast<int64_t>(kRows.size());
  KvCache kv(2, width, width, DType::kBF16);
  EXPECT_EQ(kv.dtype(), DType::kBF16);
  const int32_t s = kv.add_sequence();
  kv.reserve(s, 3);
  // Row (il, pos) holds kRows scaled by a power of two (exact, so the expected bits only move
  // in the exponent) and the v row its negation.
  auto scaled = [&](int64_t il, int64_t pos, float sign) {
    std::vector<float> r = kRows;
    for (float& x : r) x = sign * std::ldexp(x, static_cast<int>(il * 3 + pos) - 4);
    return r;
  };
  for (int64_t il = 0; il < 2; ++il) {
    for (int64_t pos = 0; pos < 3; ++pos) {
      kv.store_k(s, il, pos, scaled(il, pos, 1).data(), width);
      kv.store_v(s, il, pos, scaled(il, pos, -1).data(), width);
    }
  }
  kv.reserve(s, 40);  // moves the rows
  for (int64_t il = 0; il < 2; ++il) {
    const KvRows r = kv.rows(s, il, 0, 3);
    ASSERT_EQ(r.n, 3);
    EXPECT_EQ(r.k_stride, width);  // elements, not bytes
    EXPECT_EQ(r.v_stride, width);
    for (int64_t pos = 0; pos < 3; ++pos) {
      const void* k = kv.k(s, il, pos);
      const void* v = kv.v(s, il, pos);
      EXPECT_EQ(k, static_cast<const uint16_t*>(r.k) + pos * r.k_stride);
      EXPECT_EQ(v, static_cast<const uint16_t*>(r.v) + pos * r.v_stride);
      const std::vector<float> want_k = scaled(il, pos, 1), want_v = scaled(il, pos, -1);
      for (size_t i = 0; i < kRows.size(); ++i) {
        EXPECT_EQ(bits_at(k, i), f32_to_bf16(want_k[i])) << il << " " << pos << " " << i;
        EXPECT_EQ(bits_at(v, i), f32_to_bf16(want_v[i])) << il << " " << pos << " " << i;
      }
    }
  }
  // At scale 2^-4 · 2^4 = 1 (il 1, pos 1), the bits are the table's.
  for (size_t i = 0; i < kRows.size(); ++i) EXPECT_EQ(bits_at(kv.k(s, 1, 1), i), kRowsBf16[i]);
}

TEST(KvCacheTest, F32RowsAreStoredExactly) {
  KvCache kv(1, 7, 0);
  EXPECT_EQ(kv.dtype(), DType::kF32);
  const int32_t s = kv.add_sequence();
  kv.reserve(s, 1);
  kv.store_k(s, 0, 0, kRows.data(), 7);
  EXPECT_EQ(std::memcmp(kv.k(s, 0, 0), kRows.data(), 7 * sizeof(float)), 0);
  EXPECT_EQ(kv.rows(s, 0, 0, 1).v, nullptr);  // MLA: no v rows
}

TEST(KvCacheTest, SlicesAtAnOffsetLeaveTheRestOfTheRow) {
  // A KV head's slice (offset head · head_dim), in both dtypes: the other elements keep theirs.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    KvCache kv(1, 7, 7, dtype);
    const int32_t s = kv.add_sequence();
    kv.reserve(s, 1);
    kv.store_k(s, 0, 0, kRows.data(), 7);
    kv.store_v(s, 0, 0, kRows.data(), 7);
    const float slice[3] = {0.5f, -2.0f, 3.0f};
    kv.store_k(s, 0, 0, slice, 3, 2);
    kv.store_v(s, 0, 0, slice, 3, 4);
    for (int64_t i = 0; i < 7; ++i) {
      const float want_k = i >= 2 && i < 5 ? slice[i - 2] : kRows[i];
      const float want_v = i >= 4 ? slice[i - 4] : kRows[i];
      const auto at = [&](const void* row) {
        return dtype == DType::kF32 ? static_cast<const float*>(row)[i]
                                    : bf16_to_f32(bits_at(row, static_cast<size_t>(i)));
      };
      const auto rounded = [&](float x) {
        return dtype == DType::kF32 ? x : bf16_to_f32(f32_to_bf16(x));
      };
      EXPECT_EQ(at(kv.k(s, 0, 0)), rounded(want_k)) << dtype_name(dtype) << " k element " << i;
      EXPECT_EQ(at(kv.v(s, 0, 0)), rounded(want_v)) << dtype_name(dtype) << " v element " << i;
    }
  }
}

TEST(KvCacheTest, Bf16KeepsNanAndInfinity) {
  KvCache kv(1, 3, 0, DType::kBF16);
  const int32_t s = kv.add_sequence();
  kv.reserve(s, 1);
  const float row[3] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(), 0x1.fffffep127f};
  kv.store_k(s, 0, 0, row, 3);
  EXPECT_TRUE(std::isnan(bf16_to_f32(bits_at(kv.k(s, 0, 0), 0))));
  EXPECT_EQ(bits_at(kv.k(s, 0, 0), 1), 0x7F80);
  EXPECT_EQ(bits_at(kv.k(s, 0, 0), 2), 0x7F80);  // FLT_MAX rounds up to infinity, as torch does
}

TEST(KvDtypeTest, ParsesTheFlagAndAutoFollowsTheWeights) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::kAuto);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), KvCacheDtype::kBf16);
  EXPECT_EQ(parse_kv_cache_dtype("f32"), KvCacheDtype::kF32);
  for (const char* bad : {"bogus", "BF16", "fp16", ""}) {
    try {
      parse_kv_cache_dtype(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype must be auto, bf16 or f32"),
                std::string::npos)
          << e.what();
    }
  }
  std::unique_ptr<Model> f32 = Model::load(test::tiny_model_dir("qwen3_moe", DType::kF32));
  std::unique_ptr<Model> bf16 = Model::load(test::tiny_model_dir("qwen3_moe", DType::kBF16));
  EXPECT_EQ(resolve_kv_dtype(KvCacheDtype::kAuto, *f32), DType::kF32);
  EXPECT_EQ(resolve_kv_dtype(KvCacheDtype::kAuto, *bf16), DType::kBF16);
  EXPECT_EQ(resolve_kv_dtype(KvCacheDtype::kBf16, *f32), DType::kBF16);
  EXPECT_EQ(resolve_kv_dtype(KvCacheDtype::kF32, *bf16), DType::kF32);
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

// Writing a row past what was reserved, before position 0 or in a layer that does not exist is
// an invariant failure, not a write into someone else's memory.
TEST(KvCacheTest, RowsOutsideTheReservationAreRefused) {
  KvCache kv(2, 8, 8, DType::kF32);
  const int32_t seq = kv.add_sequence();
  kv.reserve(seq, 3);
  const int64_t cap = kv.capacity(seq);
  EXPECT_NE(kv.k(seq, 1, cap - 1), nullptr);
  EXPECT_THROW(kv.k(seq, 0, cap), Error);
  EXPECT_THROW(kv.v(seq, 0, cap), Error);
  EXPECT_THROW(kv.k(seq, 0, -1), Error);
  EXPECT_THROW(kv.v(seq, 2, 0), Error);
  EXPECT_THROW(kv.k(seq + 1, 0, 0), Error);
}

}  // namespace
}  // namespace duet
