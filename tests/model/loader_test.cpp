// Loading a model directory: every kind of bad input gives one clear duet::Error naming the
// file, the tensor or the field; good variants (sharded, f16) load.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generator.h"
#include "kernels/matmul.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace duet {
namespace {

using json = nlohmann::json;

std::string fresh_model(const std::string& arch, uint64_t max_shard = 512ull << 20) {
  MakeModelOptions opt;
  opt.dir = test::make_temp_dir("duet-load-");
  opt.arch = arch;
  opt.dtype = DType::kF32;
  opt.seed = 5;
  opt.max_shard_bytes = max_shard;
  make_model(opt);
  return opt.dir;
}

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "loading " << dir << " should fail";
  return "";
}

void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
  json j = json::parse(test::read_file(dir + "/config.json"));
  edit(j);
  test::write_file(dir + "/config.json", j.dump());
}

// Rewrites model.safetensors through `edit` on the list of its tensors.
void edit_tensors(const std::string& dir, const std::function<void(std::vector<TensorData>&)>& edit) {
  std::vector<TensorData> ts;
  {
    auto f = SafetensorsFile::open(dir + "/model.safetensors");
    for (const auto& [name, view] : f->tensors()) {
      TensorData t{name, view.dtype, view.shape, {}};
      const auto* p = static_cast<const uint8_t*>(view.data);
      t.bytes.assign(p, p + view.nbytes());
      ts.push_back(std::move(t));
    }
  }
  edit(ts);
  std::vector<const TensorData*> ptrs;
  for (const auto& t : ts) ptrs.push_back(&t);
  write_safetensors(dir + "/model.safetensors", ptrs);
}

TEST(LoaderTest, MissingDirectoryNamesConfig) {
  EXPECT_NE(load_error("/nonexistent/model").find("/nonexistent/model/config.json"),
            std::string::npos);
}

TEST(LoaderTest, UnknownArchitectureIsRefusedByName) {
  const std::string dir = fresh_model("qwen3_moe");
  edit_config(dir, [](json& j) { j["model_type"] = "llama"; });
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find("model_type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'llama'"), std::string::npos) << msg;
}

struct BadField {
  const char* arch;
  const char* key;
  const char* value;  // JSON
};

class UnsupportedFieldTest : public ::testing::TestWithParam<BadField> {};

TEST_P(UnsupportedFieldTest, IsRefusedByName) {
  const BadField& b = GetParam();
  const std::string dir = fresh_model(b.arch);
  edit_config(dir, [&](json& j) { j[b.key] = json::parse(b.value); });
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find(dir + "/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::string("'") + b.key + "'"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, UnsupportedFieldTest,
    ::testing::Values(BadField{"qwen3_moe", "hidden_act", "\"gelu\""},
                      BadField{"qwen3_moe", "attention_bias", "true"},
                      BadField{"qwen3_moe", "use_sliding_window", "true"},
                      BadField{"qwen3_moe", "rope_scaling",
                               "{\"type\": \"dynamic\", \"factor\": 2}"},
                      BadField{"qwen3_moe", "quantization_config", "{\"quant_method\": \"awq\"}"},
                      BadField{"qwen3_moe", "num_experts_per_tok", "99"},
                      BadField{"qwen3_moe", "hidden_size", "\"64\""},
                      BadField{"qwen3_moe", "num_key_value_heads", "3"},
                      // Found by fuzz_config: a float beyond int64 made the conversion undefined.
                      BadField{"qwen3_moe", "num_hidden_layers", "1.3e68"},
                      BadField{"qwen3_moe", "vocab_size", "18446744073709551615"},
                      BadField{"qwen3_moe", "eos_token_id", "[2, 4294967296]"},
                      BadField{"deepseek_v2", "topk_method", "\"noaux_tc\""},
                      BadField{"deepseek_v2", "scoring_func", "\"sigmoid\""},
                      BadField{"deepseek_v3", "topk_method", "\"group_limited_greedy\""},
                      BadField{"deepseek_v3", "scoring_func", "\"softmax\""},
                      BadField{"deepseek_v3", "n_group", "8"},
                      BadField{"deepseek_v3", "num_nextn_predict_layers", "-1"},
                      BadField{"mixtral", "sliding_window", "4096"}),
    [](const ::testing::TestParamInfo<BadField>& info) {
      return std::string(info.param.arch) + "_" + info.param.key;
    });

TEST(LoaderTest, GroupLimitedNeedsDivisibleGroups) {
  const std::string dir = fresh_model("deepseek_v2");
  edit_config(dir, [](json& j) {
    j["topk_method"] = "group_limited_greedy";
    j["n_group"] = 3;
  });
  EXPECT_NE(load_error(dir).find("'n_group'"), std::string::npos);
}

// DeepSeek-V3's correction bias is a tensor of its own, named when missing; its
// multi-token-prediction layer's tensors (written by make-model past the last layer) are never
// read.
TEST(LoaderTest, DeepseekV3NeedsItsBiasAndSkipsTheMtpLayer) {
  const std::string dir = fresh_model("deepseek_v3");
  std::unique_ptr<Model> m = Model::load(dir);
  EXPECT_EQ(m->config().arch, Arch::kDeepseekV3);
  EXPECT_EQ(m->config().n_nextn_layers, 1);
  const std::string victim = "model.layers.2.mlp.gate.e_score_correction_bias";
  edit_tensors(dir, [&](std::vector<TensorData>& ts) {
    std::erase_if(ts, [&](const TensorData& t) { return t.name == victim; });
  });
  EXPECT_NE(load_error(dir).find(victim), std::string::npos) << load_error(dir);
}

TEST(LoaderTest, MissingTensorIsNamed) {
  const std::string dir = fresh_model("qwen3_moe");
  const std::string victim = "model.layers.1.mlp.experts.3.up_proj.weight";
  edit_tensors(dir, [&](std::vector<TensorData>& ts) {
    std::erase_if(ts, [&](const TensorData& t) { return t.name == victim; });
  });
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find("missing tensor '" + victim + "'"), std::string::npos) << msg;
}

