#include "model/make_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/config.h"
#include "model/fp8_checkpoint.h"
#include "model/int4_checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"

namespace duet {

using json = nlohmann::json;

namespace {

json qwen3_moe_config(bool small) {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", small ? 32000 : 512},
          {"hidden_size", small ? 1024 : 64},
          {"num_hidden_layers", small ? 8 : 2},
          {"num_attention_heads", small ? 16 : 4},
          {"num_key_value_heads", small ? 4 : 2},
          {"head_dim", small ? 128 : 16},
          {"intermediate_size", small ? 3072 : 128},
          {"moe_intermediate_size", small ? 512 : 32},
          {"num_experts", small ? 32 : 8},
          {"num_experts_per_tok", small ? 4 : 2},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"rope_scaling", nullptr},
          {"max_position_embeddings", small ? 8192 : 2048},
          {"attention_bias", false},
          {"use_sliding_window", false},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", false}};
}

json deepseek_v2_config(bool small) {
  json yarn = {{"type", "yarn"},
               {"factor", 40},
               {"beta_fast", 32},
               {"beta_slow", 1},
               {"mscale", 0.707},
               {"mscale_all_dim", 0.707},
               {"original_max_position_embeddings", 4096}};
  return {{"architectures", {"DeepseekV2ForCausalLM"}},
          {"model_type", "deepseek_v2"},
          {"vocab_size", small ? 32000 : 512},
          {"hidden_size", small ? 1024 : 64},
          {"num_hidden_layers", small ? 8 : 3},
          {"num_attention_heads", small ? 16 : 4},
          {"num_key_value_heads", small ? 16 : 4},
          {"q_lora_rank", nullptr},
          {"kv_lora_rank", small ? 256 : 32},
          {"qk_nope_head_dim", small ? 64 : 16},
          {"qk_rope_head_dim", small ? 32 : 8},
          {"v_head_dim", small ? 64 : 16},
          {"intermediate_size", small ? 2816 : 128},
          {"moe_intermediate_size", small ? 512 : 32},
          {"n_routed_experts", small ? 32 : 8},
          {"num_experts_per_tok", small ? 4 : 2},
          {"n_shared_experts", small ? 2 : 1},
          {"first_k_dense_replace", 1},
          {"moe_layer_freq", 1},
          {"topk_method", "greedy"},
          {"n_group", 1},
          {"topk_group", 1},
          {"norm_topk_prob", false},
          {"routed_scaling_factor", 1.0},
          {"scoring_func", "softmax"},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"rope_scaling", small ? yarn : json(nullptr)},
          {"max_position_embeddings", small ? 163840 : 2048},
          {"attention_bias", false},
          {"tie_word_embeddings", false}};
}

// DeepSeek-V3's fields on the V2 shapes: noaux_tc routing over groups (4 of 2 experts, tiny; 4 of
// 8, small), a low-rank query, one multi-token-prediction layer (written, never loaded).
json deepseek_v3_config(bool small) {
  json c = deepseek_v2_config(small);
  c["architectures"] = {"DeepseekV3ForCausalLM"};
  c["model_type"] = "deepseek_v3";
  c["q_lora_rank"] = small ? 384 : 32;
  c["topk_method"] = "noaux_tc";
  c["scoring_func"] = "sigmoid";
  c["n_group"] = 4;
  c["topk_group"] = 2;
  c["norm_topk_prob"] = true;
  c["routed_scaling_factor"] = 2.5;
  c["num_nextn_predict_layers"] = 1;
  return c;
}

// Kimi K2's layout (model_type kimi_k2, DeepseekV3ForCausalLM) on the V3 shapes: one expert group,
// no multi-token prediction, its routed scaling; a tiktoken tokenizer whose 256 special tokens
// follow the ranks (so tiny's vocab holds 512 ranks besides them).
json kimi_k2_config(bool small) {
  json c = deepseek_v3_config(small);
  c["model_type"] = "kimi_k2";
  c["n_group"] = 1;
  c["topk_group"] = 1;
  c["num_nextn_predict_layers"] = 0;
  c["routed_scaling_factor"] = 2.827;
  c["rope_theta"] = 50000.0;
  if (!small) c["vocab_size"] = 768;
  return c;
}

json mixtral_config(bool small) {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"model_type", "mixtral"},
          {"vocab_size", small ? 32000 : 512},
          {"hidden_size", small ? 1024 : 64},
          {"num_hidden_layers", small ? 8 : 2},
          {"num_attention_heads", small ? 16 : 4},
          {"num_key_value_heads", small ? 4 : 2},
          {"intermediate_size", small ? 2048 : 32},
          {"num_local_experts", 8},
          {"num_experts_per_tok", 2},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 1000000.0},
          {"max_position_embeddings", small ? 32768 : 2048},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", false}};
}

