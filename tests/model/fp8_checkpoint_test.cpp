// fp8 checkpoints as DeepSeek-V3 and Qwen3-FP8 publish them: the config, the loader (codes kept
// as stored, block scales applied exactly, every malformed variant refused by name) and
// make-model --dtype fp8.
#include "model/fp8_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "kernels/fp8_rows.h"
#include "kernels/matmul_fp8.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_impl.h"
#include "model/config.h"
#include "model/make_model.h"
#include "model/mla_heads.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/test_checkpoint.h"
#include "model/weight_source.h"
#include "test_util.h"

namespace duet {
namespace {

using json = nlohmann::json;

const char* const kQ = "model.layers.0.self_attn.q_proj.weight";  // [64, 64] in tiny qwen3_moe

std::string fresh_model(const std::string& arch, DType dtype) {
  MakeModelOptions opt;
  opt.dir = test::make_temp_dir("duet-fp8-");
  opt.arch = arch;
  opt.dtype = dtype;
  opt.seed = 7;
  make_model(opt);
  return opt.dir;
}

void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
  json j = json::parse(test::read_file(dir + "/config.json"));
  edit(j);
  test::write_file(dir + "/config.json", j.dump());
}

using test::read_tensors;

void edit_tensors(const std::string& dir,
                  const std::function<void(std::vector<TensorData>&)>& edit) {
  std::vector<TensorData> ts = read_tensors(dir);
  edit(ts);
  std::filesystem::remove(dir + "/model.safetensors");
  write_safetensors_dir(dir, ts, 512ull << 20);
}

// Codes of q_proj: every finite E4M3 code in turn.
uint8_t code_at(int64_t i) {
  uint8_t c = static_cast<uint8_t>(i * 37 % 256);
  return (c & 0x7f) == 0x7f ? 0x01 : c;
}

// A tiny f32 qwen3_moe model whose q_proj is stored as fp8 codes (code_at) with scales 2^(b - 5)
// for blocks of `block` (config) and the scales tensor `scale_shape`, or none when empty.
std::string fp8_q_model(std::vector<int64_t> block = {16, 32},
                        std::vector<int64_t> scale_shape = {4, 2}) {
  const std::string dir = fresh_model("qwen3_moe", DType::kF32);
  edit_config(dir, [&](json& j) {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"weight_block_size", block},
                                {"activation_scheme", "dynamic"}};
  });
  edit_tensors(dir, [&](std::vector<TensorData>& ts) {
    for (TensorData& t : ts) {
      if (t.name != kQ) continue;
      t.dtype = DType::kF8E4M3;
      t.bytes.resize(64 * 64);
      for (int64_t i = 0; i < 64 * 64; ++i) t.bytes[i] = code_at(i);
    }
    if (scale_shape.empty()) return;
    const int64_t n = scale_shape[0] * scale_shape[1];
    TensorData s{std::string(kQ) + "_scale_inv", DType::kF32, scale_shape,
                 std::vector<uint8_t>(static_cast<size_t>(4 * n))};
    for (int64_t b = 0; b < n; ++b) {
      const float v = std::ldexp(1.0f, static_cast<int>(b) - 5);
      std::memcpy(s.bytes.data() + 4 * b, &v, 4);
    }
    ts.push_back(s);
  });
  return dir;
}

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading " << dir << " should fail";
  return "";
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

TEST(Fp8ConfigTest, ReadsQuantizationConfig) {
  json j = preset_config("deepseek_v3", "tiny");
  j["quantization_config"] = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"weight_block_size", {128, 64}},
                              {"activation_scheme", "dynamic"},
                              {"modules_to_not_convert", {"lm_head", "model.layers.0.mlp.gate"}}};
  const ModelConfig c = parse_config(j, "config.json");
  EXPECT_TRUE(c.fp8.enabled);
  EXPECT_EQ(c.fp8.block_rows, 128);
  EXPECT_EQ(c.fp8.block_cols, 64);
  EXPECT_EQ(c.fp8.modules_to_not_convert,
            (std::vector<std::string>{"lm_head", "model.layers.0.mlp.gate"}));
  EXPECT_FALSE(parse_config(preset_config("deepseek_v3", "tiny"), "config.json").fp8.enabled);
}

