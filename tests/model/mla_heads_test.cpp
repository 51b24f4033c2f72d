// MLA's per-head products in jobs of several heads: every split of the heads into jobs gives
// the bits of one job a head, and the products a plain loop gives.
#include "model/mla_heads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/matmul_fp8.h"
#include "kernels/matmul_impl.h"
#include "kernels/quantize.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = normal(rng);
  return v;
}

TEST(MlaHeadsTest, EveryJobSplitGivesOneJobAHeadsBitsAndThePlainProducts) {
  ThreadPool pool(3);
  std::mt19937 rng(77);
  const MlaHeads m{5, 12, 8, 6, 40};  // 5 heads, q rows of 8 nope + 4 rope, v 6, rank 40
  const int64_t kv_rows = m.nope + m.v_dim;
  const std::vector<float> kv_f32 = random_floats(rng, m.n_head * kv_rows * m.rank);
  std::vector<uint16_t> kv_bf16(kv_f32.size());
  std::vector<float> kv_widened(kv_f32.size());
  for (size_t i = 0; i < kv_f32.size(); ++i) {
    kv_bf16[i] = f32_to_bf16(kv_f32[i]);
    kv_widened[i] = bf16_to_f32(kv_bf16[i]);
  }
  for (bool bf16 : {false, true}) {
    const Matrix kv_b{bf16 ? DType::kBF16 : DType::kF32, m.n_head * kv_rows, m.rank,
                      bf16 ? static_cast<const void*>(kv_bf16.data()) : kv_f32.data()};
    const std::vector<float>& w = bf16 ? kv_widened : kv_f32;  // the values multiplied
    // W_UV's products (matmul_grouped) with bf16 weights round o_lat to bf16 where the kernels
    // multiply bf16 pairs (AVX-512 BF16 on Zen 4): the plain products take the same o_lat. (q ·
    // W_UK, matmul_xw, never rounds q.)
    const bool rounds =
        bf16 && matmul_impl::rounds_x(matmul_impl::isa_for(DType::kBF16), DType::kBF16);
    for (int64_t n : {1, 3}) {
      const std::vector<float> q = random_floats(rng, n * m.n_head * m.qk_dim);
      const std::vector<float> o_lat = random_floats(rng, m.n_head * n * m.rank);
      std::vector<float> o_lat_multiplied = o_lat;
      if (rounds) {
        for (float& f : o_lat_multiplied) f = bf16_to_f32(f32_to_bf16(f));
      }
      // The plain products, in double.
      std::vector<double> want_q(static_cast<size_t>(m.n_head * n * m.rank));
      std::vector<double> want_o(static_cast<size_t>(n * m.n_head * m.v_dim));
      for (int64_t h = 0; h < m.n_head; ++h) {
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t c = 0; c < m.rank; ++c) {
            double sum = 0;
            for (int64_t r = 0; r < m.nope; ++r)
              sum +=
                  double(q[(t * m.n_head + h) * m.qk_dim + r]) * w[(h * kv_rows + r) * m.rank + c];
            want_q[(h * n + t) * m.rank + c] = sum;
          }
          for (int64_t r = 0; r < m.v_dim; ++r) {
            double sum = 0;
            for (int64_t c = 0; c < m.rank; ++c)
              sum += double(w[(h * kv_rows + m.nope + r) * m.rank + c]) *
                     o_lat_multiplied[(h * n + t) * m.rank + c];
            want_o[(t * m.n_head + h) * m.v_dim + r] = sum;
          }
        }
      }
      std::vector<float> first_q, first_o, buf;
      for (int64_t job_heads : {1, 2, 5, 9}) {
        std::vector<float> got_q(want_q.size(), std::nanf("")), got_o(want_o.size(), std::nanf(""));
        mla_absorb_queries(pool, {.kv_b = kv_b}, m, q.data(), n, job_heads, got_q.data(), buf);
        mla_head_outputs(pool, {.kv_b = kv_b}, m, o_lat.data(), n, job_heads, got_o.data(), buf);
        for (size_t i = 0; i < want_q.size(); ++i)
          ASSERT_NEAR(got_q[i], want_q[i], 1e-4) << "q_lat " << i << " job_heads " << job_heads;
        for (size_t i = 0; i < want_o.size(); ++i)
          ASSERT_NEAR(got_o[i], want_o[i], 1e-4) << "out " << i << " job_heads " << job_heads;
        if (first_q.empty()) {
          first_q = got_q, first_o = got_o;
          continue;
        }
        EXPECT_EQ(0, std::memcmp(got_q.data(), first_q.data(), got_q.size() * sizeof(float)))
            << "job_heads " << job_heads << " bf16 " << bf16 << " n " << n;
        EXPECT_EQ(0, std::memcmp(got_o.data(), first_o.data(), got_o.size() * sizeof(float)))
            << "job_heads " << job_heads << " bf16 " << bf16 << " n " << n;
      }
    }
  }
}

