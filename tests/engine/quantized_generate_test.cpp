// --quantization int8 and int4 in whole forward passes: the greedy tokens of a model quantized at
// load equal those of the same model with its weights replaced by their dequantized values (so
// the two differ only by the rounding of x to int8 inside the products), and expert parallelism
// with quantized experts gives the single-rank tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <mutex>

#include "dist/inproc_backend.h"
#include "engine/decisive_prompts.h"
#include "engine/ep_requests.h"
#include "engine/generator.h"
#include "kernels/quantize.h"
#include "model/config.h"
#include "model/mla_heads.h"
#include "model/quantization.h"
#include "model/safetensors.h"
#include "model/weight_source.h"
#include "moe/borrowed_dispatcher.h"
#include "moe/ep_dispatcher.h"
#include "tiny_models.h"

namespace duet {
namespace {

// The 2-D tensor t as a Matrix of its rows as stored.
Matrix matrix_of(const TensorView& t) {
  Matrix m;
  m.dtype = t.dtype;
  m.rows = t.dim(0);
  m.cols = t.dim(1);
  m.data = t.data;
  return m;
}

// MLA's kv_b as --quantization holds it (split by head, each part quantized: MlaKvB), back in
// kv_b's layout, f32.
std::vector<float> dequantized_kv_b(const Matrix& kv_b, const MlaHeads& m, DType to) {
  std::vector<float> k_b, v_b;
  mla_split_kv_b(kv_b, m, k_b, v_b);
  const std::vector<float> k = dequantize_int(
      QuantizedMatrix({DType::kF32, m.n_head * m.rank, m.nope, k_b.data()}, to).view());
  const std::vector<float> v = dequantize_int(
      QuantizedMatrix({DType::kF32, m.n_head * m.v_dim, m.rank, v_b.data()}, to).view());
  const int64_t kv_rows = m.nope + m.v_dim;
  std::vector<float> out(static_cast<size_t>(m.n_head * kv_rows * m.rank));
  for (int64_t h = 0; h < m.n_head; ++h) {
    for (int64_t l = 0; l < m.rank; ++l) {
      for (int64_t r = 0; r < m.nope; ++r)
        out[(h * kv_rows + r) * m.rank + l] = k[(h * m.rank + l) * m.nope + r];
      for (int64_t r = 0; r < m.v_dim; ++r)
        out[(h * kv_rows + m.nope + r) * m.rank + l] = v[(h * m.v_dim + r) * m.rank + l];
    }
  }
  return out;
}

// A copy of the model in `dir` whose matrices that --quantization quantizes hold the f32 values
// of their quantized form (d · q) under q (MLA's kv_b as its quantized parts hold it); every
// other tensor and file as it was.
std::string dequantized_copy(const std::string& dir, Quantization q) {
  namespace fs = std::filesystem;
  const std::string out = test::make_temp_dir("duet-dequantized-");
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".safetensors") && !name.ends_with(".index.json"))
      fs::copy_file(e.path(), fs::path(out) / name, fs::copy_options::overwrite_existing);
  }
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  const ModelConfig c = load_config(dir);
  const MlaHeads heads{c.n_head, c.qk_head_dim(), c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank};
  std::vector<TensorData> tensors;
  for (const std::string& name : set.names()) {
    const TensorView& t = set.get(name);
    TensorData d{name, t.dtype, t.shape, {}};
    const bool kv_b = name.ends_with("self_attn.kv_b_proj.weight");
    if (t.shape.size() == 2 && (quantized_at_load(name) || kv_b)) {
      const DType to = quantized_dtype(q, name);
      const std::vector<float> v = kv_b ? dequantized_kv_b(matrix_of(t), heads, to)
                                        : dequantize_int(QuantizedMatrix(matrix_of(t), to).view());
      d.dtype = DType::kF32;
      d.bytes.resize(v.size() * sizeof(float));
      std::memcpy(d.bytes.data(), v.data(), d.bytes.size());
    } else {
      const auto* p = static_cast<const uint8_t*>(t.data);
      d.bytes.assign(p, p + t.nbytes());
    }
    tensors.push_back(std::move(d));
  }
  write_safetensors_dir(out, tensors, uint64_t{1} << 30);
  return out;
}

