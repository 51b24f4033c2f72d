// The model configuration read from a Hugging Face config.json. Every field the engine uses is
// read here, once; a value the engine does not support is refused by name (duet::Error), never
// silently ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace duet {

enum class Arch { kQwen3Moe, kDeepseekV2, kDeepseekV3, kMixtral };

// DeepSeek-V2 and V3 (and what reuses their code, Kimi K2): MLA attention, shared experts.
inline bool is_deepseek(Arch a) { return a == Arch::kDeepseekV2 || a == Arch::kDeepseekV3; }

const char* arch_name(Arch a);  // the config.json model_type: "qwen3_moe", ...

// rope_scaling; type empty when absent (plain rope).
struct RopeScaling {
  std::string type;                 // "" or "yarn"
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position = 0;
  double mscale = 1.0;              // DeepSeek: cos/sin scale numerator
  double mscale_all_dim = 0.0;      // DeepSeek: softmax-scale mscale (0 = unset)
  double attention_factor = -1.0;   // HF: explicit cos/sin factor (< 0 = unset)
};

enum class TopkMethod {
  kGreedy,              // softmax, top k
  kGroupLimitedGreedy,  // DeepSeek-V2: softmax, groups by their best expert, top k in the kept
  kNoauxTc,             // DeepSeek-V3: sigmoid, + e_score_correction_bias for the choice only,
                        // groups by the sum of their top 2
};

// quantization_config of an fp8 checkpoint as DeepSeek-V3 and Qwen3's FP8 releases publish it
// ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
// "activation_scheme": "dynamic"}): the weights stored as F8_E4M3 carry a `<name>_scale_inv`
// of one f32 per block. Absent: no tensor may be fp8.
struct Fp8Quant {
  bool enabled = false;
  int64_t block_rows = 128;  // weight_block_size[0]: output rows per scale
  int64_t block_cols = 128;  // weight_block_size[1]: input columns per scale
  // modules_to_not_convert (Qwen3-FP8 lists them): modules whose weights must not be fp8.
  std::vector<std::string> modules_to_not_convert;
};

// quantization_config of a compressed-tensors int4 checkpoint as Kimi K2 Thinking publishes it
// ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {...:
// {"weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
// "group_size": 32}}}}): a quantized Linear's weight is `<name>_packed` (I32 [rows, cols / 8],
// eight 4-bit values q + 8 a word, the first in the low bits), `<name>_scale` (one scale a group
// of a row) and `<name>_shape` ([rows, cols]); w = scale · q. Absent: no weight may be packed.
struct PackedInt4Quant {
  bool enabled = false;
  int64_t group_size = 32;  // columns per scale: a multiple of 32 (duet's int4 groups)
};

struct ModelConfig {
  Arch arch = Arch::kQwen3Moe;
  int64_t n_vocab = 0;          // vocab_size
  int64_t n_embd = 0;           // hidden_size
  int64_t n_layer = 0;          // num_hidden_layers
  int64_t n_head = 0;           // num_attention_heads
  int64_t n_head_kv = 0;        // num_key_value_heads
  int64_t head_dim = 0;         // GQA archs: per-head q/k/v width
  int64_t n_ff = 0;             // intermediate_size: dense MLP (Mixtral: expert) width
  int64_t n_ff_exp = 0;         // moe_intermediate_size: routed expert width
  int64_t n_expert = 0;         // routed experts (0: dense model)
  int64_t n_expert_used = 0;    // num_experts_per_tok
  int64_t n_expert_shared = 0;  // DeepSeek n_shared_experts
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;

  // qwen3_moe
  std::vector<int64_t> mlp_only_layers;
  int64_t decoder_sparse_step = 1;

  // deepseek_v2 (MLA)
  int64_t q_lora_rank = 0;  // 0: q_proj directly
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t n_nextn_layers = 0;  // deepseek_v3 num_nextn_predict_layers: MTP layers, never loaded

  Fp8Quant fp8;                // quantization_config (quant_method fp8)
  PackedInt4Quant packed_int4;  // quantization_config (compressed-tensors, pack-quantized)

  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  // Whether layer il uses routed experts (else a dense MLP of width n_ff).
  bool is_moe_layer(int64_t il) const;
  // Query/key width per head used for attention scores.
  int64_t qk_head_dim() const;
};

// Parses and validates; `source` names the file in error messages ("<dir>/config.json").
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);

// Reads MODEL_DIR/config.json (and generation_config.json's eos_token_id when present).
ModelConfig load_config(const std::string& model_dir);

}  // namespace duet
