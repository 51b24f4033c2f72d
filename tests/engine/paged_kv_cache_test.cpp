// The block pool and the paged KV store: allocation all-or-nothing, rows of different
// sequences never alias, blocks come back on removal, a bf16 pool holds twice the blocks in the
// same memory and rounds its rows to nearest even, and a forward pass over the paged store gives
// the same logits as over the contiguous KvCache (GQA and MLA latent blocks, f32 and bf16).
#include "engine/paged_kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "core/error.h"
#include "engine/kv_cache.h"
#include "engine/model_runner.h"
#include "engine/tiny_models.h"
#include "model/model.h"

namespace duet {
namespace {

TEST(BlockPoolTest, HandsOutEveryBlockOnceAndTakesThemBack) {
  BlockPool pool({2, 3, 5, 4}, 3);
  EXPECT_EQ(BlockPool::bytes_per_block({2, 3, 5, 4}), 4u * 2 * 8 * 4);
  EXPECT_EQ(BlockPool::blocks_in({2, 3, 5, 4}, 1000), 3);
  std::set<int32_t> got;
  for (int i = 0; i < 3; ++i) got.insert(pool.alloc());
  EXPECT_EQ(got, (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.alloc(), -1);
  pool.free(1);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(pool.alloc(), 1);
  EXPECT_THROW(pool.free(7), Error);
  pool.free(0);
  EXPECT_THROW(pool.free(0), Error);  // double free
}

TEST(BlockPoolTest, Bf16HoldsTwiceTheBlocksInTheSameMemory) {
  BlockPoolShape f32{2, 3, 5, 4};
  BlockPoolShape bf16 = f32;
  bf16.dtype = DType::kBF16;
  EXPECT_EQ(BlockPool::bytes_per_block(bf16), 2u * 2 * 8 * 4);
  EXPECT_EQ(BlockPool::blocks_in(f32, 2560), 10);
  EXPECT_EQ(BlockPool::blocks_in(bf16, 2560), 20);
  // The rows of a bf16 pool sit 2-byte elements apart: block b's layer il, offset off.
  BlockPool pool(bf16, 2);
  EXPECT_EQ(static_cast<char*>(pool.k(1, 1, 2)) - static_cast<char*>(pool.k(0, 0, 0)),
            ((1 * 2 + 1) * 4 + 2) * 3 * 2);
  EXPECT_EQ(static_cast<char*>(pool.v(1, 0, 3)) - static_cast<char*>(pool.v(0, 0, 0)),
            ((1 * 2 + 0) * 4 + 3) * 5 * 2);
}

TEST(PagedKvCacheTest, Bf16RowsRoundToNearestEvenAcrossBlocks) {
  BlockPoolShape shape{2, 3, 2, 4, DType::kBF16};
  BlockPool pool(shape, 4);
  PagedKvCache kv(pool);
  EXPECT_EQ(kv.dtype(), DType::kBF16);
  const int32_t s = kv.add_sequence();
  ASSERT_TRUE(kv.reserve(s, 7));  // two blocks
  // k: a tie rounding down to even, a tie rounding up to even, a value above a tie; v: their
  // negations' first two. Each position's values are scaled by 2^pos (exact).
  const float k_row[3] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f};
  const uint16_t k_bits[3] = {0x3F80, 0x3F82, 0x3F81};
  for (int64_t il = 0; il < 2; ++il) {
    for (int64_t pos = 0; pos < 7; ++pos) {
      float k[3], v[2];
      for (int i = 0; i < 3; ++i) k[i] = std::ldexp(k_row[i], static_cast<int>(pos));
      for (int i = 0; i < 2; ++i) v[i] = -k[i];
      kv.store_k(s, il, pos, k, 3);
      kv.store_v(s, il, pos, v, 2);
    }
  }
  for (int64_t il = 0; il < 2; ++il) {
    for (int64_t pos = 0; pos < 7;) {
      const KvRows r = kv.rows(s, il, pos, 7 - pos);
      EXPECT_EQ(r.n, std::min<int64_t>(4 - pos % 4, 7 - pos));  // a run ends with its block
      EXPECT_EQ(r.k_stride, 3);
      EXPECT_EQ(r.v_stride, 2);
      for (int64_t i = 0; i < r.n; ++i, ++pos) {
        const uint16_t* k = static_cast<const uint16_t*>(r.k) + i * r.k_stride;
        const uint16_t* v = static_cast<const uint16_t*>(r.v) + i * r.v_stride;
        EXPECT_EQ(k, kv.k(s, il, pos));
        for (int d = 0; d < 3; ++d) {
          // Scaling by 2^pos adds pos to the exponent field (bit 7 of the bf16 pattern).
          EXPECT_EQ(k[d], k_bits[d] + (pos << 7)) << il << " " << pos << " " << d;
        }
        for (int d = 0; d < 2; ++d) EXPECT_EQ(v[d], 0x8000 | (k_bits[d] + (pos << 7)));
      }
    }
  }
}

// The overlapped scheduler's view of one step: the same rows as the cache, through tables that do
// not change while the cache reserves, frees and adds sequences for the next step.
TEST(PagedKvCacheTest, SnapshotKeepsTheStepsTablesWhileTheCacheMovesOn) {
  BlockPool pool({2, 3, 0, 4}, 16);
  PagedKvCache kv(pool);
  const int32_t a = kv.add_sequence(), b = kv.add_sequence();
  ASSERT_TRUE(kv.reserve(a, 6));
  ASSERT_TRUE(kv.reserve(b, 3));
  ForwardInput in;
  const int32_t tok[2] = {1, 2};
  in.add(a, 4, tok, 2, false);
  PagedKvView view = kv.snapshot(in);
  void* row = kv.k(a, 1, 5);
  // The cache moves on: a grows (its table reallocates), b goes, new sequences come.
  ASSERT_TRUE(kv.reserve(a, 30));
  kv.remove_sequence(b);
  for (int i = 0; i < 5; ++i) kv.add_sequence();
  EXPECT_EQ(view.k(a, 1, 5), row);
  const KvRows r = view.rows(a, 1, 4, 8);
  EXPECT_EQ(r.k, kv.k(a, 1, 4));
  EXPECT_EQ(r.n, 4) << "a run ends at its block's end";
  EXPECT_EQ(view.dtype(), kv.dtype());
  EXPECT_THROW(view.k(b, 0, 0), Error) << "b is not in the step";
  EXPECT_THROW(view.k(a, 0, 8), Error) << "position 8 was not reserved when the step was taken";
}

TEST(PagedKvCacheTest, ReserveIsAllOrNothingAndRowsNeverAlias) {
  BlockPool pool({2, 3, 1, 4}, 5);  // 2 layers, k 3 floats, v 1 float, 4 positions per block
  PagedKvCache kv(pool);
  const int32_t a = kv.add_sequence();
  const int32_t b = kv.add_sequence();
  EXPECT_TRUE(kv.reserve(a, 9));  // 3 blocks
  EXPECT_EQ(kv.capacity(a), 12);
  EXPECT_EQ(kv.max_reservable(b), 8);
  EXPECT_FALSE(kv.reserve(b, 9));  // needs 3, 2 free: nothing taken
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_TRUE(kv.reserve(b, 8));
  EXPECT_EQ(pool.n_free(), 0);
  // Every (seq, layer, pos) row is its own memory.
  std::set<const void*> rows;
  for (int32_t s : {a, b})
    for (int64_t il = 0; il < 2; ++il)
      for (int64_t pos = 0; pos < 8; ++pos) {
        EXPECT_TRUE(rows.insert(kv.k(s, il, pos)).second);
        EXPECT_TRUE(rows.insert(kv.v(s, il, pos)).second);
      }
  EXPECT_THROW(kv.k(b, 0, 8), Error);  // not reserved
  kv.remove_sequence(a);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_EQ(kv.add_sequence(), a);  // ids are reused
}

class PagedForwardTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// The same chunked prefill + decodes over the paged store (block size 3, so sequences straddle
// blocks, interleaved allocation) and over the contiguous cache give identical logits.
TEST_P(PagedForwardTest, MatchesContiguousCache) {
  const auto& [arch, dtype] = GetParam();
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir(arch));
  ThreadPool threads(2);
  ModelRunner runner(*model, threads);
  const int64_t n_layer = model->config().n_layer;
  KvCache flat(n_layer, model->kv_k_width(), model->kv_v_width(), dtype);
  BlockPool pool({n_layer, model->kv_k_width(), model->kv_v_width(), 3, dtype}, 32);
  PagedKvCache paged(pool);
  const int32_t f0 = flat.add_sequence(), f1 = flat.add_sequence();
  const int32_t p0 = paged.add_sequence(), p1 = paged.add_sequence();
  const std::vector<int32_t> t0 = {5, 9, 11, 3, 200, 17, 42, 8}, t1 = {301, 4, 4, 77, 150};
  // Three steps: prefill chunks, then more chunks, then decodes.
  const std::vector<std::pair<int64_t, int64_t>> c0 = {{0, 4}, {4, 3}, {7, 1}}, c1 = {{0, 2}, {2, 2}, {4, 1}};
  for (size_t step = 0; step < c0.size(); ++step) {
    ForwardInput fin, pin;
    fin.add(f0, c0[step].first, t0.data() + c0[step].first, c0[step].second, true);
    fin.add(f1, c1[step].first, t1.data() + c1[step].first, c1[step].second, true);
    pin.add(p0, c0[step].first, t0.data() + c0[step].first, c0[step].second, true);
    pin.add(p1, c1[step].first, t1.data() + c1[step].first, c1[step].second, true);
    flat.reserve(f0, c0[step].first + c0[step].second);
    flat.reserve(f1, c1[step].first + c1[step].second);
    ASSERT_TRUE(paged.reserve(p0, c0[step].first + c0[step].second));
    ASSERT_TRUE(paged.reserve(p1, c1[step].first + c1[step].second));
    const std::vector<float> want = runner.forward(fin, flat);
    const std::vector<float>& got = runner.forward(pin, paged);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "step " << step << " i " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, PagedForwardTest,
                         ::testing::Combine(::testing::Values("qwen3_moe", "deepseek_v2",
                                                              "mixtral"),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == DType::kBF16 ? "_bf16" : "_f32");
                         });

}  // namespace
}  // namespace duet