LoadOptions quantized_options(Quantization q) {
  LoadOptions o;
  o.quantization = q;
  return o;
}

class QuantizedGenerateTest
    : public ::testing::TestWithParam<std::tuple<std::string, DType, Quantization>> {};

// On the decisive prompts (whose margins exceed what rounding x moves; for int4 those of the
// dequantized int4 model), every architecture with f32 and bf16 weights; on every instruction
// set (tests/cmake/isa.cmake runs this suite per set).
TEST_P(QuantizedGenerateTest, GreedyTokensEqualTheDequantizedModel) {
  const auto& [arch, weights, quant] = GetParam();
  const std::string dir = test::tiny_model_dir(arch, weights);
  std::unique_ptr<Model> q8 = Model::load(dir, quantized_options(quant));
  std::unique_ptr<Model> deq = Model::load(dequantized_copy(dir, quant));
  std::unique_ptr<Model> plain = Model::load(dir);
  const QuantizationReport& r = q8->quantization();
  EXPECT_EQ(r.quantization, quant);
  EXPECT_GT(r.n_matrices, 0);
  EXPECT_GT(r.bytes_after, 0u);  // the tiny models' 32- and 64-wide rows pad to 128 columns
  EXPECT_EQ(q8->weight_bytes(), plain->weight_bytes() - r.bytes_before + r.bytes_after -
                                    plain->panel_bytes() + q8->panel_bytes());
  EXPECT_EQ(q8->weight_dtype(), weights);  // the KV cache follows the checkpoint's dtype

  std::vector<GenerateRequest> reqs;
  for (std::vector<int32_t>& prompt : test::decisive_prompts(
           arch, weights, quant == Quantization::kInt8 ? "" : quantization_name(quant))) {
    reqs.emplace_back();
    reqs.back().prompt = std::move(prompt);
    reqs.back().max_tokens = 8;
  }
  ThreadPool pool(2);
  Generator a(*q8, pool), b(*deq, pool);
  const std::vector<GenerateResult> want = b.generate(reqs);
  const std::vector<GenerateResult> got = a.generate(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Archs, QuantizedGenerateTest,
    ::testing::Combine(::testing::Values("qwen3_moe", "deepseek_v2", "mixtral"),
                       ::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::Values(Quantization::kInt8, Quantization::kInt4,
                                         Quantization::kInt4Pure)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, DType, Quantization>>& info) {
      return std::get<0>(info.param) +
             (std::get<1>(info.param) == DType::kBF16 ? "_bf16_weights_" : "_f32_weights_") +
             quantization_name(std::get<2>(info.param));
    });

// MLA's kv_b is quantized too, split by head (each head's W_UK transposed, its W_UV as stored):
// what a load quantized is every loaded matrix quantized_at_load names plus each layer's kv_b,
// the bytes after it those of the quantized matrices and of kv_b's two parts. Loaded: the layers
// below n_layer (deepseek_v3's multi-token-prediction layer is not).
TEST(QuantizedLoadTest, MlaKvBIsSplitByHeadAndQuantized) {
  for (const char* arch : {"deepseek_v2", "deepseek_v3"}) {
    const std::string dir = test::tiny_model_dir(arch, DType::kBF16);
    const ModelConfig c = load_config(dir);
    const MlaHeads heads{c.n_head, c.qk_head_dim(), c.qk_nope_head_dim, c.v_head_dim,
                         c.kv_lora_rank};
    const SafetensorsSet set = SafetensorsSet::open_dir(dir);
    for (Quantization q : {Quantization::kInt8, Quantization::kInt4}) {
      std::unique_ptr<Model> m = Model::load(dir, quantized_options(q));
      int64_t n = 0, n_kv_b = 0;
      uint64_t before = 0, after = 0;
      for (const std::string& name : set.names()) {
        const TensorView& t = set.get(name);
        if (t.shape.size() != 2) continue;
        if (name.starts_with("model.layers.") &&
            std::stoll(name.substr(std::string("model.layers.").size())) >= c.n_layer) {
          continue;
        }
        const DType to = quantized_dtype(q, name);
        if (name.ends_with("self_attn.kv_b_proj.weight")) {
          std::vector<float> k_b, v_b;
          mla_split_kv_b(matrix_of(t), heads, k_b, v_b);
          after += QuantizedMatrix(
                       {DType::kF32, c.n_head * c.kv_lora_rank, c.qk_nope_head_dim, k_b.data()}, to)
                       .view()
                       .nbytes() +
                   QuantizedMatrix(
                       {DType::kF32, c.n_head * c.v_head_dim, c.kv_lora_rank, v_b.data()}, to)
                       .view()
                       .nbytes();
          ++n_kv_b;
        } else if (quantized_at_load(name)) {
          after += QuantizedMatrix(matrix_of(t), to).view().nbytes();
        } else {
          continue;
        }
        ++n;
        before += t.nbytes();
      }
      EXPECT_EQ(n_kv_b, c.n_layer) << arch;
      EXPECT_EQ(m->quantization().n_matrices, n) << arch << " " << quantization_name(q);
      EXPECT_EQ(m->quantization().bytes_before, before) << arch << " " << quantization_name(q);
      EXPECT_EQ(m->quantization().bytes_after, after) << arch << " " << quantization_name(q);
    }
  }
}

// Without a quantization kv_b is split by head all the same, in its own dtype (bf16 or f32):
// each part's elements the stored ones, bit for bit, and `name`'s bytes the stored bytes; so
// both of absorbed attention's products are plain products (the inputs rounded where the kernels
// round them, as for every other matrix).
TEST(QuantizedLoadTest, MlaKvBIsSplitByHeadAsStoredWithoutAQuantization) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const std::string dir = test::tiny_model_dir("deepseek_v2", dtype);
    const ModelConfig c = load_config(dir);
    const MlaHeads heads{c.n_head, c.qk_head_dim(), c.qk_nope_head_dim, c.v_head_dim,
                         c.kv_lora_rank};
    const int64_t kv_rows = heads.nope + heads.v_dim, size = dtype_size(dtype);
    CheckpointSource src(dir);
    const std::string name = "model.layers.0.self_attn.kv_b_proj.weight";
    const MlaKvB w = src.mla_kv_b(name, heads);
    ASSERT_TRUE(w.split());
    ASSERT_EQ(w.k_b.dtype, dtype);
    ASSERT_EQ(w.v_b.dtype, dtype);
    const SafetensorsSet set = SafetensorsSet::open_dir(dir);
    const TensorView& t = set.get(name);
    const auto* stored = static_cast<const char*>(t.data);
    const auto* k_b = static_cast<const char*>(w.k_b.data);
    const auto* v_b = static_cast<const char*>(w.v_b.data);
    for (int64_t h = 0; h < heads.n_head; ++h) {
      for (int64_t l = 0; l < heads.rank; ++l) {
        for (int64_t r = 0; r < heads.nope; ++r)
          ASSERT_EQ(std::memcmp(k_b + ((h * heads.rank + l) * heads.nope + r) * size,
                                stored + ((h * kv_rows + r) * heads.rank + l) * size, size),
                    0);
        for (int64_t r = 0; r < heads.v_dim; ++r)
          ASSERT_EQ(
              std::memcmp(v_b + ((h * heads.v_dim + r) * heads.rank + l) * size,
                          stored + ((h * kv_rows + heads.nope + r) * heads.rank + l) * size, size),
              0);
      }
    }
    EXPECT_EQ(src.bytes_by_name().at(name), t.nbytes());
    EXPECT_EQ(src.mla_kv_b(name, heads).k_b.data, w.k_b.data);
  }
}