TEST(Fp8ConfigTest, RefusesWhatItCannotRead) {
  const std::pair<json, std::string> bad[] = {
      {{{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}}, "'fmt'"},
      {{{"quant_method", "gptq"}, {"weight_block_size", {128, 128}}}, "'quant_method'"},
      {{{"quant_method", "fp8"}}, "'weight_block_size'"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {128, 100}}}, "'weight_block_size'"},
      {{{"quant_method", "fp8"},
        {"weight_block_size", {128, 128}},
        {"activation_scheme", "static"}},
       "'activation_scheme'"},
  };
  for (const auto& [q, field] : bad) {
    json j = preset_config("qwen3_moe", "tiny");
    j["quantization_config"] = q;
    try {
      parse_config(j, "dir/config.json");
      ADD_FAILURE() << q.dump() << " accepted";
    } catch (const Error& e) {
      expect_has(e.what(), "dir/config.json");
      expect_has(e.what(), "quantization_config");
      expect_has(e.what(), field);
    }
  }
}

// The codes are handed out as stored (a copy of the file's bytes, one per weight) and each weight
// is its code's value times its block's scale, exactly.
TEST(Fp8LoaderTest, KnownBlockScalesDequantizeExactly) {
  const std::string dir = fp8_q_model();
  const ModelConfig config = load_config(dir);
  SourceOptions opt;
  opt.fp8 = config.fp8;
  CheckpointSource src(dir, opt);
  const Matrix m = src.matrix(kQ, 64, 64, Layout::kPanels);
  ASSERT_EQ(m.dtype, DType::kF8E4M3);
  EXPECT_EQ(m.panels, nullptr);
  EXPECT_EQ(src.bytes_by_name().at(kQ), 64u * 64u);
  std::vector<float> w(64 * 64);
  dequantize_fp8(m, w.data());
  for (int64_t r = 0; r < 64; ++r) {
    for (int64_t c = 0; c < 64; ++c) {
      EXPECT_EQ(static_cast<const uint8_t*>(m.data)[r * 64 + c], code_at(r * 64 + c));
      const float want = e4m3_to_f32(code_at(r * 64 + c)) *
                         std::ldexp(1.0f, static_cast<int>(r / 16 * 2 + c / 32) - 5);
      ASSERT_EQ(w[r * 64 + c], want) << r << ", " << c;
    }
  }
  // The whole model loads and runs with the fp8 q_proj among f32 weights.
  auto model = Model::load(dir);
  ThreadPool pool(1);
  Generator gen(*model, pool);
  GenerateRequest req;
  req.prompt = {1, 2, 3};
  req.max_tokens = 2;
  EXPECT_EQ(gen.generate({req})[0].tokens.size(), 2u);
}

