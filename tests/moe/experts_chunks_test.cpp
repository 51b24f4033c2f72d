// run_experts with a chunked combine: the experts run chunk by chunk, and chunk_done(c) comes, in
// order, exactly when every output row of chunk c is final and before any row of a later chunk
// is written; with a chunked dispatch, no input row of chunk c is read before chunk_ready(c);
// the results equal the unchunked run's.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "moe/experts.h"

namespace duet {
namespace {

struct ExpertSet {
  std::vector<std::vector<float>> data;  // per expert: gate, up, down
  std::vector<MlpWeights> experts;
};

ExpertSet make_experts(int64_t n, int64_t D, int64_t F) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  ExpertSet s;
  s.data.resize(static_cast<size_t>(3 * n));
  for (auto& d : s.data) {
    d.resize(static_cast<size_t>(D * F));
    for (float& v : d) v = u(rng);
  }
  for (int64_t e = 0; e < n; ++e) {
    MlpWeights w;
    w.gate = Matrix{DType::kF32, F, D, s.data[3 * e].data()};
    w.up = Matrix{DType::kF32, F, D, s.data[3 * e + 1].data()};
    w.down = Matrix{DType::kF32, D, F, s.data[3 * e + 2].data()};
    s.experts.push_back(w);
  }
  return s;
}

// n rows of D values in [-1, 1), from `seed`.
std::vector<float> random_rows(int64_t n, int64_t D, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(static_cast<size_t>(n * D));
  for (float& v : x) v = u(rng);
  return x;
}

// A batch over `offsets` whose row r reads x's row r and writes out's row r (each its own
// output row, listed to clear; out is filled with a stale 123 first), row r weighing w0 + 0.1 r.
ExpertBatch stale_batch(int64_t L, int64_t D, const std::vector<int64_t>& offsets,
                        const std::vector<float>& x, std::vector<float>& out, float w0) {
  const int64_t n = offsets.back();
  ExpertBatch b;
  b.n_local_expert = L;
  b.n_embd = D;
  b.offsets = offsets;
  b.resize_rows();
  out.assign(static_cast<size_t>(n * D), 123.0f);
  for (int64_t r = 0; r < n; ++r) {
    b.x[r] = x.data() + r * D;
    b.out[r] = out.data() + r * D;
    b.clear.push_back(out.data() + r * D);
    b.weight[r] = w0 + 0.1f * r;
  }
  return b;
}

TEST(RunExpertsChunks, EachChunkIsFinalWhenAnnouncedAndResultsMatch) {
  const int64_t L = 5, D = 8, F = 16;
  const ExpertSet es = make_experts(L, D, F);
  // Rows per expert: 2, 0, 3, 1, 0 (experts 1 and 4 have none); each row its own output row.
  const std::vector<int64_t> offsets = {0, 2, 2, 5, 6, 6};
  const std::vector<float> x = random_rows(6, D, 3);
  auto make_batch = [&](std::vector<float>& out) {
    return stale_batch(L, D, offsets, x, out, 0.5f);
  };
  ThreadPool pool(2);
  MlpScratch scratch;
  std::vector<float> want;
  ExpertBatch plain = make_batch(want);
  run_experts(pool, es.experts, plain, scratch);

  for (const std::vector<int64_t>& ends :
       {std::vector<int64_t>{2, 5}, std::vector<int64_t>{1, 2, 3, 4, 5}, std::vector<int64_t>{5}}) {
    std::vector<float> got;
    ExpertBatch b = make_batch(got);
    b.chunk_ends = ends;
    std::vector<int> seen;
    b.chunk_done = [&](int c) {
      seen.push_back(c);
      const int64_t r1 = offsets[ends[c]];
      for (int64_t i = 0; i < r1 * D; ++i) ASSERT_FLOAT_EQ(got[i], want[i]) << "chunk " << c;
      for (int64_t i = r1 * D; i < 6 * D; ++i) ASSERT_EQ(got[i], 123.0f) << "chunk " << c;
    };
    run_experts(pool, es.experts, b, scratch);
    ASSERT_EQ(seen.size(), ends.size());
    for (size_t c = 0; c < seen.size(); ++c) EXPECT_EQ(seen[c], static_cast<int>(c));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]);
  }
}