// Split by head (as quantized weights are held): k_b's rows are W_UK's columns and v_b's W_UV's
// rows, so with f32 parts the products are the stored kv_b's up to the order of additions; with
// int8 parts, the products of the dequantized parts up to the rounding of the inputs to 8 bits.
TEST(MlaHeadsTest, SplitKvBGivesTheStoredProducts) {
  ThreadPool pool(2);
  std::mt19937 rng(78);
  const MlaHeads m{3, 20, 16, 8, 64};  // 3 heads, q rows of 16 nope + 4 rope, v 8, rank 64
  const int64_t kv_rows = m.nope + m.v_dim;
  const std::vector<float> w = random_floats(rng, m.n_head * kv_rows * m.rank);
  const Matrix kv_b{DType::kF32, m.n_head * kv_rows, m.rank, w.data()};
  std::vector<float> k_b, v_b;
  mla_split_kv_b(kv_b, m, k_b, v_b);
  ASSERT_EQ(k_b.size(), static_cast<size_t>(m.n_head * m.rank * m.nope));
  ASSERT_EQ(v_b.size(), static_cast<size_t>(m.n_head * m.v_dim * m.rank));
  for (int64_t h = 0; h < m.n_head; ++h) {
    for (int64_t l = 0; l < m.rank; ++l) {
      for (int64_t r = 0; r < m.nope; ++r)
        ASSERT_EQ(k_b[(h * m.rank + l) * m.nope + r], w[(h * kv_rows + r) * m.rank + l]);
      for (int64_t r = 0; r < m.v_dim; ++r)
        ASSERT_EQ(v_b[(h * m.v_dim + r) * m.rank + l], w[(h * kv_rows + m.nope + r) * m.rank + l]);
    }
  }
  const Matrix k_f32{DType::kF32, m.n_head * m.rank, m.nope, k_b.data()};
  const Matrix v_f32{DType::kF32, m.n_head * m.v_dim, m.rank, v_b.data()};
  const Q8Matrix k_q8(k_f32), v_q8(v_f32);
  const std::vector<float> k_deq = dequantize_int(k_q8.view()), v_deq = dequantize_int(v_q8.view());
  const int64_t n = 2;
  const std::vector<float> q = random_floats(rng, n * m.n_head * m.qk_dim);
  const std::vector<float> o_lat = random_floats(rng, m.n_head * n * m.rank);
  std::vector<float> buf, stored_q(static_cast<size_t>(m.n_head * n * m.rank)),
      stored_o(static_cast<size_t>(n * m.n_head * m.v_dim));
  mla_absorb_queries(pool, {.kv_b = kv_b}, m, q.data(), n, 2, stored_q.data(), buf);
  mla_head_outputs(pool, {.kv_b = kv_b}, m, o_lat.data(), n, 2, stored_o.data(), buf);
  for (bool quantized : {false, true}) {
    const MlaKvB split = quantized ? MlaKvB{.k_b = k_q8.view(), .v_b = v_q8.view()}
                                   : MlaKvB{.k_b = k_f32, .v_b = v_f32};
    ASSERT_TRUE(split.split());
    std::vector<float> got_q(stored_q.size(), std::nanf("")), got_o(stored_o.size(), std::nanf(""));
    mla_absorb_queries(pool, split, m, q.data(), n, 2, got_q.data(), buf);
    mla_head_outputs(pool, split, m, o_lat.data(), n, 2, got_o.data(), buf);
    if (!quantized) {
      for (size_t i = 0; i < got_q.size(); ++i) ASSERT_NEAR(got_q[i], stored_q[i], 1e-4) << i;
      for (size_t i = 0; i < got_o.size(); ++i) ASSERT_NEAR(got_o[i], stored_o[i], 1e-4) << i;
      continue;
    }
    // Against the dequantized parts in double, within what rounding the inputs to 8 bits per
    // group of 32 can move a product: half a step (the group's largest |x| / 127) per input,
    // times |w|.
    const auto half_step = [](const float* x, int64_t i) {
      const int64_t g0 = i / 32 * 32;
      float big = 0;
      for (int64_t j = g0; j < g0 + 32; ++j) big = std::max(big, std::fabs(x[j]));
      return big / 127.0 / 2.0;
    };
    for (int64_t h = 0; h < m.n_head; ++h) {
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> q_nope(32, 0.0f);  // the head's nope part, zero-padded to a group
        std::copy_n(q.data() + (t * m.n_head + h) * m.qk_dim, m.nope, q_nope.begin());
        const float* o = o_lat.data() + (h * n + t) * m.rank;
        for (int64_t l = 0; l < m.rank; ++l) {
          double sum = 0, bound = 1e-4;
          for (int64_t r = 0; r < m.nope; ++r) {
            const double wv = k_deq[(h * m.rank + l) * m.nope + r];
            sum += q_nope[r] * wv;
            bound += std::fabs(wv) * half_step(q_nope.data(), r);
          }
          ASSERT_NEAR(got_q[(h * n + t) * m.rank + l], sum, bound) << h << " " << t << " " << l;
        }
        for (int64_t r = 0; r < m.v_dim; ++r) {
          double sum = 0, bound = 1e-4;
          for (int64_t l = 0; l < m.rank; ++l) {
            const double wv = v_deq[(h * m.v_dim + r) * m.rank + l];
            sum += wv * o[l];
            bound += std::fabs(wv) * half_step(o, l);
          }
          ASSERT_NEAR(got_o[(t * m.n_head + h) * m.v_dim + r], sum, bound) << h << " " << t;
        }
      }
    }
  }
}

