// The single-rank forward pass and generator: incremental decoding equals one long prefill,
// batching does not change any sequence's logits, greedy decoding is deterministic and seeded
// sampling reproducible. Run for every architecture, with f32 and bf16 KV caches; a bf16 KV cache
// gives the f32 one's greedy tokens on the tiny models and reads half its bytes; weights packed
// as panels at load give the greedy tokens of weights read as stored.
#include "engine/generator.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "engine/decisive_prompts.h"
#include "engine/poisoned_model.h"
#include "engine/tiny_models.h"
#include "kernels/matmul.h"

namespace duet {
namespace {

struct GenCase {
  const char* arch;
  KvCacheDtype kv;
};

class GeneratorTest : public ::testing::TestWithParam<GenCase> {
 protected:
  void SetUp() override {
    model_ = Model::load(test::tiny_model_dir(GetParam().arch));
    gen_ = std::make_unique<Generator>(*model_, pool_, GetParam().kv);
  }
  int64_t n_vocab() const { return model_->config().n_vocab; }

  std::vector<int32_t> prompt(int64_t n, int32_t salt) const {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((31 * i + 7 * salt + 3) % n_vocab()));
    return p;
  }

  // All-position logits of `toks` as one prefill of a fresh sequence.
  std::vector<float> prefill_logits(const std::vector<int32_t>& toks) {
    const int32_t seq = gen_->kv_cache().add_sequence();
    ForwardInput in;
    in.add(seq, 0, toks.data(), static_cast<int64_t>(toks.size()), true);
    std::vector<float> out = gen_->forward(in);
    gen_->kv_cache().remove_sequence(seq);
    return out;
  }

  static void expect_close(const float* a, const float* b, int64_t n, const std::string& what) {
    float scale = 1.0f;
    for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(b[i]));
    float worst = 0.0f;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    EXPECT_LE(worst, 1e-4f * scale) << what;
  }

  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Generator> gen_;
};

TEST_P(GeneratorTest, PrefillThenDecodeMatchesOnePrefill) {
  const std::vector<int32_t> toks = prompt(12, 1);
  const std::vector<float> full = prefill_logits(toks);
  ASSERT_EQ(full.size(), toks.size() * n_vocab());

  const int32_t seq = gen_->kv_cache().add_sequence();
  const int64_t n_first = 5;
  ForwardInput first;
  first.add(seq, 0, toks.data(), n_first, true);
  std::vector<float> got = gen_->forward(first);
  for (size_t t = n_first; t < toks.size(); ++t) {
    ForwardInput step;
    step.add(seq, static_cast<int64_t>(t), &toks[t], 1, false);
    const std::vector<float>& l = gen_->forward(step);
    got.insert(got.end(), l.begin(), l.end());
  }
  ASSERT_EQ(got.size(), full.size());
  for (size_t t = 0; t < toks.size(); ++t)
    expect_close(&got[t * n_vocab()], &full[t * n_vocab()], n_vocab(), "position " + std::to_string(t));
}

TEST_P(GeneratorTest, BatchedSequencesMatchEachAlone) {
  const std::vector<std::vector<int32_t>> prompts = {prompt(7, 1), prompt(3, 2), prompt(10, 3)};
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) alone.push_back(prefill_logits(p));

  // Prefill all three in one batch with every position's logits.
  std::vector<int32_t> seqs;
  ForwardInput in;
  for (const auto& p : prompts) {
    seqs.push_back(gen_->kv_cache().add_sequence());
    in.add(seqs.back(), 0, p.data(), static_cast<int64_t>(p.size()), true);
  }
  const std::vector<float> batched = gen_->forward(in);
  int64_t row = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (size_t t = 0; t < prompts[i].size(); ++t, ++row) {
      expect_close(&batched[row * n_vocab()], &alone[i][t * n_vocab()], n_vocab(),
                   "seq " + std::to_string(i) + " pos " + std::to_string(t));
    }
  }
  // One batched decode step continues each sequence as its own prefill would.
  const int32_t next[3] = {5, 6, 7};
  ForwardInput step;
  for (size_t i = 0; i < prompts.size(); ++i)
    step.add(seqs[i], static_cast<int64_t>(prompts[i].size()), &next[i], 1, false);
  const std::vector<float> dec = gen_->forward(step);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> longer = prompts[i];
    longer.push_back(next[i]);
    const std::vector<float> ref = prefill_logits(longer);
    expect_close(&dec[i * n_vocab()], &ref[(longer.size() - 1) * n_vocab()], n_vocab(),
                 "decode seq " + std::to_string(i));
  }
}