// int4's output head is int8 and int4_pure's int4, every other matrix int4 in both: the step's
// dense bytes differ by exactly the head's two sizes.
TEST(QuantizedLoadTest, Int4HoldsTheOutputHeadAtInt8) {
  const std::string dir = test::tiny_model_dir("qwen3_moe", DType::kBF16);
  std::unique_ptr<Model> int4 = Model::load(dir, quantized_options(Quantization::kInt4));
  std::unique_ptr<Model> pure = Model::load(dir, quantized_options(Quantization::kInt4Pure));
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  const Matrix m = matrix_of(set.get("lm_head.weight"));
  const uint64_t q8 = QuantizedMatrix(m, DType::kQ8).view().nbytes();
  const uint64_t q4 = QuantizedMatrix(m, DType::kQ4).view().nbytes();
  ASSERT_GT(q8, q4);
  EXPECT_EQ(int4->dense_bytes_per_step() - pure->dense_bytes_per_step(), q8 - q4);
  EXPECT_EQ(int4->quantization().n_matrices, pure->quantization().n_matrices);
  EXPECT_EQ(int4->quantization().bytes_after - pure->quantization().bytes_after, q8 - q4);
}

struct EpCase {
  const char* arch;
  int world;
  All2AllBackend backend;
  Quantization quantization = Quantization::kInt8;
};