// With an order, chunk c is the experts at positions [chunk_ends[c - 1], chunk_ends[c]) of it:
// when chunk_done(c) comes, the rows of exactly those experts and the earlier chunks' are final,
// every other row untouched; the results equal the run in index order.
TEST(RunExpertsChunks, ChunksFollowTheOrder) {
  const int64_t L = 5, D = 8, F = 16;
  const ExpertSet es = make_experts(L, D, F);
  const std::vector<int64_t> offsets = {0, 2, 2, 5, 6, 6};  // experts 1 and 4 have no rows
  const std::vector<float> x = random_rows(6, D, 11);
  auto make_batch = [&](std::vector<float>& out) {
    return stale_batch(L, D, offsets, x, out, 0.25f);
  };
  ThreadPool pool(2);
  MlpScratch scratch;
  std::vector<float> want;
  ExpertBatch plain = make_batch(want);
  run_experts(pool, es.experts, plain, scratch);
  const std::vector<int32_t> order = {3, 4, 0, 1, 2};
  const std::vector<int64_t> ends = {2, 4, 5};  // {3, 4}, {0, 1}, {2}
  std::vector<float> got;
  ExpertBatch b = make_batch(got);
  b.order = order;
  b.chunk_ends = ends;
  int calls = 0;
  b.chunk_done = [&](int c) {
    EXPECT_EQ(c, calls++);
    std::vector<bool> final_row(6, false);
    for (int64_t p = 0; p < ends[c]; ++p)
      for (int64_t r = offsets[order[p]]; r < offsets[order[p] + 1]; ++r) final_row[r] = true;
    for (int64_t r = 0; r < 6; ++r) {
      for (int64_t i = 0; i < D; ++i) {
        if (final_row[r]) {
          ASSERT_FLOAT_EQ(got[r * D + i], want[r * D + i]) << "chunk " << c << " row " << r;
        } else {
          ASSERT_EQ(got[r * D + i], 123.0f) << "chunk " << c << " row " << r;
        }
      }
    }
  };
  run_experts(pool, es.experts, b, scratch);
  EXPECT_EQ(calls, 3);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]);
}

// The inputs of chunk c arrive only at chunk_ready(c) (NaN before): the results are right only
// if the gate/up products of chunk c wait for it, and the calls alternate ready, done in order.
TEST(RunExpertsChunks, ChunkInputsAreReadOnlyAfterChunkReady) {
  const int64_t L = 6, D = 8, F = 16;
  const ExpertSet es = make_experts(L, D, F);
  const std::vector<int64_t> offsets = {0, 2, 2, 5, 6, 6, 9};  // experts 1 and 4 have no rows
  const int64_t n_rows = offsets.back();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(static_cast<size_t>(n_rows * D));
  for (float& v : x) v = u(rng);
  ThreadPool pool(2);
  MlpScratch scratch;
  auto run = [&](const std::vector<int64_t>& ends, std::vector<float>& live, std::string* order) {
    ExpertBatch b;
    b.n_local_expert = L;
    b.n_embd = D;
    b.offsets = offsets;
    b.resize_rows();
    std::vector<float> out(static_cast<size_t>(n_rows * D), 123.0f);
    for (int64_t r = 0; r < n_rows; ++r) {
      b.x[r] = live.data() + r * D;
      b.out[r] = out.data() + r * D;
      b.clear.push_back(out.data() + r * D);
      b.weight[r] = 1.0f - 0.05f * r;
    }
    if (!ends.empty()) {
      b.chunk_ends = ends;
      b.chunk_ready = [&](int c) {
        *order += "r" + std::to_string(c);
        const int64_t r0 = offsets[c == 0 ? 0 : ends[c - 1]], r1 = offsets[ends[c]];
        std::copy(x.begin() + r0 * D, x.begin() + r1 * D, live.begin() + r0 * D);
      };
      b.chunk_done = [&](int c) { *order += "d" + std::to_string(c); };
    }
    run_experts(pool, es.experts, b, scratch);
    return out;
  };
  std::string none;
  std::vector<float> all = x;
  const std::vector<float> want = run({}, all, &none);
  for (const std::vector<int64_t>& ends :
       {std::vector<int64_t>{3, 6}, std::vector<int64_t>{1, 2, 4, 6}, std::vector<int64_t>{6}}) {
    std::vector<float> live(x.size(), std::numeric_limits<float>::quiet_NaN());
    std::string order, expect;
    for (size_t c = 0; c < ends.size(); ++c)
      expect += "r" + std::to_string(c) + "d" + std::to_string(c);
    const std::vector<float> got = run(ends, live, &order);
    EXPECT_EQ(order, expect);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << "row " << i / D << " read before its chunk arrived";
      EXPECT_FLOAT_EQ(got[i], want[i]);
    }
  }
}

}  // namespace
}  // namespace duet