// An fp8 checkpoint's MLA kv_b is split by head at load, in fp8 (mla_split_kv_b_fp8): every
// weight as the file's code and block scale give it, the same bytes of codes, and one copy however
// often it is asked for. A `tiny` deepseek_v3's heads (16 + 16 rows) take 16-column blocks of k_b.
TEST(Fp8LoaderTest, MlaKvBIsSplitByHeadInFp8) {
  const std::string dir = fresh_model("deepseek_v3", DType::kF8E4M3);
  const ModelConfig c = load_config(dir);
  const MlaHeads heads{c.n_head, c.qk_head_dim(), c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank};
  const int64_t kv_rows = heads.nope + heads.v_dim;
  SourceOptions opt;
  opt.fp8 = c.fp8;
  CheckpointSource src(dir, opt);
  const std::string name = "model.layers.0.self_attn.kv_b_proj.weight";
  const MlaKvB w = src.mla_kv_b(name, heads);
  ASSERT_TRUE(w.split());
  EXPECT_EQ(w.k_b.dtype, DType::kF8E4M3);
  EXPECT_EQ(w.v_b.dtype, DType::kF8E4M3);
  EXPECT_EQ(w.k_b.f8.block_cols, 16);
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  const TensorView& t = set.get(name);
  const TensorView& s = set.get(name + "_scale_inv");
  std::vector<float> scales(static_cast<size_t>(s.numel()));
  std::memcpy(scales.data(), s.data, scales.size() * 4);
  Matrix stored{DType::kF8E4M3, t.dim(0), t.dim(1), t.data};
  stored.f8 = {scales.data(), 128, 128, 0};
  for (int64_t h = 0; h < heads.n_head; ++h) {
    for (int64_t l = 0; l < heads.rank; ++l) {
      for (int64_t r = 0; r < heads.nope; ++r)
        ASSERT_EQ(fp8_weight(w.k_b, h * heads.rank + l, r), fp8_weight(stored, h * kv_rows + r, l));
      for (int64_t r = 0; r < heads.v_dim; ++r)
        ASSERT_EQ(fp8_weight(w.v_b, h * heads.v_dim + r, l),
                  fp8_weight(stored, h * kv_rows + heads.nope + r, l));
    }
  }
  EXPECT_EQ(src.bytes_by_name().at(name), t.nbytes());
  const MlaKvB again = src.mla_kv_b(name, heads);
  EXPECT_EQ(again.k_b.data, w.k_b.data);
  EXPECT_EQ(again.v_b.data, w.v_b.data);
}

TEST(Fp8LoaderTest, MissingScalesAreRefusedByName) {
  const std::string msg = load_error(fp8_q_model({16, 32}, {}));
  expect_has(msg, "model.safetensors: tensor '" + std::string(kQ) + "'");
  expect_has(msg, std::string(kQ) + "_scale_inv' are missing");
}

TEST(Fp8LoaderTest, MisshapedScalesAreRefusedByName) {
  const std::string msg = load_error(fp8_q_model({16, 32}, {4, 3}));
  expect_has(msg, "tensor '" + std::string(kQ) + "_scale_inv'");
  expect_has(msg, "expected shape [4, 2]");
  expect_has(msg, "found [4, 3]");
}

// Scales for 32 × 32 blocks where the config says 16 × 32.
TEST(Fp8LoaderTest, ABlockSizeOtherThanTheConfigsIsRefused) {
  const std::string msg = load_error(fp8_q_model({16, 32}, {2, 2}));
  expect_has(msg, "tensor '" + std::string(kQ) + "_scale_inv'");
  expect_has(msg, "[16, 32] block");
  expect_has(msg, "weight_block_size");
}

TEST(Fp8LoaderTest, Fp8TensorWithoutFp8ConfigIsRefused) {
  const std::string dir = fp8_q_model();
  edit_config(dir, [](json& j) { j.erase("quantization_config"); });
  const std::string msg = load_error(dir);
  expect_has(msg, "tensor '" + std::string(kQ) + "'");
  expect_has(msg, "no fp8 quantization_config");
}

TEST(Fp8LoaderTest, UnknownFmtIsRefused) {
  const std::string dir = fp8_q_model();
  edit_config(dir, [](json& j) { j["quantization_config"]["fmt"] = "e5m2"; });
  const std::string msg = load_error(dir);
  expect_has(msg, dir + "/config.json");
  expect_has(msg, "'fmt'");
}

TEST(Fp8LoaderTest, Fp8ModuleListedNotToConvertIsRefused) {
  const std::string dir = fp8_q_model();
  edit_config(dir, [](json& j) {
    j["quantization_config"]["modules_to_not_convert"] = {"model.layers.0.self_attn.q_proj"};
  });
  const std::string msg = load_error(dir);
  expect_has(msg, "tensor '" + std::string(kQ) + "'");
  expect_has(msg, "modules_to_not_convert");
}

