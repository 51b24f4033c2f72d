// compressed-tensors int4 checkpoints (Kimi K2 Thinking's layout): config parsing, the packed
// weights read into duet's int4 matrices value for value, refusals by name, and generation equal
// to the dequantized model's under the same quantization.
#include "model/int4_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "error_of.h"
#include "kernels/quantize.h"
#include "model/config.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/test_checkpoint.h"
#include "model/weight_source.h"
#include "test_util.h"

namespace duet {
namespace {

using json = nlohmann::json;

std::string int4_model(const std::string& arch) {
  MakeModelOptions opt;
  opt.dir = test::make_temp_dir("duet-int4-");
  opt.arch = arch;
  opt.dtype = DType::kQ4;
  opt.seed = 7;
  make_model(opt);
  return opt.dir;
}

using test::error_of;

using test::read_tensors;

// A copy of `dir` with `edit` applied to its tensors (and config.json by `edit_config`).
std::string edited_copy(const std::string& dir, const std::function<void(std::vector<TensorData>&)>& edit,
                        const std::function<void(json&)>& edit_config = nullptr) {
  const std::string out = test::make_temp_dir("duet-int4-edit-");
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "tiktoken.model"}) {
    if (std::filesystem::exists(dir + "/" + f))
      test::write_file(out + "/" + f, test::read_file(dir + "/" + f));
  }
  if (edit_config) {
    json j = json::parse(test::read_file(out + "/config.json"));
    edit_config(j);
    test::write_file(out + "/config.json", j.dump());
  }
  std::vector<TensorData> ts = read_tensors(dir);
  edit(ts);
  write_safetensors_dir(out, ts, 512ull << 20);
  return out;
}

// The value (q, d) of weight (r, k) of the packed weight `name` in `ts`, read independently of the
// loader: word k / 8 of row r, bits 4 (k % 8) up, minus 8; the bf16 scale of its group of 32.
std::pair<int, float> packed_value(const std::vector<TensorData>& ts, const std::string& name,
                                   int64_t r, int64_t k) {
  const TensorData *p = nullptr, *s = nullptr;
  for (const TensorData& t : ts) {
    if (t.name == name + "_packed") p = &t;
    if (t.name == name + "_scale") s = &t;
  }
  uint32_t word;
  std::memcpy(&word, p->bytes.data() + 4 * (r * p->shape[1] + k / 8), 4);
  uint16_t h;
  std::memcpy(&h, s->bytes.data() + 2 * (r * s->shape[1] + k / 32), 2);
  return {int((word >> (4 * (k % 8))) & 15) - 8, bf16_to_f32(h)};
}

TEST(Int4CheckpointTest, ConfigIsReadAndOthersAreRefusedByName) {
  json base = preset_config("kimi_k2", "tiny");
  base["quantization_config"] = int4_quantization_config();
  ModelConfig c = parse_config(base, "config.json");
  EXPECT_TRUE(c.packed_int4.enabled);
  EXPECT_EQ(c.packed_int4.group_size, 32);
  EXPECT_FALSE(c.fp8.enabled);
  auto refused = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j["quantization_config"]);
    return error_of([&] { parse_config(j, "config.json"); });
  };
  auto weights = [](json& q) -> json& { return q["config_groups"]["group_0"]["weights"]; };
  EXPECT_NE(refused([&](json& q) { weights(q)["num_bits"] = 8; })
                .find("field 'config_groups.group_0.weights.num_bits' is 8; duet reads 4-bit"),
            std::string::npos);
  EXPECT_NE(refused([&](json& q) { weights(q)["symmetric"] = false; }).find("no zero point"),
            std::string::npos);
  EXPECT_NE(refused([&](json& q) { weights(q)["group_size"] = 16; })
                .find("group_size' is 16; duet reads groups of a multiple of 32"),
            std::string::npos);
  EXPECT_NE(refused([&](json& q) { weights(q)["strategy"] = "channel"; }).find("group-wise"),
            std::string::npos);
  EXPECT_NE(refused([&](json& q) { q["format"] = "int-quantized"; })
                .find("field 'format' is 'int-quantized'"),
            std::string::npos);
  EXPECT_NE(refused([&](json& q) {
              q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
            }).find("W4A16"),
            std::string::npos);
  EXPECT_NE(refused([&](json& q) { q["quant_method"] = "awq"; }).find("compressed-tensors"),
            std::string::npos);
  json g128 = base;
  weights(g128["quantization_config"])["group_size"] = 128;
  EXPECT_EQ(parse_config(g128, "config.json").packed_int4.group_size, 128);
}

