// The block pool and the paged KV store: allocation all-or-nothing, rows of different
// sequences never alias, blocks come back on removal, and a forward pass over the paged store
// gives the same logits as over the contiguous KvCache (GQA and MLA latent blocks).
#include "engine/paged_kv_cache.h"

#include <gtest/gtest.h>

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
  std::set<const float*> rows;
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

class PagedForwardTest : public ::testing::TestWithParam<std::string> {};

// The same chunked prefill + decodes over the paged store (block size 3, so sequences straddle
// blocks, interleaved allocation) and over the contiguous cache give identical logits.
TEST_P(PagedForwardTest, MatchesContiguousCache) {
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir(GetParam()));
  ThreadPool threads(2);
  ModelRunner runner(*model, threads);
  const int64_t n_layer = model->config().n_layer;
  KvCache flat(n_layer, model->kv_k_width(), model->kv_v_width());
  BlockPool pool({n_layer, model->kv_k_width(), model->kv_v_width(), 3}, 32);
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
                         ::testing::Values("qwen3_moe", "deepseek_v2", "mixtral"));

}  // namespace
}  // namespace duet