// make-model --dtype fp8 stores the projections as E4M3 with amax / 448 block scales and keeps
// in bf16 what DeepSeek-V3 keeps so.
TEST(Fp8MakeModelTest, WritesProjectionsInFp8AndTheRestInBf16) {
  const std::string dir = fresh_model("deepseek_v3", DType::kF8E4M3);
  const json cfg = json::parse(test::read_file(dir + "/config.json"));
  EXPECT_EQ(cfg.at("quantization_config"), fp8_quantization_config());
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  int n_fp8 = 0;
  for (const std::string& name : set.names()) {
    const TensorView& t = set.get(name);
    if (name.ends_with("_scale_inv")) {
      EXPECT_EQ(t.dtype, DType::kF32) << name;
      continue;
    }
    const bool fp8 = fp8_quantized_name(name) && t.shape.size() == 2;
    EXPECT_EQ(t.dtype, fp8 ? DType::kF8E4M3 : DType::kBF16) << name;
    n_fp8 += fp8;
    if (!fp8) continue;
    const TensorView& s = set.get(name + "_scale_inv");
    EXPECT_EQ(s.shape, (std::vector<int64_t>{(t.dim(0) + 127) / 128, (t.dim(1) + 127) / 128}));
    // Each block's largest code is ±448 (its amax maps to 448) unless the block is zero.
    const auto* codes = static_cast<const uint8_t*>(t.data);
    uint8_t largest = 0;
    for (int64_t i = 0; i < std::min<int64_t>(t.dim(0), 128) * t.dim(1); ++i)
      largest = std::max<uint8_t>(largest, codes[i] & 0x7f);
    EXPECT_EQ(largest, 0x7e) << name;
  }
  EXPECT_GT(n_fp8, 10);
  for (const char* kept :
       {"model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight"}) {
    EXPECT_EQ(set.get(kept).dtype, DType::kBF16) << kept;
  }
  EXPECT_EQ(set.get("model.layers.0.self_attn.kv_b_proj.weight").dtype, DType::kF8E4M3);
}

// quantize_fp8_blocks: scale = amax / 448 per block, codes nearest to w / scale; zero blocks 0.
TEST(Fp8MakeModelTest, BlockQuantizationUsesAmaxOver448) {
  std::vector<float> w(20 * 40);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * i) * (1 + i % 7);
  for (int64_t r = 16; r < 20; ++r)
    for (int64_t c = 32; c < 40; ++c) w[r * 40 + c] = 0.0f;
  std::vector<uint8_t> codes(w.size());
  std::vector<float> s(2 * 2);
  quantize_fp8_blocks(w.data(), 20, 40, 16, 32, codes.data(), s.data());
  for (int64_t b = 0; b < 4; ++b) {
    const int64_t br = b / 2, bc = b % 2;
    float amax = 0;
    for (int64_t r = br * 16; r < std::min<int64_t>(20, br * 16 + 16); ++r)
      for (int64_t c = bc * 32; c < std::min<int64_t>(40, bc * 32 + 32); ++c)
        amax = std::max(amax, std::fabs(w[r * 40 + c]));
    EXPECT_EQ(s[b], amax / 448.0f) << b;
    for (int64_t r = br * 16; r < std::min<int64_t>(20, br * 16 + 16); ++r)
      for (int64_t c = bc * 32; c < std::min<int64_t>(40, bc * 32 + 32); ++c)
        EXPECT_EQ(codes[r * 40 + c], s[b] > 0 ? f32_to_e4m3(w[r * 40 + c] / s[b]) : 0);
  }
  EXPECT_EQ(s[3], 0.0f);
}

// The fp8 checkpoint at fp8_dir with each block scale rounded to the nearest power of two (zero
// kept), so that every weight it stands for, a code's value times a power of two, is a bf16.
std::string pow2_scales_copy(const std::string& fp8_dir) {
  const std::string dir = test::make_temp_dir("duet-fp8-pow2-");
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    test::write_file(dir + "/" + f, test::read_file(fp8_dir + "/" + f));
  }
  const SafetensorsSet set = SafetensorsSet::open_dir(fp8_dir);
  std::vector<TensorData> out;
  for (const std::string& name : set.names()) {
    const TensorView& t = set.get(name);
    const auto* p = static_cast<const uint8_t*>(t.data);
    TensorData d{name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes())};
    if (name.ends_with("_scale_inv")) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      std::memcpy(v.data(), p, d.bytes.size());
      for (float& f : v) f = f > 0 ? std::exp2(std::round(std::log2(f))) : f;
      std::memcpy(d.bytes.data(), v.data(), d.bytes.size());
    }
    out.push_back(std::move(d));
  }
  write_safetensors_dir(dir, out, 512ull << 20);
  return dir;
}

