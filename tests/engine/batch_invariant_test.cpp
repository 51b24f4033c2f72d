// With batch-invariant products (--batch-invariant) a sequence's logits are the same, bit for bit,
// alone and in a batch with many others: its prefill in one piece alone and in two chunks among
// 150 other tokens, its decode steps alone and among 80 other sequences (so every product, the
// experts' included, runs on both sides of the tiled and panel thresholds). Every architecture,
// f32 and bf16 weights, packed panels present (the mode must not read them).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/generator.h"
#include "engine/tiny_models.h"
#include "kernels/matmul.h"

namespace duet {
namespace {

struct BatchInvariant {
  BatchInvariant() { set_matmul_batch_invariant(true); }
  ~BatchInvariant() { set_matmul_batch_invariant(false); }
};

class BatchInvariantGenerateTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  std::vector<int32_t> tokens(int64_t n, int32_t salt, int64_t n_vocab) const {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < n; ++i)
      t.push_back(static_cast<int32_t>((37 * i + 11 * salt + 5) % n_vocab));
    return t;
  }
};

TEST_P(BatchInvariantGenerateTest, LogitsAloneEqualLogitsInABigBatch) {
  const auto& [arch, dtype] = GetParam();
  const BatchInvariant on;
  ThreadPool pool(2);
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir(arch, dtype));
  const int64_t n_vocab = model->config().n_vocab;
  const std::vector<int32_t> prompt = tokens(10, 1, n_vocab);
  const int32_t next[3] = {3, 4, 5};

  // Alone: the prompt in one prefill, then three decode steps; the last position's logits each.
  std::vector<std::vector<float>> alone;
  {
    Generator gen(*model, pool, KvCacheDtype::kF32);
    const int32_t seq = gen.kv_cache().add_sequence();
    ForwardInput in;
    in.add(seq, 0, prompt.data(), static_cast<int64_t>(prompt.size()), false);
    alone.push_back(gen.forward(in));
    for (int s = 0; s < 3; ++s) {
      ForwardInput step;
      step.add(seq, static_cast<int64_t>(prompt.size()) + s, &next[s], 1, false);
      alone.push_back(gen.forward(step));
    }
  }

  // In company: the prompt in two chunks, each beside 75 tokens of other prompts; then each
  // decode step beside 80 other sequences.
  Generator gen(*model, pool, KvCacheDtype::kF32);
  const int32_t seq = gen.kv_cache().add_sequence();
  std::vector<int32_t> others;
  std::vector<std::vector<int32_t>> other_prompts;
  for (int i = 0; i < 80; ++i) {
    others.push_back(gen.kv_cache().add_sequence());
    other_prompts.push_back(tokens(i < 10 ? 15 : 1, 100 + i, n_vocab));
  }
  std::vector<std::vector<float>> together;
  auto last_rows = [&](const std::vector<float>& logits, int64_t row) {
    return std::vector<float>(logits.begin() + row * n_vocab, logits.begin() + (row + 1) * n_vocab);
  };
  for (int chunk = 0; chunk < 2; ++chunk) {
    ForwardInput in;
    for (int i = 5 * chunk; i < 5 * chunk + 5; ++i)  // 5 others of 15 tokens per chunk
      in.add(others[i], 0, other_prompts[i].data(), 15, false);
    in.add(seq, 5 * chunk, prompt.data() + 5 * chunk, 5, false);
    const std::vector<float>& logits = gen.forward(in);
    if (chunk == 1) together.push_back(last_rows(logits, 5));  // rows: 5 others, then seq
  }
  for (int i = 10; i < 80; ++i) {  // the single-token others prefill before the decode steps
    ForwardInput in;
    in.add(others[i], 0, other_prompts[i].data(), 1, false);
    gen.forward(in);
  }
  for (int s = 0; s < 3; ++s) {
    ForwardInput step;
    for (int i = 0; i < 40; ++i) {
      const int64_t pos = i < 10 ? 15 + s : 1 + s;
      step.add(others[i], pos, &next[s], 1, false);
    }
    step.add(seq, static_cast<int64_t>(prompt.size()) + s, &next[s], 1, false);
    for (int i = 40; i < 80; ++i) {
      const int64_t pos = i < 10 ? 15 + s : 1 + s;
      step.add(others[i], pos, &next[s], 1, false);
    }
    together.push_back(last_rows(gen.forward(step), 40));
  }

  ASSERT_EQ(alone.size(), together.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(alone[i].size(), static_cast<size_t>(n_vocab));
    EXPECT_EQ(std::memcmp(alone[i].data(), together[i].data(), n_vocab * sizeof(float)), 0)
        << (i == 0 ? "prefill" : "decode step " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, BatchInvariantGenerateTest,
                         ::testing::Combine(::testing::Values("qwen3_moe", "deepseek_v2",
                                                              "deepseek_v3", "mixtral"),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == DType::kF32 ? "_f32" : "_bf16");
                         });

}  // namespace
}  // namespace duet