// Every weight of a packed matrix, read through the loader, is the file's scale times its value;
// a group of 128 columns is its scale repeated over four of duet's groups of 32.
TEST(Int4CheckpointTest, PackedWeightsLoadValueForValue) {
  const std::string dir = int4_model("kimi_k2");
  const ModelConfig config = load_config(dir);
  const std::string name = "model.layers.1.mlp.experts.3.gate_proj.weight";
  const int64_t rows = config.n_ff_exp, cols = config.n_embd;  // two groups of 32 a row
  const std::vector<TensorData> ts = read_tensors(dir);
  SourceOptions options;
  options.packed_int4 = config.packed_int4;
  CheckpointSource src(dir, options);
  const Matrix m = src.matrix(name, rows, cols, Layout::kAsStored);
  ASSERT_EQ(m.dtype, DType::kQ4);
  const std::vector<float> got = dequantize_int(m);
  int n_eight = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const auto [q, d] = packed_value(ts, name, r, k);
      ASSERT_EQ(q8_value(m, r, k), q) << r << ", " << k;
      ASSERT_EQ(got[r * cols + k], d * q) << r << ", " << k;
      n_eight += q == -8;
    }
  }
  EXPECT_GT(n_eight, 0);  // the rule puts each group's largest magnitude at -8
  // The same weights under one scale per 64 columns: each of the two groups of 32 takes it.
  const std::string g64 = edited_copy(
      dir,
      [&](std::vector<TensorData>& all) {
        for (TensorData& t : all) {
          if (t.name != name + "_scale") continue;
          std::vector<uint8_t> halved;
          for (int64_t r = 0; r < rows; ++r)  // keep each row's first scale of two
            halved.insert(halved.end(), t.bytes.begin() + 4 * r, t.bytes.begin() + 4 * r + 2);
          t.bytes = halved;
          t.shape = {rows, 1};
        }
      },
      [](json& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64; });
  options.packed_int4 = load_config(g64).packed_int4;
  CheckpointSource src64(g64, options);
  const Matrix m64 = src64.matrix(name, rows, cols, Layout::kAsStored);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      ASSERT_EQ(q8_value(m64, r, k), q8_value(m, r, k));
      ASSERT_EQ(q8_scale(m64, r, k), packed_value(ts, name, r, 0).second) << r << ", " << k;
    }
  }
}

TEST(Int4CheckpointTest, BrokenPackedWeightsAreRefusedByName) {
  const std::string dir = int4_model("qwen3_moe");
  const std::string name = "model.layers.0.mlp.experts.1.gate_proj.weight";
  auto load_error = [](const std::string& d) { return error_of([&] { Model::load(d); }); };
  // No quantization_config: the packed weight is named.
  const std::string no_config =
      edited_copy(dir, [](std::vector<TensorData>&) {}, [](json& j) { j.erase("quantization_config"); });
  EXPECT_NE(load_error(no_config).find("_packed': is a packed int4 weight but config.json has no "
                                       "compressed-tensors quantization_config"),
            std::string::npos);
  auto without = [&](const std::string& tensor) {
    return edited_copy(dir, [&](std::vector<TensorData>& ts) {
      std::erase_if(ts, [&](const TensorData& t) { return t.name == tensor; });
    });
  };
  EXPECT_NE(load_error(without(name + "_scale")).find("its scales '" + name + "_scale' are missing"),
            std::string::npos);
  const std::string bad_shape = edited_copy(dir, [&](std::vector<TensorData>& ts) {
    for (TensorData& t : ts) {
      if (t.name == name + "_packed") {
        t.shape[1] -= 1;
        t.bytes.resize(t.bytes.size() - 4 * t.shape[0]);
      }
    }
  });
  EXPECT_NE(load_error(bad_shape).find("tensor '" + name + "_packed': expected I32 [32, 8]"),
            std::string::npos);
  const std::string bad_dims = edited_copy(dir, [&](std::vector<TensorData>& ts) {
    for (TensorData& t : ts) {
      if (t.name == name + "_shape") t.bytes[0] += 1;
    }
  });
  EXPECT_NE(load_error(bad_dims).find("tensor '" + name + "_shape': expected [32, 64]"),
            std::string::npos);
}

// Under the same --quantization the int4 checkpoint and its dequantized f32 copy hold the same
// int4 matrices (the copy's values requantize to the stored ones), so the same greedy tokens and
// prompt logits, bit for bit; without one the checkpoint generates from its int4 experts.
TEST(Int4CheckpointTest, GeneratesAsItsDequantizedCopyUnderTheSameQuantization) {
  for (const char* arch : {"qwen3_moe", "kimi_k2", "mixtral"}) {
    const std::string dir = int4_model(arch);
    const std::string deq = edited_copy(
        dir,
        [](std::vector<TensorData>& ts) {
          std::vector<TensorData> out;
          for (const TensorData& t : ts) {
            if (t.name.ends_with("_scale") || t.name.ends_with("_shape")) continue;
            if (!t.name.ends_with("_packed")) {
              out.push_back(t);
              continue;
            }
            const std::string name = t.name.substr(0, t.name.size() - 7);
            const int64_t rows = t.shape[0], cols = t.shape[1] * 8;
            TensorData f{name, DType::kF32, {rows, cols}, std::vector<uint8_t>(rows * cols * 4)};
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t k = 0; k < cols; ++k) {
                const auto [q, d] = packed_value(ts, name, r, k);
                const float v = d * float(q);
                std::memcpy(f.bytes.data() + 4 * (r * cols + k), &v, 4);
              }
            }
            out.push_back(std::move(f));
          }
          ts = std::move(out);
        },
        [](json& j) { j.erase("quantization_config"); });
    for (Quantization q : {Quantization::kInt4, Quantization::kInt4Pure}) {
      LoadOptions opt;
      opt.quantization = q;
      std::unique_ptr<Model> a = Model::load(dir, opt), b = Model::load(deq, opt);
      test::expect_same_generation(*a, *b, std::string(arch) + " " + quantization_name(q));
    }
    std::unique_ptr<Model> plain = Model::load(dir);
    const ModelConfig c = load_config(dir);
    int64_t moe_layers = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) moe_layers += c.is_moe_layer(il);
    EXPECT_EQ(plain->quantization().n_stored_int4, moe_layers * c.n_expert * 3) << arch;
    EXPECT_EQ(plain->quantization().n_matrices, 0) << arch;
    ThreadPool pool(2);
    GenerateRequest r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 4;
    EXPECT_EQ(Generator(*plain, pool).generate({r})[0].tokens.size(), 4u) << arch;
  }
}

}  // namespace
}  // namespace duet
