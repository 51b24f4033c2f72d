#include "model/config.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"

namespace duet {

using json = nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kQwen3Moe: return "qwen3_moe";
    case Arch::kDeepseekV2: return "deepseek_v2";
    case Arch::kDeepseekV3: return "deepseek_v3";
    case Arch::kMixtral: return "mixtral";
  }
  return "?";
}

bool ModelConfig::is_moe_layer(int64_t il) const {
  if (n_expert == 0) return false;
  switch (arch) {
    case Arch::kQwen3Moe:
      for (int64_t l : mlp_only_layers)
        if (l == il) return false;
      return (il + 1) % decoder_sparse_step == 0;
    case Arch::kDeepseekV2:
    case Arch::kDeepseekV3:
      return il >= first_k_dense_replace && il % moe_layer_freq == 0;
    case Arch::kMixtral:
      return true;
  }
  return false;
}

int64_t ModelConfig::qk_head_dim() const {
  return is_deepseek(arch) ? qk_nope_head_dim + qk_rope_head_dim : head_dim;
}

namespace {

// Typed access to config.json fields with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  bool key_present(const char* key) const { return j_.contains(key); }

  int64_t integer(const char* key) const {
    if (!j_.contains(key)) fail(key, "is missing");
    return as_integer(j_.at(key), key);
  }
  int64_t integer(const char* key, int64_t dflt) const {
    return has(key) ? as_integer(j_.at(key), key) : dflt;
  }
  double number(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_number()) fail(key, "expected a number, found " + v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "expected true or false, found " + v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, "expected a string, found " + v.dump());
    return v.get<std::string>();
  }
  std::vector<int64_t> int_list(const char* key) const {
    std::vector<int64_t> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    if (!v.is_array()) fail(key, "expected a list of integers, found " + v.dump());
    for (const json& e : v) out.push_back(as_integer(e, key));
    return out;
  }
  // An integer or a list of integers (eos_token_id takes both forms).
  std::vector<int32_t> ids(const char* key) const {
    std::vector<int32_t> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    auto id = [&](const json& e) {
      const int64_t i = as_integer(e, key);
      if (i < -1 || i > INT32_MAX) fail(key, "is not a token id: " + e.dump());
      return static_cast<int32_t>(i);
    };
    if (v.is_array()) {
      for (const json& e : v) out.push_back(id(e));
    } else {
      out.push_back(id(v));
    }
    return out;
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(source_ + ": field '" + key + "' " + what);
  }
  void require(bool ok, const std::string& key, const std::string& what) const {
    if (!ok) fail(key, what);
  }
  void positive(const char* key, int64_t v) const {
    if (v <= 0) fail(key, "must be positive, found " + std::to_string(v));
  }

 private:
  // An integer, or a float with an integral value (128.0), within ±2^53 so that every value
  // converts exactly (found by fuzzing: a float beyond int64's range made the conversion
  // undefined).
  int64_t as_integer(const json& v, const std::string& key) const {
    constexpr double kLimit = 9007199254740992.0;  // 2^53
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(kLimit))
        fail(key, "is out of range: " + v.dump());
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if (i < -static_cast<int64_t>(kLimit)) fail(key, "is out of range: " + v.dump());
      return i;
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!(std::fabs(d) <= kLimit)) fail(key, "is out of range: " + v.dump());
      if (d == std::floor(d)) return static_cast<int64_t>(d);
    }
    fail(key, "expected an integer, found " + v.dump());
  }

  const json& j_;
  const std::string& source_;
};