// An fp8 kv_b split by head keeps every weight, its code and its block's scale: k_b (h·rank + l,
// r) = kv_b (h·(nope + v) + r, l) and v_b (h·v + r, l) = kv_b (h·(nope + v) + nope + r, l), for
// DeepSeek-V3's heads (128 + 128 rows, rank 512), duet's `small` (64 + 64, 256) and `tiny` (16 +
// 16, 32) under 128 × 128 blocks, and rank 96 under 64 × 128 blocks; the products are the stored
// kv_b's up to the order of additions and the rounding of their inputs to bf16 where the fp8
// kernels round them. Refused where no block of 16 columns keeps a head's parts apart, and for
// a kv_b that is not fp8.
TEST(MlaHeadsTest, SplitFp8KvBKeepsEveryWeight) {
  struct Case {
    MlaHeads m;
    int64_t block_rows, block_cols;
    int64_t k_block_rows, g;  // k_b's blocks [k_block_rows, g], v_b's [g, block_cols]
  };
  ThreadPool pool(2);
  std::mt19937 rng(91);
  for (const Case& c :
       {Case{{2, 192, 128, 128, 512}, 128, 128, 128, 128},
        Case{{3, 96, 64, 64, 256}, 128, 128, 128, 64}, Case{{4, 24, 16, 16, 32}, 128, 128, 32, 16},
        Case{{2, 96, 64, 64, 96}, 64, 128, 32, 64}}) {
    const MlaHeads& m = c.m;
    const int64_t kv_rows = m.nope + m.v_dim, rows = m.n_head * kv_rows;
    std::vector<uint8_t> codes(static_cast<size_t>(rows * m.rank));
    for (uint8_t& b : codes) {
      b = static_cast<uint8_t>(rng());
      if ((b & 0x7f) == 0x7f) b ^= 0x01;  // no NaN
    }
    const int64_t n_cb = (m.rank + c.block_cols - 1) / c.block_cols;
    std::vector<float> scales(static_cast<size_t>((rows + c.block_rows - 1) / c.block_rows * n_cb));
    for (float& f : scales) f = std::ldexp(1.0f + float(rng() % 256) / 256, int(rng() % 9) - 14);
    Matrix kv_b{DType::kF8E4M3, rows, m.rank, codes.data()};
    kv_b.f8 = {scales.data(), c.block_rows, c.block_cols, 0};
    Fp8Part k, v;
    ASSERT_TRUE(mla_split_kv_b_fp8(kv_b, m, k, v)) << m.nope;
    EXPECT_EQ(k.block_rows, c.k_block_rows);
    EXPECT_EQ(k.block_cols, c.g);
    EXPECT_EQ(v.block_rows, c.g);
    EXPECT_EQ(v.block_cols, c.block_cols);
    const Matrix k_b = k.view(), v_b = v.view();
    ASSERT_EQ(k_b.rows, m.n_head * m.rank);
    ASSERT_EQ(k_b.cols, m.nope);
    ASSERT_EQ(v_b.rows, m.n_head * m.v_dim);
    ASSERT_EQ(v_b.cols, m.rank);
    for (int64_t h = 0; h < m.n_head; ++h) {
      for (int64_t l = 0; l < m.rank; ++l) {
        for (int64_t r = 0; r < m.nope; ++r)
          ASSERT_EQ(fp8_weight(k_b, h * m.rank + l, r), fp8_weight(kv_b, h * kv_rows + r, l))
              << m.nope << ": head " << h << " " << l << " " << r;
        for (int64_t r = 0; r < m.v_dim; ++r)
          ASSERT_EQ(fp8_weight(v_b, h * m.v_dim + r, l),
                    fp8_weight(kv_b, h * kv_rows + m.nope + r, l))
              << m.nope << ": head " << h << " " << l << " " << r;
      }
    }
    // The products, against the stored kv_b's: each output within 2^-8 of Σ |w · x| (bf16
    // rounding of x moves a term by at most 2^-9 of itself).
    const int64_t n = 2;
    const std::vector<float> q = random_floats(rng, n * m.n_head * m.qk_dim);
    const std::vector<float> o_lat = random_floats(rng, m.n_head * n * m.rank);
    std::vector<float> buf, want_q(static_cast<size_t>(m.n_head * n * m.rank)),
        want_o(static_cast<size_t>(n * m.n_head * m.v_dim)), got_q(want_q.size()),
        got_o(want_o.size());
    mla_absorb_queries(pool, {.kv_b = kv_b}, m, q.data(), n, 2, want_q.data(), buf);
    mla_head_outputs(pool, {.kv_b = kv_b}, m, o_lat.data(), n, 2, want_o.data(), buf);
    mla_absorb_queries(pool, {.k_b = k_b, .v_b = v_b}, m, q.data(), n, 2, got_q.data(), buf);
    mla_head_outputs(pool, {.k_b = k_b, .v_b = v_b}, m, o_lat.data(), n, 2, got_o.data(), buf);
    for (int64_t h = 0; h < m.n_head; ++h) {
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t l = 0; l < m.rank; ++l) {
          double size = 1e-6;
          for (int64_t r = 0; r < m.nope; ++r)
            size += std::fabs(q[(t * m.n_head + h) * m.qk_dim + r] *
                              fp8_weight(kv_b, h * kv_rows + r, l));
          const int64_t i = (h * n + t) * m.rank + l;
          ASSERT_NEAR(got_q[i], want_q[i], size / 256) << m.nope << ": " << h << " " << t;
        }
        for (int64_t r = 0; r < m.v_dim; ++r) {
          double size = 1e-6;
          for (int64_t l = 0; l < m.rank; ++l)
            size += std::fabs(o_lat[(h * n + t) * m.rank + l] *
                              fp8_weight(kv_b, h * kv_rows + m.nope + r, l));
          const int64_t i = (t * m.n_head + h) * m.v_dim + r;
          ASSERT_NEAR(got_o[i], want_o[i], size / 256) << m.nope << ": " << h << " " << t;
        }
      }
    }
  }
  // g = gcd(128, 24, 40) = 8: a block of k_b's 16 columns would hold two heads' weights.
  const MlaHeads narrow{2, 40, 24, 40, 64};
  std::vector<uint8_t> codes(static_cast<size_t>(2 * 64 * 64));
  std::vector<float> scales(1, 1.0f);
  Matrix kv_b{DType::kF8E4M3, 2 * 64, 64, codes.data()};
  kv_b.f8 = {scales.data(), 128, 128, 0};
  Fp8Part k, v;
  EXPECT_FALSE(mla_split_kv_b_fp8(kv_b, narrow, k, v));
  EXPECT_TRUE(k.codes.empty() && v.codes.empty());
  std::vector<float> w(static_cast<size_t>(3 * 128 * 256));
  const Matrix f32{DType::kF32, 3 * 128, 256, w.data()};
  EXPECT_FALSE(mla_split_kv_b_fp8(f32, {3, 96, 64, 64, 256}, k, v));
}