TEST(LoaderTest, WrongShapeNamesFileTensorAndShapes) {
  const std::string dir = fresh_model("mixtral");
  const std::string victim = "model.layers.0.self_attn.q_proj.weight";
  edit_tensors(dir, [&](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == victim) t.shape = {t.shape[0] / 2, t.shape[1] * 2};
  });
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find(dir + "/model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find(victim), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected shape [64, 64], found [32, 128]"), std::string::npos) << msg;
}

TEST(LoaderTest, UnsupportedDtypeIsNamed) {
  const std::string dir = fresh_model("qwen3_moe");
  // Hand-made file: one tensor declared I64.
  json header = {{"model.embed_tokens.weight",
                  {{"dtype", "I64"}, {"shape", {512, 64}}, {"data_offsets", {0, 512 * 64 * 8}}}}};
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::string bytes(8, '\0');
  uint64_t n = h.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += h + std::string(512 * 64 * 8, '\0');
  test::write_file(dir + "/model.safetensors", bytes);
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find("model.embed_tokens.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I64"), std::string::npos) << msg;
}

TEST(LoaderTest, TruncatedFileIsReported) {
  const std::string dir = fresh_model("deepseek_v2");
  const std::string path = dir + "/model.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(LoaderTest, HeaderThatLiesAboutOffsetsIsReported) {
  const std::string dir = fresh_model("qwen3_moe");
  const std::string path = dir + "/model.safetensors";
  std::string bytes = test::read_file(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  header["model.norm.weight"]["data_offsets"][1] =
      header["model.norm.weight"]["data_offsets"][1].get<int64_t>() + 4;
  std::string h = header.dump();
  while (h.size() < n) h += ' ';
  ASSERT_EQ(h.size(), n);
  test::write_file(path, bytes.substr(0, 8) + h + bytes.substr(8 + n));
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
}

// A sharded checkpoint and an f16 one load and compute the same logits as the original.
TEST(LoaderTest, ShardedAndF16CheckpointsLoad) {
  const std::string single = fresh_model("qwen3_moe");
  const std::string sharded = fresh_model("qwen3_moe", 64 << 10);
  ASSERT_TRUE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  ASSERT_FALSE(std::filesystem::exists(sharded + "/model.safetensors"));
  const std::string f16 = fresh_model("qwen3_moe");
  edit_tensors(f16, [](std::vector<TensorData>& ts) {
    for (auto& t : ts) {
      std::vector<uint8_t> out(t.bytes.size() / 2);
      for (size_t i = 0; i < t.bytes.size() / 4; ++i) {
        float v;
        std::memcpy(&v, &t.bytes[4 * i], 4);
        _Float16 h = static_cast<_Float16>(v);
        std::memcpy(&out[2 * i], &h, 2);
      }
      t.bytes = std::move(out);
      t.dtype = DType::kF16;
    }
  });
  ThreadPool pool(1);
  std::vector<std::vector<int32_t>> outs;
  for (const std::string& dir : {single, sharded, f16}) {
    auto model = Model::load(dir);
    Generator gen(*model, pool);
    GenerateRequest r;
    r.prompt = {1, 2, 3, 4, 5};
    r.max_tokens = 3;
    r.prompt_logits = true;
    auto res = gen.generate({r})[0];
    outs.push_back({res.tokens});
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

// Layout::kPanels gives a matrix its panels (pack_panels of its rows) where matmul reads them,
// once per name; as stored, or with repack off, there are none. An f16 checkpoint's matrix is
// widened to f32 first and packed as f32. The packed bytes count in bytes_used.
TEST(LoaderTest, PanelsArePackedOncePerNameWhereMatmulReadsThem) {
  const std::string dir = fresh_model("qwen3_moe");
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  const TensorView& t = set.get(name);
  const int64_t rows = t.dim(0), cols = t.dim(1);
  {
    CheckpointSource src(dir);
    EXPECT_EQ(src.matrix(name, rows, cols).panels, nullptr);
    const uint64_t before = src.bytes_used();
    const Matrix m = src.matrix(name, rows, cols, Layout::kPanels);
    ASSERT_EQ(m.panels != nullptr, matmul_reads_panels(DType::kF32));
    if (m.panels) {
      std::vector<float> want(static_cast<size_t>(panel_elems(m)));
      pack_panels(m, want.data());
      EXPECT_EQ(std::memcmp(m.panels, want.data(), want.size() * 4), 0);
      EXPECT_EQ(src.matrix(name, rows, cols, Layout::kPanels).panels, m.panels);
      EXPECT_EQ(src.packed_bytes(), want.size() * 4);
      EXPECT_EQ(src.bytes_used(), before + want.size() * 4);
    }
  }
  {
    SourceOptions as_stored;
    as_stored.repack = false;
    CheckpointSource src(dir, as_stored);
    EXPECT_EQ(src.matrix(name, rows, cols, Layout::kPanels).panels, nullptr);
    EXPECT_EQ(src.packed_bytes(), 0u);
  }
  edit_tensors(dir, [&](std::vector<TensorData>& ts) {
    for (auto& td : ts) {
      if (td.name != name) continue;
      std::vector<uint8_t> out(td.bytes.size() / 2);
      for (size_t i = 0; i < td.bytes.size() / 4; ++i) {
        float v;
        std::memcpy(&v, &td.bytes[4 * i], 4);
        const _Float16 h = static_cast<_Float16>(v);
        std::memcpy(&out[2 * i], &h, 2);
      }
      td.bytes = std::move(out);
      td.dtype = DType::kF16;
    }
  });
  CheckpointSource src(dir);
  const Matrix m = src.matrix(name, rows, cols, Layout::kPanels);
  EXPECT_EQ(m.dtype, DType::kF32);
  if (matmul_reads_panels(DType::kF32)) {
    ASSERT_NE(m.panels, nullptr);
    std::vector<float> want(static_cast<size_t>(panel_elems(m)));
    pack_panels(m, want.data());
    EXPECT_EQ(std::memcmp(m.panels, want.data(), want.size() * 4), 0);
    EXPECT_EQ(src.matrix(name, rows, cols).data, m.data);  // converted once
  }
}

// The path of the file mapped at p in this process ("" for anonymous memory), from
// /proc/self/maps.
std::string mapping_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%zx-%zx", &begin, &end) != 2 || a < begin || a >= end) continue;
    const size_t path = line.find('/');
    return path == std::string::npos ? "" : line.substr(path);
  }
  ADD_FAILURE() << "no mapping holds " << p;
  return "";
}

// A matrix is copied out of the file's mapping when first asked for (the same bytes, the same
// copy when asked again, a tied output head included), unless SourceOptions::mmap keeps it in
// the mapping.
TEST(LoaderTest, MatricesAreCopiedOutOfTheFileUnlessMmap) {
  const std::string dir = fresh_model("qwen3_moe");
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  for (const std::string name :
       {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.experts.2.up_proj.weight",
        "model.embed_tokens.weight"}) {
    SCOPED_TRACE(name);
    const TensorView& t = set.get(name);
    const int64_t rows = t.dim(0), cols = t.dim(1);
    {
      CheckpointSource src(dir);
      const Matrix m = src.matrix(name, rows, cols);
      EXPECT_EQ(mapping_of(m.data), "");
      ASSERT_EQ(m.nbytes(), t.nbytes());
      EXPECT_EQ(std::memcmp(m.data, t.data, t.nbytes()), 0);
      const Matrix again = src.matrix(name, rows, cols, Layout::kPanels);
      EXPECT_EQ(again.data, m.data);
      EXPECT_EQ(src.bytes_by_name().at(name), t.nbytes());
    }
    SourceOptions in_file;
    in_file.mmap = true;
    CheckpointSource src(dir, in_file);
    const Matrix m = src.matrix(name, rows, cols);
    EXPECT_TRUE(mapping_of(m.data).ends_with("/model.safetensors")) << mapping_of(m.data);
    EXPECT_EQ(std::memcmp(m.data, t.data, t.nbytes()), 0);
  }
  // Both load and decode alike.
  auto copied = Model::load(dir);
  LoadOptions lo;
  lo.mmap = true;
  auto mapped = Model::load(dir, lo);
  ThreadPool pool(2);
  GenerateRequest req;
  req.prompt = {1, 2, 3, 4, 5};
  req.max_tokens = 6;
  Generator a(*copied, pool), b(*mapped, pool);
  EXPECT_EQ(a.generate({req})[0].tokens, b.generate({req})[0].tokens);
}

}  // namespace
}  // namespace duet