RopeScaling parse_rope_scaling(const Fields& f, const json& j, const std::string& source) {
  RopeScaling rs;
  if (!f.has("rope_scaling")) return rs;
  const json& r = j.at("rope_scaling");
  if (!r.is_object()) f.fail("rope_scaling", "expected an object, found " + r.dump());
  Fields rf(r, source);
  std::string type = rf.string("rope_type", rf.string("type", ""));
  if (type == "default" || type.empty()) return rs;
  if (type != "yarn") {
    f.fail("rope_scaling", "has type '" + type + "', which duet does not support (supported: yarn)");
  }
  rs.type = type;
  rs.factor = rf.number("factor", 1.0);
  rs.beta_fast = rf.number("beta_fast", 32.0);
  rs.beta_slow = rf.number("beta_slow", 1.0);
  // Missing original_max_position_embeddings: DeepSeek's code assumes 4096, HF falls back to
  // max_position_embeddings.
  const std::string model_type = f.string("model_type", "");
  const int64_t orig_default =
      model_type == "deepseek_v2" || model_type == "deepseek_v3" || model_type == "kimi_k2"
          ? 4096
          : f.integer("max_position_embeddings", 4096);
  rs.original_max_position = rf.integer("original_max_position_embeddings", orig_default);
  rs.mscale = rf.number("mscale", 1.0);
  rs.mscale_all_dim = rf.number("mscale_all_dim", 0.0);
  rs.attention_factor = rf.number("attention_factor", -1.0);
  if (rf.has("truncate") && !rf.boolean("truncate", true))
    f.fail("rope_scaling", "has truncate false, which duet does not support");
  if (rs.factor < 1.0) f.fail("rope_scaling", "has factor < 1");
  if (rs.original_max_position <= 0)
    f.fail("rope_scaling", "has original_max_position_embeddings <= 0");
  return rs;
}

// quantization_config: fp8 with block scales (DeepSeek-V3, Qwen3-FP8), or refused.
// compressed-tensors' int4 weights (pack-quantized, symmetric, groups of a multiple of 32):
// every config group's "weights" must be those, with no activation quantization.
PackedInt4Quant parse_compressed_tensors(const Fields& qf, const json& j) {
  const std::string format = qf.string("format", "");
  qf.require(format == "pack-quantized", "format",
             "is '" + format + "'; of compressed-tensors duet reads 'pack-quantized' int4 weights");
  qf.require(qf.has("config_groups") && j.at("config_groups").is_object() &&
                 !j.at("config_groups").empty(),
             "config_groups", "must be an object of one or more quantization groups");
  PackedInt4Quant q;
  q.enabled = true;
  for (const auto& [name, group] : j.at("config_groups").items()) {
    const std::string at = "config_groups." + name;
    qf.require(group.is_object() && group.contains("weights") && group.at("weights").is_object(),
               at, "must have a \"weights\" object");
    for (const char* key : {"input_activations", "output_activations"}) {
      qf.require(!group.contains(key) || group.at(key).is_null(), at + "." + key,
                 "is set; duet quantizes weights only (W4A16)");
    }
    const json& w = group.at("weights");
    const auto value = [&](const char* key) { return w.contains(key) ? w.at(key) : json(); };
    const auto want = [&](const char* key, const json& expected, const std::string& why) {
      qf.require(value(key) == expected, at + ".weights." + key,
                 "is " + value(key).dump() + "; " + why);
    };
    want("num_bits", 4, "duet reads 4-bit weights");
    want("type", "int", "duet reads integer weights");
    want("symmetric", true, "duet reads symmetric weights (no zero point)");
    want("strategy", "group", "duet reads group-wise scales");
    qf.require(!value("dynamic").is_boolean() || !value("dynamic").get<bool>(),
               at + ".weights.dynamic", "is true; duet reads stored scales");
    const json g = value("group_size");
    qf.require(g.is_number_integer() && g.get<int64_t>() > 0 && g.get<int64_t>() % kQ8Group == 0,
               at + ".weights.group_size",
               "is " + g.dump() + "; duet reads groups of a multiple of " +
                   std::to_string(kQ8Group) + " columns");
    qf.require(name == j.at("config_groups").begin().key() || g.get<int64_t>() == q.group_size,
               at + ".weights.group_size", "differs from another group's");
    q.group_size = g.get<int64_t>();
  }
  return q;
}