// A token that sees more positions than a part holds attends in parts merged by their
// log-sum-exp: the same outputs as attending whole (up to the roundings of each part's
// probabilities on the bf16-pair kernel), the same bits on any number of threads, and a token
// within one part exactly the whole attention's bits. 20 heads: a block of 16 and one of 4.
TEST(MlaHeadsTest, LongContextsAreAttendedInPartsAndMerged) {
  std::mt19937 rng(79);
  const MlaHeads m{20, 16, 8, 6, 40};  // q rows of 8 nope + 8 rope, rank 40
  const int64_t width = m.rank + (m.qk_dim - m.nope);
  const std::vector<int64_t> n_ctx = {100, 37, 64, 20, 1};
  const int64_t n = static_cast<int64_t>(n_ctx.size()), max_ctx = 100;
  const std::vector<float> q = random_floats(rng, n * m.n_head * m.qk_dim);
  const std::vector<float> q_lat = random_floats(rng, m.n_head * n * m.rank);
  std::vector<float> rows = random_floats(rng, n * max_ctx * width);  // each token's own context
  std::vector<uint16_t> rows_bf16(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) rows_bf16[i] = f32_to_bf16(rows[i]);
  for (bool bf16 : {false, true}) {
    const auto spans_of = [&](int64_t t, std::vector<KvSpan>& spans) {
      spans.clear();
      for (int64_t j = 0; j < n_ctx[t]; j += 16) {
        const int64_t at = (t * max_ctx + j) * width;
        const void* k = bf16 ? static_cast<const void*>(rows_bf16.data() + at) : rows.data() + at;
        spans.push_back({k, k, width, width, std::min<int64_t>(16, n_ctx[t] - j),
                         bf16 ? DType::kBF16 : DType::kF32});
      }
    };
    const bool pairs = bf16 && simd::has_dpbf16(simd::bf16_isa());
    const float scale = 0.2f;
    std::vector<float> whole(static_cast<size_t>(m.n_head * n * m.rank)), partials;
    ThreadPool one(1), three(3);
    mla_attend(one, m, q_lat.data(), q.data(), n, n_ctx, scale, spans_of, whole.data(), partials,
               int64_t{1} << 30);
    std::vector<float> first;
    for (ThreadPool* pool : {&one, &three}) {
      std::vector<float> got(whole.size(), std::nanf(""));
      mla_attend(*pool, m, q_lat.data(), q.data(), n, n_ctx, scale, spans_of, got.data(), partials,
                 32);
      for (int64_t h = 0; h < m.n_head; ++h) {
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t d = 0; d < m.rank; ++d) {
            const size_t i = static_cast<size_t>((h * n + t) * m.rank + d);
            if (n_ctx[t] <= 32) {
              ASSERT_EQ(got[i], whole[i]) << "bf16 " << bf16 << " head " << h << " token " << t;
            } else {
              ASSERT_NEAR(got[i], whole[i], pairs ? 0.04 : 1e-5)
                  << "bf16 " << bf16 << " head " << h << " token " << t << " dim " << d;
            }
          }
        }
      }
      if (first.empty()) {
        first = got;
      } else {
        EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(float)));
      }
    }
  }
}