// Special tokens per architecture, as the real checkpoints name them; the first is BOS (or
// none), `eos` indexes the end-of-turn token.
struct Specials {
  std::vector<std::string> tokens;
  int bos = -1;
  int eos = 0;
  int turn_end = -1;  // generation_config.json's end of turn where it differs from eos
  bool add_bos = false;
  std::string chat_template;
};

// Kimi K2's named special tokens, at their offsets past the ranks (tokenizer_config.json's
// added_tokens_decoder: 163584 + offset in the real checkpoint); the rest of the 256 are reserved.
constexpr std::pair<int, const char*> kKimiSpecials[] = {{0, "[BOS]"},
                                                         {1, "[EOS]"},
                                                         {2, "<|im_end|>"},
                                                         {3, "<|im_user|>"},
                                                         {4, "<|im_assistant|>"},
                                                         {6, "<|start_header_id|>"},
                                                         {7, "<|end_header_id|>"},
                                                         {9, "[EOT]"},
                                                         {10, "<|im_system|>"},
                                                         {17, "<|im_middle|>"},
                                                         {254, "[UNK]"},
                                                         {255, "[PAD]"}};
constexpr int kKimiReserved = 256;

Specials specials_for(const std::string& arch, int64_t n_vocab) {
  Specials s;
  if (arch == "kimi_k2") {
    const int64_t first = n_vocab - kKimiReserved;
    for (int i = 0; i < kKimiReserved; ++i)
      s.tokens.push_back("<|reserved_token_" + std::to_string(first + i) + "|>");
    for (const auto& [offset, name] : kKimiSpecials) s.tokens[offset] = name;
    s.bos = 0;
    s.eos = 1;       // [EOS] in config.json; generation_config.json adds <|im_end|>
    s.turn_end = 2;  // <|im_end|>
    s.chat_template =
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{ '<|im_system|>system<|im_middle|>' }}"
        "{% elif message['role'] == 'user' %}{{ '<|im_user|>user<|im_middle|>' }}"
        "{% else %}{{ '<|im_assistant|>assistant<|im_middle|>' }}{% endif %}"
        "{{ message['content'] + '<|im_end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_assistant|>assistant<|im_middle|>' }}{% endif %}";
  } else if (arch == "qwen3_moe") {
    s.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    s.bos = 0;
    s.eos = 2;
    s.chat_template =
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  } else if (arch == "deepseek_v2" || arch == "deepseek_v3") {
    s.tokens = {"<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"};
    s.bos = 0;
    s.eos = 1;
    s.add_bos = true;
    s.chat_template =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
        "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
        "{{ 'Assistant: ' + message['content'] + eos_token }}{% else %}{{ message['content'] + "
        "'\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}"
        "{% endif %}";
  } else {
    s.tokens = {"<unk>", "<s>", "</s>"};
    s.bos = 1;
    s.eos = 2;
    s.add_bos = true;
    s.chat_template =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + "
        "eos_token }}{% endif %}{% endfor %}";
  }
  return s;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Values with mean `mean` and standard deviation `std`, uniform, from a stream seeded by the
// model seed and the tensor's name (so a tensor does not depend on the others' order).
TensorData random_tensor(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                         uint64_t seed, double mean, double std) {
  TensorData t;
  t.name = name;
  t.dtype = dtype;
  t.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  t.bytes.resize(static_cast<size_t>(n) * dtype_size(dtype));
  uint64_t state = seed * 0x2545f4914f6cdd1dull ^ fnv1a(name);
  const double half_width = std * std::sqrt(3.0);
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
    const float v = static_cast<float>(mean + (2.0 * u - 1.0) * half_width);
    if (dtype == DType::kF32) {
      std::memcpy(t.bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
  }
  return t;
}

void write_json(const std::string& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw Error(path + ": cannot write");
}

}  // namespace

json preset_config(const std::string& arch, const std::string& preset) {
  if (preset != "tiny" && preset != "small")
    throw Error("unknown preset '" + preset + "' (expected tiny or small)");
  const bool small = preset == "small";
  if (arch == "qwen3_moe") return qwen3_moe_config(small);
  if (arch == "deepseek_v2") return deepseek_v2_config(small);
  if (arch == "deepseek_v3") return deepseek_v3_config(small);
  if (arch == "kimi_k2") return kimi_k2_config(small);
  if (arch == "mixtral") return mixtral_config(small);
  throw Error("unknown architecture '" + arch +
              "' (expected qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2 or mixtral)");
}