Fp8Quant parse_quantization_config(const Fields& f, const json& config, const std::string& source,
                                   PackedInt4Quant* packed_int4) {
  Fp8Quant q;
  if (!f.has("quantization_config")) return q;
  const json& j = config.at("quantization_config");
  f.require(j.is_object(), "quantization_config", "must be an object, found " + j.dump());
  const std::string at = source + ": 'quantization_config'";  // qf keeps a reference
  const Fields qf(j, at);
  const std::string method = qf.string("quant_method", "");
  if (method == "compressed-tensors") {
    *packed_int4 = parse_compressed_tensors(qf, j);
    return q;
  }
  qf.require(method == "fp8", "quant_method",
             "is '" + method +
                 "'; duet reads fp8 checkpoints (quant_method 'fp8'), compressed-tensors' int4 "
                 "ones and unquantized bf16/f16/f32 ones");
  const std::string fmt = qf.string("fmt", "e4m3");
  qf.require(fmt == "e4m3", "fmt", "is '" + fmt + "'; duet reads fp8 weights in 'e4m3'");
  const std::string act = qf.string("activation_scheme", "dynamic");
  qf.require(act == "dynamic", "activation_scheme",
             "is '" + act + "'; duet computes with f32 activations ('dynamic')");
  const std::vector<int64_t> block = qf.int_list("weight_block_size");
  qf.require(block.size() == 2, "weight_block_size",
             "must be [rows, cols] (per-tensor fp8 scales are not supported)");
  qf.require(block[0] > 0 && block[1] > 0 && block[1] % 16 == 0, "weight_block_size",
             "must be positive, the columns a multiple of 16, found [" + std::to_string(block[0]) +
                 ", " + std::to_string(block[1]) + "]");
  q.enabled = true;
  q.block_rows = block[0];
  q.block_cols = block[1];
  if (qf.has("modules_to_not_convert")) {
    const json& m = j.at("modules_to_not_convert");
    qf.require(m.is_array(), "modules_to_not_convert", "must be a list of module names");
    for (const json& e : m) {
      qf.require(e.is_string(), "modules_to_not_convert", "must be a list of module names");
      q.modules_to_not_convert.push_back(e.get<std::string>());
    }
  }
  return q;
}

void parse_common(const Fields& f, ModelConfig& c) {
  c.n_vocab = f.integer("vocab_size");
  c.n_embd = f.integer("hidden_size");
  c.n_layer = f.integer("num_hidden_layers");
  c.n_head = f.integer("num_attention_heads");
  c.n_head_kv = f.integer("num_key_value_heads", c.n_head);
  c.n_ff = f.integer("intermediate_size", 0);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  c.max_position_embeddings = f.integer("max_position_embeddings", 4096);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.bos_token_id = static_cast<int32_t>(f.integer("bos_token_id", -1));
  c.eos_token_ids = f.ids("eos_token_id");
  for (const char* k : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "max_position_embeddings"}) {
    if (f.has(k)) f.positive(k, f.integer(k));
  }
  std::string act = f.string("hidden_act", "silu");
  f.require(act == "silu", "hidden_act", "is '" + act + "'; duet supports only 'silu'");
  f.require(!f.boolean("attention_bias", false), "attention_bias",
            "is true; duet does not support attention biases");
  f.require(f.integer("pretraining_tp", 1) == 1, "pretraining_tp", "must be 1");
}

void parse_qwen3_moe(const Fields& f, ModelConfig& c) {
  c.head_dim = f.integer("head_dim", c.n_embd / c.n_head);
  c.n_expert = f.integer("num_experts", 0);
  c.n_expert_used = f.integer("num_experts_per_tok", 0);
  c.n_ff_exp = f.integer("moe_intermediate_size", 0);
  c.norm_topk_prob = f.boolean("norm_topk_prob", false);
  c.decoder_sparse_step = f.integer("decoder_sparse_step", 1);
  c.mlp_only_layers = f.int_list("mlp_only_layers");
  f.positive("decoder_sparse_step", c.decoder_sparse_step);
  f.require(!f.boolean("use_sliding_window", false), "use_sliding_window",
            "is true; duet does not support sliding-window attention");
  for (int64_t l : c.mlp_only_layers)
    f.require(l >= 0 && l < c.n_layer, "mlp_only_layers", "names layer " + std::to_string(l) +
                                                              " outside [0, num_hidden_layers)");
}