// Past 8 MB of parts (many tokens of long contexts: prefill) a task attends all the parts of its
// token and head block and merges them itself: the bits of the same tokens attended a few at a
// time (each part a task, merged after).
TEST(MlaHeadsTest, ManyPartedTokensMergeTheirOwnPartsWithTheSameBits) {
  std::mt19937 rng(80);
  const MlaHeads m{20, 16, 8, 6, 40};
  const int64_t width = m.rank + (m.qk_dim - m.nope), n = 100, ctx = 64, chunk = 2;
  // 100 tokens × 32 parts × 2 head blocks × 16 × 41 floats: 16.8 MB of parts.
  const std::vector<float> q = random_floats(rng, n * m.n_head * m.qk_dim);
  const std::vector<float> q_lat = random_floats(rng, m.n_head * n * m.rank);
  const std::vector<float> rows = random_floats(rng, n * ctx * width);
  const auto spans_for = [&](int64_t first) {
    return [&rows, width, first](int64_t t, std::vector<KvSpan>& spans) {
      const float* k = rows.data() + (first + t) * ctx * width;
      spans.assign({KvSpan{k, k, width, width, ctx, DType::kF32}});
    };
  };
  ThreadPool pool(2);
  std::vector<float> all(static_cast<size_t>(m.n_head * n * m.rank)), partials;
  mla_attend(pool, m, q_lat.data(), q.data(), n, std::vector<int64_t>(n, ctx), 0.2f, spans_for(0),
             all.data(), partials, chunk);
  for (int64_t t0 : {0, 57, 98}) {  // two tokens at a time: each part a task
    std::vector<float> q2, q_lat2, got(static_cast<size_t>(m.n_head * 2 * m.rank));
    q2.assign(q.begin() + t0 * m.n_head * m.qk_dim, q.begin() + (t0 + 2) * m.n_head * m.qk_dim);
    for (int64_t h = 0; h < m.n_head; ++h) {
      const float* src = q_lat.data() + (h * n + t0) * m.rank;
      q_lat2.insert(q_lat2.end(), src, src + 2 * m.rank);
    }
    mla_attend(pool, m, q_lat2.data(), q2.data(), 2, {ctx, ctx}, 0.2f, spans_for(t0), got.data(),
               partials, chunk);
    for (int64_t h = 0; h < m.n_head; ++h) {
      for (int64_t i = 0; i < 2; ++i) {
        EXPECT_EQ(0, std::memcmp(got.data() + (h * 2 + i) * m.rank,
                                 all.data() + (h * n + t0 + i) * m.rank, m.rank * sizeof(float)))
            << "head " << h << " token " << t0 + i;
      }
    }
  }
}