class QuantizedEpTest : public ::testing::TestWithParam<EpCase> {};

// Each rank quantizes only its own experts; DP attention (request i on rank i % world).
TEST_P(QuantizedEpTest, ExpertParallelEqualsSingleRank) {
  const EpCase c = GetParam();
  const std::string dir = test::tiny_model_dir(c.arch);
  const std::vector<GenerateRequest> reqs = test::ep_requests(5);
  std::vector<std::vector<int32_t>> want;
  {
    std::unique_ptr<Model> m = Model::load(dir, quantized_options(c.quantization));
    ThreadPool pool(1);
    Generator g(*m, pool);
    for (const GenerateResult& r : g.generate(reqs)) want.push_back(r.tokens);
  }
  std::mutex mu;
  run_ranks(c.world, [&](DistContext& ctx) {
    const ExpertPlacement place = place_experts(8, ctx.world_size());
    LoadOptions opt = quantized_options(c.quantization);
    opt.expert_begin = place.begin(ctx.rank());
    opt.expert_end = place.end(ctx.rank());
    std::unique_ptr<Model> m = Model::load(dir, opt);
    ThreadPool pool(1);
    EpDispatcher ep(ctx.comm(), place, {c.backend, 64});
    Generator gen(*m, pool, KvCacheDtype::kAuto, test::borrowing_group(ctx.coord(), ep));
    std::vector<size_t> idx;
    const std::vector<GenerateResult> got =
        gen.generate(test::rank_share(reqs, ctx.rank(), c.world, &idx));
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_GT(m->quantization().n_matrices, 0);
    for (size_t j = 0; j < idx.size(); ++j) {
      EXPECT_EQ(got[j].tokens, want[idx[j]]) << "rank " << ctx.rank() << " request " << idx[j];
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Archs, QuantizedEpTest,
    ::testing::Values(EpCase{"qwen3_moe", 2, All2AllBackend::kHighThroughput},
                      EpCase{"qwen3_moe", 4, All2AllBackend::kLowLatency},
                      EpCase{"deepseek_v2", 2, All2AllBackend::kLowLatency},
                      EpCase{"deepseek_v3", 2, All2AllBackend::kHighThroughput},
                      EpCase{"mixtral", 2, All2AllBackend::kHighThroughput},
                      EpCase{"qwen3_moe", 2, All2AllBackend::kHighThroughput, Quantization::kInt4},
                      EpCase{"qwen3_moe", 4, All2AllBackend::kLowLatency, Quantization::kInt4},
                      EpCase{"deepseek_v3", 2, All2AllBackend::kLowLatency, Quantization::kInt4},
                      EpCase{"mixtral", 2, All2AllBackend::kHighThroughput, Quantization::kInt4},
                      EpCase{"qwen3_moe", 2, All2AllBackend::kLowLatency, Quantization::kInt4Pure}),
    [](const ::testing::TestParamInfo<EpCase>& info) {
      return std::string(info.param.arch) + "_ep" + std::to_string(info.param.world) + "_" +
             all2all_backend_name(info.param.backend) +
             (info.param.quantization == Quantization::kInt8
                  ? ""
                  : std::string("_") + quantization_name(info.param.quantization));
    });

}  // namespace
}  // namespace duet