void make_model(const MakeModelOptions& opt) {
  json cfg = preset_config(opt.arch, opt.preset);
  if (!opt.hf_overrides.empty()) {
    json over = json::parse(opt.hf_overrides, nullptr, /*allow_exceptions=*/false);
    if (!over.is_object())
      throw Error("--hf-overrides: expected a JSON object, got: " + opt.hf_overrides);
    for (auto& [k, v] : over.items()) cfg[k] = v;
  }
  const int64_t n_vocab = cfg.at("vocab_size").get<int64_t>();
  const Specials sp = specials_for(opt.arch, n_vocab);
  const int64_t first_special = n_vocab - static_cast<int64_t>(sp.tokens.size());
  if (sp.bos >= 0) cfg["bos_token_id"] = first_special + sp.bos;
  cfg["eos_token_id"] = first_special + sp.eos;
  cfg["torch_dtype"] = opt.dtype == DType::kF32 ? "float32" : "bfloat16";
  if (opt.dtype == DType::kF8E4M3) cfg["quantization_config"] = fp8_quantization_config();  // fp8
  if (opt.dtype == DType::kQ4) cfg["quantization_config"] = int4_quantization_config();
  const ModelConfig config = parse_config(cfg, "make-model config");
  if (opt.dtype == DType::kF16)
    throw Error("make-model writes f32, bf16, fp8 or int4 weights, not f16");

  std::filesystem::create_directories(opt.dir);
  std::vector<TensorData> tensors;
  std::vector<RecordingSource::Request> weights = Model::list_weights(config);
  // DeepSeek-V3's multi-token-prediction layers sit past the last layer; the loader must skip
  // them, so a part of each is written (its norms and projection, a decoder layer's norm).
  const int64_t D = config.n_embd;
  for (int64_t i = 0; i < config.n_nextn_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(config.n_layer + i) + ".";
    weights.push_back({p + "enorm.weight", {D}});
    weights.push_back({p + "hnorm.weight", {D}});
    weights.push_back({p + "eh_proj.weight", {D, 2 * D}});
    weights.push_back({p + "input_layernorm.weight", {D}});
  }
  for (const RecordingSource::Request& r : weights) {
    const bool is_norm = r.shape.size() == 1;
    const bool is_embed = r.name == "model.embed_tokens.weight";
    // The correction bias is centred on 0 and wide enough to change which experts are chosen.
    const bool is_bias = r.name.size() > 23 &&
                         r.name.compare(r.name.size() - 23, 23, "e_score_correction_bias") == 0;
    const double std = is_bias   ? 0.3
                       : is_norm ? 0.1
                       : is_embed ? 1.0
                                  : 1.0 / std::sqrt(double(r.shape[1]));
    const double mean = is_norm && !is_bias ? 1.0 : 0.0;
    if (opt.dtype == DType::kF8E4M3 || opt.dtype == DType::kQ4) {  // quantized, as published:
      // fp8 from the f32 weights, int4 (the routed experts) from the bf16 ones
      const bool fp8 = opt.dtype == DType::kF8E4M3;
      const TensorData t =
          random_tensor(r.name, r.shape, fp8 ? DType::kF32 : DType::kBF16, opt.seed, mean, std);
      for (TensorData& q : fp8 ? fp8_checkpoint_tensors(t) : int4_checkpoint_tensors(t))
        tensors.push_back(std::move(q));
      continue;
    }
    tensors.push_back(random_tensor(r.name, r.shape, opt.dtype, opt.seed, mean, std));
  }
  write_safetensors_dir(opt.dir, tensors, opt.max_shard_bytes);
  write_json(opt.dir + "/config.json", cfg);

  json gen = {{"eos_token_id", first_special + sp.eos}, {"do_sample", false}};
  if (sp.turn_end >= 0) gen["eos_token_id"] = {first_special + sp.eos, first_special + sp.turn_end};
  if (sp.bos >= 0) gen["bos_token_id"] = first_special + sp.bos;
  write_json(opt.dir + "/generation_config.json", gen);

  json tc = {{"add_bos_token", sp.add_bos},
             {"add_eos_token", false},
             {"bos_token", sp.bos >= 0 ? json(sp.tokens[sp.bos]) : json(nullptr)},
             {"eos_token", sp.tokens[sp.eos]},
             {"model_max_length", config.max_position_embeddings},
             {"tokenizer_class", "PreTrainedTokenizerFast"},
             {"chat_template", sp.chat_template}};
  if (opt.arch == "kimi_k2") {  // Kimi's tiktoken.model, its class named for trust_remote_code
    std::ofstream ranks(opt.dir + "/tiktoken.model");
    ranks << build_tiktoken_ranks(static_cast<int32_t>(first_special));
    if (!ranks) throw Error(opt.dir + "/tiktoken.model: cannot write");
    tc["tokenizer_class"] = "TikTokenTokenizer";
    tc["auto_map"] = {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}};
    json added = json::object();
    for (const auto& [offset, name] : kKimiSpecials) {
      added[std::to_string(first_special + offset)] = {{"content", name},      {"lstrip", false},
                                                       {"normalized", false},  {"rstrip", false},
                                                       {"single_word", false}, {"special", true}};
    }
    tc["added_tokens_decoder"] = added;
  } else {
    std::ofstream tok(opt.dir + "/tokenizer.json");
    tok << build_bpe_tokenizer_json(static_cast<int32_t>(n_vocab), sp.tokens);
    if (!tok) throw Error(opt.dir + "/tokenizer.json: cannot write");
  }
  write_json(opt.dir + "/tokenizer_config.json", tc);
}

}  // namespace duet
