// attention_gqa splits its work (query blocks × KV heads) over the pool from a few hundred KV
// rows on: every split gives the same bits as one thread, and the softmax-weighted sums a plain
// double loop gives. Its prepare step writes each block's new rows once, before they are read.
#include "model/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"

namespace duet {
namespace {

// f32 rows of each sequence's positions, one layer: [n_seq][n_pos, width] for k and v.
class TestKv final : public KvStore {
 public:
  TestKv(int n_seq, int64_t n_pos, int64_t width, std::mt19937& rng) : width_(width) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int s = 0; s < n_seq; ++s) {
      k_.emplace_back(static_cast<size_t>(n_pos * width));
      v_.emplace_back(static_cast<size_t>(n_pos * width));
      for (float& f : k_.back()) f = normal(rng);
      for (float& f : v_.back()) f = normal(rng);
    }
  }
  DType dtype() const override { return DType::kF32; }
  void* k(int32_t seq_id, int64_t /*il*/, int64_t pos) override {
    return k_[seq_id].data() + pos * width_;
  }
  void* v(int32_t seq_id, int64_t /*il*/, int64_t pos) override {
    return v_[seq_id].data() + pos * width_;
  }
  KvRows rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) override {
    return KvRows{k(seq_id, il, pos), v(seq_id, il, pos), width_, width_, n_max};
  }

 private:
  int64_t width_;
  std::vector<std::vector<float>> k_, v_;
};

// out of token t, head h, in double: softmax over positions [0, pos] of scale · q · k, times v.
std::vector<double> reference(const ForwardInput& in, TestKv& kv, const GqaShape& s,
                              const std::vector<float>& q) {
  const int64_t hd = s.head_dim, group = s.n_head / s.n_head_kv, q_w = s.n_head * hd;
  std::vector<double> out(static_cast<size_t>(in.n_tokens() * q_w));
  for (int64_t t = 0; t < in.n_tokens(); ++t) {
    const int32_t seq = in.spans[in.span_of[t]].seq_id;
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t off = h / group * hd;
      const float* qh = q.data() + t * q_w + h * hd;
      std::vector<double> p(static_cast<size_t>(in.pos[t] + 1));
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= in.pos[t]; ++j) {
        const float* kj = static_cast<const float*>(kv.k(seq, 0, j)) + off;
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) d += double(qh[c]) * kj[c];
        p[j] = d * s.scale;
        max = std::max(max, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - max));
      for (int64_t j = 0; j <= in.pos[t]; ++j) {
        const float* vj = static_cast<const float*>(kv.v(seq, 0, j)) + off;
        for (int64_t c = 0; c < hd; ++c) out[t * q_w + h * hd + c] += p[j] / sum * vj[c];
      }
    }
  }
  return out;
}

TEST(AttentionTest, EverySplitOverThePoolGivesOneThreadsBits) {
  std::mt19937 rng(21);
  const GqaShape shape{8, 4, 64, 0.125f};
  const int64_t q_w = shape.n_head * shape.head_dim;
  TestKv kv(3, 700, shape.n_head_kv * shape.head_dim, rng);
  ThreadPool one(1), two(2), four(4);
  // One sequence decoding at short and long contexts (KV rows from 4 to 2,800), then a batch
  // of decode steps and a prompt chunk.
  std::vector<ForwardInput> inputs;
  for (int64_t n_past : {0, 15, 40, 63, 64, 200, 699}) {
    inputs.emplace_back();
    const int32_t tok = 1;
    inputs.back().add(0, n_past, &tok, 1, true);
  }
  inputs.emplace_back();
  const std::vector<int32_t> toks(20, 1);
  inputs.back().add(0, 100, toks.data(), 1, true);
  inputs.back().add(1, 30, toks.data(), 20, true);
  inputs.back().add(2, 5, toks.data(), 1, true);
  for (const ForwardInput& in : inputs) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(in.n_tokens() * q_w));
    for (float& f : q) f = normal(rng);
    std::vector<float> want(q.size()), got(q.size());
    attention_gqa(one, in, kv, 0, shape, q.data(), want.data());
    for (ThreadPool* pool : {&two, &four}) {
      attention_gqa(*pool, in, kv, 0, shape, q.data(), got.data());
      ASSERT_EQ(got, want) << pool->n_threads() << " threads, " << in.n_tokens()
                           << " tokens, last at " << in.pos.back();
    }
    const std::vector<double> exact = reference(in, kv, shape, q);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(want[i], exact[i], 1e-5) << "element " << i << " at " << in.pos.back();
  }
}