TEST(MlaHeadsTest, AFewTokensTakeEveryHeadInOneJobAndPrefillWhatFits) {
  const MlaHeads v3{128, 192, 128, 128, 512};  // DeepSeek-V3's shapes
  EXPECT_EQ(mla_heads_per_job(v3, 1), 128);
  EXPECT_EQ(mla_heads_per_job(v3, 64), 128);
  EXPECT_EQ(mla_heads_per_job(v3, 512), 16);  // 4 MiB of copies: 2^20 / (512 · 128) floats
  EXPECT_EQ(mla_heads_per_job(v3, 1 << 14), 1);
  EXPECT_EQ(mla_heads_per_job(v3, 0), 128);
}

TEST(MlaHeadsTest, RefusesAKvBOfAnotherShape) {
  ThreadPool pool(1);
  const MlaHeads m{2, 12, 8, 6, 40};
  std::vector<float> w(static_cast<size_t>(3 * 14 * 40)), q(24), out(80), buf;
  const Matrix kv_b{DType::kF32, 3 * 14, 40, w.data()};  // 3 heads' rows for 2 heads
  EXPECT_THROW(mla_absorb_queries(pool, {.kv_b = kv_b}, m, q.data(), 1, 1, out.data(), buf), Error);
  EXPECT_THROW(mla_head_outputs(pool, {.kv_b = kv_b}, m, q.data(), 1, 1, out.data(), buf), Error);
  std::vector<float> k(static_cast<size_t>(2 * 40 * 8)), v(static_cast<size_t>(2 * 6 * 40));
  const Matrix k_b{DType::kF32, 2 * 40, 8, k.data()}, v_b{DType::kF32, 2 * 6, 40, v.data()};
  const Matrix k_short{DType::kF32, 2 * 40, 6, k.data()}, v_long{DType::kF32, 3 * 6, 40, v.data()};
  for (const MlaKvB& bad :
       {MlaKvB{.k_b = k_short, .v_b = v_b}, MlaKvB{.k_b = k_b, .v_b = v_long}}) {
    EXPECT_THROW(mla_absorb_queries(pool, bad, m, q.data(), 1, 1, out.data(), buf), Error);
    EXPECT_THROW(mla_head_outputs(pool, bad, m, q.data(), 1, 1, out.data(), buf), Error);
  }
  std::vector<float> k_got, v_got;
  EXPECT_THROW(mla_split_kv_b(kv_b, m, k_got, v_got), Error);
}

}  // namespace
}  // namespace duet