TEST_P(GeneratorTest, GreedyIsDeterministicAndBatchInvariant) {
  std::vector<GenerateRequest> reqs(3);
  for (int i = 0; i < 3; ++i) {
    reqs[i].prompt = prompt(4 + 3 * i, i);
    reqs[i].max_tokens = 6 + i;
  }
  const auto a = gen_->generate(reqs);
  const auto b = gen_->generate(reqs);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].tokens.size(), static_cast<size_t>(6 + i));
    EXPECT_EQ(a[i].finish_reason, "length");
    EXPECT_EQ(gen_->generate({reqs[i]})[0].tokens, a[i].tokens) << "request " << i << " alone";
  }
  EXPECT_EQ(gen_->kv_cache().n_sequences(), 0);
}

TEST_P(GeneratorTest, SeededSamplingIsReproducible) {
  GenerateRequest r;
  r.prompt = prompt(5, 9);
  r.max_tokens = 12;
  r.sampling.temperature = 1.5f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 42;
  const auto a = gen_->generate({r})[0].tokens;
  const auto b = gen_->generate({r})[0].tokens;
  EXPECT_EQ(a, b);
  r.sampling.seed = 43;
  const auto c = gen_->generate({r})[0].tokens;
  EXPECT_NE(a, c) << "different seeds should give different samples";
}

TEST_P(GeneratorTest, StopsAtStopToken) {
  GenerateRequest r;
  r.prompt = prompt(6, 4);
  r.max_tokens = 8;
  const auto free_run = gen_->generate({r})[0].tokens;
  r.stop_ids = {free_run[2]};
  const auto stopped = gen_->generate({r})[0];
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_LE(stopped.tokens.size(), 3u);
  EXPECT_EQ(stopped.tokens.back(), free_run[2]);
}