// Inputs of every kind: one sequence decoding at short and long contexts, a batch of decode
// steps, and a batch with a prompt chunk of 20 tokens (three token blocks of one sequence).
std::vector<ForwardInput> mixed_inputs() {
  std::vector<ForwardInput> inputs;
  const std::vector<int32_t> toks(20, 1);
  for (int64_t n_past : {0, 63, 200}) {
    inputs.emplace_back();
    inputs.back().add(0, n_past, toks.data(), 1, true);
  }
  inputs.emplace_back();
  for (int32_t seq = 0; seq < 3; ++seq)
    inputs.back().add(seq, 100 + 50 * seq, toks.data(), 1, true);
  inputs.emplace_back();
  inputs.back().add(0, 100, toks.data(), 1, true);
  inputs.back().add(1, 30, toks.data(), 20, true);
  inputs.back().add(2, 5, toks.data(), 1, true);
  return inputs;
}

TEST(AttentionTest, PrepareWritesEachBlockAndHeadOnceBeforeItIsRead) {
  const GqaShape shape{8, 4, 64, 0.125f};
  const int64_t hd = shape.head_dim, group = shape.n_head / shape.n_head_kv;
  const int64_t q_w = shape.n_head * hd, kv_w = shape.n_head_kv * hd;
  ThreadPool one(1), two(2), four(4);
  for (const ForwardInput& in : mixed_inputs()) {
    std::mt19937 rng(5), rng_copy(5);
    TestKv full(3, 300, kv_w, rng), store(3, 300, kv_w, rng_copy);  // the same rows
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(in.n_tokens() * q_w));
    for (float& f : q) f = normal(rng);
    std::vector<float> want(q.size());
    attention_gqa(one, in, full, 0, shape, q.data(), want.data());
    for (ThreadPool* pool : {&one, &two, &four}) {
      // The batch's own rows and queries as they are before prepare: NaN rows, halved queries.
      for (int64_t t = 0; t < in.n_tokens(); ++t) {
        const int32_t seq = in.spans[in.span_of[t]].seq_id;
        std::fill_n(static_cast<float*>(store.k(seq, 0, in.pos[t])), kv_w,
                    std::numeric_limits<float>::quiet_NaN());
        std::fill_n(static_cast<float*>(store.v(seq, 0, in.pos[t])), kv_w,
                    std::numeric_limits<float>::quiet_NaN());
      }
      std::vector<float> q_in(q.size()), got(q.size());
      for (size_t i = 0; i < q.size(); ++i) q_in[i] = q[i] / 2;
      std::mutex mu;
      std::map<std::tuple<int64_t, int64_t, int64_t>, int> calls;  // (t0, t1, kvh) -> times
      attention_gqa(*pool, in, store, 0, shape, q_in.data(), got.data(),
                    [&](int64_t t0, int64_t t1, int64_t kvh) {
                      {
                        std::lock_guard<std::mutex> lock(mu);
                        ++calls[{t0, t1, kvh}];
                      }
                      for (int64_t t = t0; t < t1; ++t) {
                        const int32_t seq = in.spans[in.span_of[t]].seq_id;
                        const int64_t pos = in.pos[t];
                        std::copy_n(static_cast<float*>(full.k(seq, 0, pos)) + kvh * hd, hd,
                                    static_cast<float*>(store.k(seq, 0, pos)) + kvh * hd);
                        std::copy_n(static_cast<float*>(full.v(seq, 0, pos)) + kvh * hd, hd,
                                    static_cast<float*>(store.v(seq, 0, pos)) + kvh * hd);
                        float* qh = q_in.data() + t * q_w + kvh * group * hd;
                        for (int64_t i = 0; i < group * hd; ++i) qh[i] *= 2;
                      }
                    });
      ASSERT_EQ(got, want) << pool->n_threads() << " threads, " << in.n_tokens()
                           << " tokens, last at " << in.pos.back();
      int64_t tokens = 0;
      for (const auto& [key, n] : calls) {
        EXPECT_EQ(n, 1) << "tokens [" << std::get<0>(key) << ", " << std::get<1>(key) << ") head "
                        << std::get<2>(key);
        tokens += std::get<1>(key) - std::get<0>(key);
      }
      EXPECT_EQ(tokens, in.n_tokens() * shape.n_head_kv);
    }
  }
}

}  // namespace
}  // namespace duet