// The same model with the fp8 checkpoint's weights dequantized to dtype (f32, or bf16 when its
// scales are powers of two: pow2_scales_copy), exactly, and its bf16 ones as they are, so the
// output head, the routers and the KV cache's dtype, which follows the head, are the same.
std::string dequantized_copy(const std::string& fp8_dir, DType dtype) {
  const std::string dir = test::make_temp_dir("duet-fp8-deq-");
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    test::write_file(dir + "/" + f, test::read_file(fp8_dir + "/" + f));
  }
  edit_config(dir, [](json& j) { j.erase("quantization_config"); });
  const SafetensorsSet set = SafetensorsSet::open_dir(fp8_dir);
  std::vector<TensorData> out;
  for (const std::string& name : set.names()) {
    if (name.ends_with("_scale_inv")) continue;
    const TensorView& t = set.get(name);
    const auto* p = static_cast<const uint8_t*>(t.data);
    if (t.dtype != DType::kF8E4M3) {
      out.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes())});
      continue;
    }
    std::vector<float> v(static_cast<size_t>(t.numel()));
    {
      const TensorView& s = set.get(name + "_scale_inv");
      std::vector<float> scales(static_cast<size_t>(s.numel()));
      std::memcpy(scales.data(), s.data, scales.size() * 4);
      Matrix m{DType::kF8E4M3, t.dim(0), t.dim(1), t.data};
      m.f8 = {scales.data(), 128, 128, 0};
      dequantize_fp8(m, v.data());
    }
    if (dtype == DType::kF32) {
      TensorData d{name, DType::kF32, t.shape, std::vector<uint8_t>(v.size() * 4)};
      std::memcpy(d.bytes.data(), v.data(), d.bytes.size());
      out.push_back(std::move(d));
      continue;
    }
    std::vector<uint16_t> b(v.size());
    for (size_t k = 0; k < v.size(); ++k) {
      b[k] = f32_to_bf16(v[k]);
      EXPECT_EQ(bf16_to_f32(b[k]), v[k]) << name << " at " << k << ": not a bf16";
    }
    TensorData d{name, DType::kBF16, t.shape, std::vector<uint8_t>(b.size() * 2)};
    std::memcpy(d.bytes.data(), b.data(), d.bytes.size());
    out.push_back(std::move(d));
  }
  write_safetensors_dir(dir, out, 512ull << 20);
  return dir;
}

std::vector<GenerateResult> greedy(const std::string& dir) {
  auto model = Model::load(dir);
  ThreadPool pool(2);
  Generator gen(*model, pool);
  std::vector<GenerateRequest> reqs;
  for (std::vector<int32_t> prompt : {std::vector<int32_t>{1, 2, 3, 4, 5},
                                      std::vector<int32_t>{7, 300, 11, 42, 8, 9, 100, 3, 55}}) {
    GenerateRequest r;
    r.prompt = prompt;
    r.max_tokens = 8;
    r.prompt_logits = true;
    reqs.push_back(r);
  }
  return gen.generate(reqs);
}