TEST_P(GeneratorTest, RejectsBadRequests) {
  GenerateRequest r;
  EXPECT_THROW(gen_->generate({r}), Error);  // empty prompt
  r.prompt = {0, static_cast<int32_t>(n_vocab())};
  EXPECT_THROW(gen_->generate({r}), Error);  // id out of range
  r.prompt = {1, 2};
  r.max_tokens = model_->config().max_position_embeddings;
  EXPECT_THROW(gen_->generate({r}), Error);  // longer than the context
  EXPECT_EQ(gen_->kv_cache().n_sequences(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, GeneratorTest,
                         ::testing::Values(GenCase{"qwen3_moe", KvCacheDtype::kF32},
                                           GenCase{"deepseek_v2", KvCacheDtype::kF32},
                                           GenCase{"mixtral", KvCacheDtype::kF32},
                                           GenCase{"qwen3_moe", KvCacheDtype::kBf16},
                                           GenCase{"deepseek_v2", KvCacheDtype::kBf16},
                                           GenCase{"mixtral", KvCacheDtype::kBf16}),
                         [](const ::testing::TestParamInfo<GenCase>& info) {
                           return std::string(info.param.arch) +
                                  (info.param.kv == KvCacheDtype::kBf16 ? "_kv_bf16" : "_kv_f32");
                         });

class KvDtypeGenerateTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// Every architecture with f32 and with bf16 weights, and the test names for them.
const auto kArchsAndWeights =
    ::testing::Combine(::testing::Values("qwen3_moe", "deepseek_v2", "mixtral"),
                       ::testing::Values(DType::kF32, DType::kBF16));

std::string arch_and_weights_name(
    const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
  return std::get<0>(info.param) +
         (std::get<1>(info.param) == DType::kBF16 ? "_bf16_weights" : "_f32_weights");
}

// The decisive prompts of a tiny model (test::decisive_prompts), 8 greedy tokens each.
std::vector<GenerateRequest> decisive_requests(const std::string& arch, DType weights) {
  std::vector<GenerateRequest> reqs;
  for (std::vector<int32_t>& prompt : test::decisive_prompts(arch, weights)) {
    reqs.emplace_back();
    reqs.back().prompt = std::move(prompt);
    reqs.back().max_tokens = 8;
  }
  return reqs;
}

// Greedy tokens with bf16 K/V rows equal those with f32 rows on the tiny models (f32 and bf16
// weights), on any instruction set. Rounding K/V to bf16 moves logits by about 2e-3 (GQA) to 7e-2
// (MLA's latent) of the row's largest logit, and can send a token to another expert where a
// random model's top-k margin is small, so the requests are decisive prompts: their margins and
// top-2 logit gaps are checked to exceed what the roundings move. `auto` follows the weights, and
// the decode steps' KV bytes (bench latency's figure) halve with bf16.
TEST_P(KvDtypeGenerateTest, Bf16GreedyTokensEqualF32) {
  const auto& [arch, weights] = GetParam();
  std::unique_ptr<Model> model = Model::load(test::tiny_model_dir(arch, weights));
  ThreadPool pool(2);
  Generator f32(*model, pool, KvCacheDtype::kF32), bf16(*model, pool, KvCacheDtype::kBf16);
  Generator automatic(*model, pool);
  EXPECT_EQ(f32.kv_cache().dtype(), DType::kF32);
  EXPECT_EQ(bf16.kv_cache().dtype(), DType::kBF16);
  EXPECT_EQ(automatic.kv_cache().dtype(), weights);
  const std::vector<GenerateRequest> reqs = decisive_requests(arch, weights);
  GenerateStats st_f32, st_bf16;
  const std::vector<GenerateResult> want = f32.generate(reqs, &st_f32);
  const std::vector<GenerateResult> got = bf16.generate(reqs, &st_bf16);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  EXPECT_GT(st_bf16.decode_kv_bytes, 0u);
  EXPECT_EQ(2 * st_bf16.decode_kv_bytes, st_f32.decode_kv_bytes);
}

INSTANTIATE_TEST_SUITE_P(Archs, KvDtypeGenerateTest, kArchsAndWeights, arch_and_weights_name);

class RepackGenerateTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// The matrices every token multiplies, read from panels packed at load (the default), give the
// same greedy tokens as read as stored (--no-repack): the requests' prefill step multiplies
// more than kPanelMinTokens tokens, so panels are read there; the packed copies count in the
// model's resident bytes where matmul reads them.
TEST_P(RepackGenerateTest, GreedyTokensEqualWithoutRepack) {
  const auto& [arch, weights] = GetParam();
  LoadOptions plain;
  plain.repack = false;
  std::unique_ptr<Model> packed = Model::load(test::tiny_model_dir(arch, weights));
  std::unique_ptr<Model> as_stored = Model::load(test::tiny_model_dir(arch, weights), plain);
  EXPECT_EQ(packed->weight_bytes() > as_stored->weight_bytes(), matmul_reads_panels(weights));
  ThreadPool pool(2);
  Generator a(*packed, pool), b(*as_stored, pool);
  // Panels and rows sum in another order (differences of 1e-6): decisive prompts.
  const std::vector<GenerateRequest> reqs = decisive_requests(arch, weights);
  const std::vector<GenerateResult> want = b.generate(reqs);
  const std::vector<GenerateResult> got = a.generate(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
}

INSTANTIATE_TEST_SUITE_P(Archs, RepackGenerateTest, kArchsAndWeights, arch_and_weights_name);

}  // namespace
}  // namespace duet

namespace duet {
namespace {

// A request whose logits turn NaN (its prompt holds a token whose embedding is NaN) ends with an
// error naming the problem; the other request of the same batch gets its tokens as if alone.
TEST(GeneratorNonFiniteTest, NanLogitsEndOnlyThatRequest) {
  std::unique_ptr<Model> model = Model::load(test::poisoned_model_dir(7));
  ThreadPool pool(2);
  Generator gen(*model, pool);
  GenerateRequest bad, good;
  bad.prompt = {3, 7, 9};
  good.prompt = {3, 8, 9, 11};
  bad.max_tokens = good.max_tokens = 4;
  const std::vector<GenerateResult> got = gen.generate({bad, good});
  EXPECT_EQ(got[0].finish_reason, "error");
  EXPECT_TRUE(got[0].tokens.empty());
  EXPECT_NE(got[0].error.find("not finite"), std::string::npos) << got[0].error;
  const GenerateResult alone = gen.generate({good})[0];
  EXPECT_EQ(got[1].finish_reason, "length");
  EXPECT_EQ(got[1].tokens, alone.tokens);
}

}  // namespace
}  // namespace duet