void parse_mixtral(const Fields& f, ModelConfig& c) {
  // MixtralConfig's defaults differ from the other two.
  c.n_head_kv = f.integer("num_key_value_heads", 8);
  c.rope_theta = f.number("rope_theta", 1e6);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-5);
  c.head_dim = f.integer("head_dim", c.n_embd / c.n_head);
  c.n_expert = f.integer("num_local_experts");
  c.n_expert_used = f.integer("num_experts_per_tok");
  c.n_ff_exp = c.n_ff;
  c.norm_topk_prob = true;
  f.require(!f.has("sliding_window"), "sliding_window",
            "is set; duet does not support sliding-window attention (expected null)");
}

// DeepSeek-V2 and V3 share their fields; V3's defaults (DeepseekV3Config) and routing differ.
void parse_deepseek(const Fields& f, ModelConfig& c) {
  const bool v3 = c.arch == Arch::kDeepseekV3;
  c.n_expert = f.has("n_routed_experts") ? f.integer("n_routed_experts") : 0;
  c.n_expert_used = f.integer("num_experts_per_tok", 0);
  c.n_expert_shared = f.integer("n_shared_experts", 0);
  c.n_ff_exp = f.integer("moe_intermediate_size", 0);
  // DeepseekV2Config defaults q_lora_rank to 1536 when the key is absent; null means none.
  c.q_lora_rank = f.has("q_lora_rank") ? f.integer("q_lora_rank")
                                        : f.key_present("q_lora_rank") ? 0 : 1536;
  c.kv_lora_rank = f.integer("kv_lora_rank");
  c.qk_nope_head_dim = f.integer("qk_nope_head_dim");
  c.qk_rope_head_dim = f.integer("qk_rope_head_dim");
  c.v_head_dim = f.integer("v_head_dim");
  c.first_k_dense_replace = f.integer("first_k_dense_replace", 0);
  c.moe_layer_freq = f.integer("moe_layer_freq", 1);
  c.norm_topk_prob = f.boolean("norm_topk_prob", v3);
  c.routed_scaling_factor = f.number("routed_scaling_factor", v3 ? 2.5 : 1.0);
  c.n_group = f.integer("n_group", v3 ? 8 : 1);
  c.topk_group = f.integer("topk_group", v3 ? 4 : 1);
  c.n_nextn_layers = v3 ? f.integer("num_nextn_predict_layers", 1) : 0;
  f.require(c.n_nextn_layers >= 0, "num_nextn_predict_layers", "must be >= 0");
  c.head_dim = c.v_head_dim;
  for (const char* k : {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "moe_layer_freq"})
    f.positive(k, f.integer(k, 1));
  f.require(c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", "must be even");
  // "gready" is how DeepSeek-V2's own configuration code spells the greedy default.
  std::string method = f.string("topk_method", v3 ? "noaux_tc" : "greedy");
  std::string scoring = f.string("scoring_func", v3 ? "sigmoid" : "softmax");
  if (v3) {
    f.require(method == "noaux_tc", "topk_method",
              "is '" + method + "'; duet supports 'noaux_tc' for deepseek_v3");
    f.require(scoring == "sigmoid", "scoring_func",
              "is '" + scoring + "'; deepseek_v3's noaux_tc routing needs 'sigmoid'");
    c.topk_method = TopkMethod::kNoauxTc;
  } else if (method == "greedy" || method == "gready") {
    c.topk_method = TopkMethod::kGreedy;
  } else if (method == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else {
    f.fail("topk_method", "is '" + method +
                              "'; duet supports 'greedy' and 'group_limited_greedy' (DeepSeek-V2)");
  }
  if (!v3) {
    f.require(scoring == "softmax", "scoring_func",
              "is '" + scoring + "'; duet supports only 'softmax' (DeepSeek-V2)");
  }
  if (c.topk_method != TopkMethod::kGreedy) {
    f.positive("n_group", c.n_group);
    f.require(c.n_expert % c.n_group == 0, "n_group", "must divide n_routed_experts");
    f.require(c.topk_group >= 1 && c.topk_group <= c.n_group, "topk_group",
              "must be in [1, n_group]");
    f.require(c.n_expert_used <= c.topk_group * (c.n_expert / c.n_group), "num_experts_per_tok",
              "exceeds the experts in topk_group groups");
    // noaux_tc scores a group by the sum of its best two experts.
    f.require(!v3 || c.n_expert / c.n_group >= 2, "n_group",
              "leaves fewer than 2 experts per group (noaux_tc sums each group's top 2)");
  }
  f.require(c.n_head_kv == c.n_head, "num_key_value_heads",
            "must equal num_attention_heads for MLA");
}

}  // namespace

ModelConfig parse_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": expected a JSON object");
  Fields f(j, source);
  ModelConfig c;
  std::string type = f.string("model_type", "");
  if (type == "qwen3_moe") {
    c.arch = Arch::kQwen3Moe;
  } else if (type == "deepseek_v2") {
    c.arch = Arch::kDeepseekV2;
  } else if (type == "deepseek_v3" || type == "kimi_k2") {  // Kimi K2: DeepseekV3ForCausalLM
    c.arch = Arch::kDeepseekV3;
  } else if (type == "mixtral") {
    c.arch = Arch::kMixtral;
  } else {
    f.fail("model_type", "is '" + type +
                             "'; duet supports 'qwen3_moe', 'deepseek_v2', 'deepseek_v3' (and "
                             "Kimi K2's 'kimi_k2') and 'mixtral'");
  }
  parse_common(f, c);
  c.rope_scaling = parse_rope_scaling(f, j, source);
  c.fp8 = parse_quantization_config(f, j, source, &c.packed_int4);
  switch (c.arch) {
    case Arch::kQwen3Moe: parse_qwen3_moe(f, c); break;
    case Arch::kDeepseekV2:
    case Arch::kDeepseekV3: parse_deepseek(f, c); break;
    case Arch::kMixtral: parse_mixtral(f, c); break;
  }
  f.require(c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0, "num_key_value_heads",
            "must divide num_attention_heads (" + std::to_string(c.n_head) + ")");
  if (c.n_expert > 0) {
    f.require(c.n_expert_used >= 1 && c.n_expert_used <= c.n_expert, "num_experts_per_tok",
              "must be in [1, " + std::to_string(c.n_expert) + "]");
    f.require(c.n_ff_exp > 0, c.arch == Arch::kMixtral ? "intermediate_size"
                                                       : "moe_intermediate_size",
              "must be positive for a MoE model");
  }
  bool any_dense = false;
  for (int64_t il = 0; il < c.n_layer; ++il) any_dense |= !c.is_moe_layer(il);
  if (any_dense) f.require(c.n_ff > 0, "intermediate_size", "must be positive (dense layers)");
  if (!is_deepseek(c.arch)) {
    f.positive("head_dim", c.head_dim);
    f.require(c.head_dim % 2 == 0, "head_dim", "must be even");
  }
  return c;
}

ModelConfig load_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open: no such file (is this a model directory?)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  ModelConfig c = parse_config(j, path);
  std::ifstream gin(model_dir + "/generation_config.json");
  if (gin) {
    json g = json::parse(gin, nullptr, /*allow_exceptions=*/false);
    if (g.is_object()) {
      Fields gf(g, model_dir + "/generation_config.json");
      std::vector<int32_t> eos = gf.ids("eos_token_id");
      for (int32_t id : eos) {
        bool seen = false;
        for (int32_t e : c.eos_token_ids) seen |= e == id;
        if (!seen) c.eos_token_ids.push_back(id);
      }
    }
  }
  return c;
}

}  // namespace duet