// Generation from the codes in place gives the greedy tokens of the dequantized model, and logits
// within 1e-5 of the largest (the products differ only in f32 summation order), on every
// instruction set. Where the fp8 products round x to bf16 (AVX-512 BF16 and its emulation, as
// the bf16 ones do there), the dequantized weights are bf16, so that their products round it
// too: the checkpoint's scales are made powers of two for that. Elsewhere they are f32. By default
// on Intel's CPUs with AVX-512 BF16 bf16 weights multiply by f32 FMAs while fp8 ones keep the
// pairs (simd::bf16_isa): there the two models' numerics differ by x's rounding, and the runs on
// one named instruction set (numerics_avx512bf16, its emulation, numerics_avx512) compare them.
class Fp8GenerateTest : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8GenerateTest, SameGreedyTokensAsTheDequantizedModel) {
  const bool rounds = matmul_impl::rounds_x(simd::best_isa(), DType::kF8E4M3);
  if (rounds && !matmul_impl::rounds_x(matmul_impl::isa_for(DType::kBF16), DType::kBF16)) {
    GTEST_SKIP() << "fp8 weights on " << simd::isa_name(simd::best_isa()) << ", bf16 ones on "
                 << simd::isa_name(matmul_impl::isa_for(DType::kBF16))
                 << ": compared in the numerics_* runs";
  }
  std::string fp8 = fresh_model(GetParam(), DType::kF8E4M3);
  if (rounds) fp8 = pow2_scales_copy(fp8);
  const std::string deq = dequantized_copy(fp8, rounds ? DType::kBF16 : DType::kF32);
  if (HasFatalFailure()) return;
  const std::vector<GenerateResult> a = greedy(fp8), b = greedy(deq);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    ASSERT_EQ(a[i].prompt_logits.size(), b[i].prompt_logits.size());
    float largest = 0;
    for (float v : b[i].prompt_logits) largest = std::max(largest, std::fabs(v));
    for (size_t k = 0; k < a[i].prompt_logits.size(); ++k)
      ASSERT_NEAR(a[i].prompt_logits[k], b[i].prompt_logits[k], 1e-5f * largest) << k;
  }
}

// --quantization int8 on an fp8 checkpoint quantizes its bf16 matrices and leaves the fp8 ones
// (one byte each already) as they are: it loads and generates (it used to refuse the fp8 ones).
TEST(Fp8GenerateInt8Test, Int8LeavesTheFp8WeightsAlone) {
  const std::string fp8 = fresh_model("qwen3_moe", DType::kF8E4M3);
  LoadOptions opt;
  opt.quantization = Quantization::kInt8;
  std::unique_ptr<Model> model = Model::load(fp8, opt);
  ThreadPool pool(2);
  GenerateRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  r.max_tokens = 4;
  const std::vector<GenerateResult> got = Generator(*model, pool).generate({r});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tokens.size(), 4u);
}

// --quantization int4 (and int4_pure) on an fp8 checkpoint quantizes its fp8 weights too, each
// weight's value (code × block scale) as the f32 weight of the dequantized copy is quantized: the
// same quantized matrices, MLA's kv_b split by head among them, so the same greedy tokens and
// prompt logits, bit for bit, as that copy under the same quantization; the report counts the same
// matrices and bytes after, and the fp8 ones' bytes before as their codes.
TEST(Fp8GenerateInt4Test, FourBitsQuantizeTheFp8WeightsAsTheirValues) {
  for (const char* arch : {"qwen3_moe", "deepseek_v3"}) {
    const std::string fp8 = fresh_model(arch, DType::kF8E4M3);
    const std::string deq = dequantized_copy(fp8, DType::kF32);
    if (HasFatalFailure()) return;
    for (Quantization q : {Quantization::kInt4, Quantization::kInt4Pure}) {
      LoadOptions opt;
      opt.quantization = q;
      std::unique_ptr<Model> a = Model::load(fp8, opt), b = Model::load(deq, opt);
      EXPECT_EQ(a->quantization().n_matrices, b->quantization().n_matrices) << arch;
      EXPECT_EQ(a->quantization().bytes_after, b->quantization().bytes_after) << arch;
      EXPECT_LT(a->quantization().bytes_before, b->quantization().bytes_before) << arch;
      test::expect_same_generation(*a, *b, std::string(arch) + " " + quantization_name(q));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, Fp8GenerateTest,
                         ::testing::Values("qwen3_moe", "deepseek_v3", "mixtral"));

}  // namespace
}  // namespace duet
