// `duet make-model`: writes a Hugging Face-style model directory with seeded random weights
// (config.json, safetensors, tokenizer.json, tokenizer_config.json, generation_config.json).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace duet {

struct MakeModelOptions {
  std::string dir;
  std::string arch = "qwen3_moe";  // qwen3_moe | deepseek_v2 | deepseek_v3 | kimi_k2 | mixtral
  std::string preset = "tiny";     // tiny | small
  uint64_t seed = 0;
  // kF32, kBF16, kF8E4M3 (fp8: projections in E4M3, the rest bf16) or kQ4 (int4: the routed
  // experts in compressed-tensors' packed int4, the rest bf16)
  DType dtype = DType::kBF16;
  std::string hf_overrides;        // JSON object merged into config.json (top-level keys)
  uint64_t max_shard_bytes = 512ull << 20;
};

// The config.json of a preset (before overrides). Throws duet::Error for an unknown arch/preset.
nlohmann::json preset_config(const std::string& arch, const std::string& preset);

// Writes the directory (created if missing). Throws duet::Error on bad options or I/O failure.
void make_model(const MakeModelOptions& opt);

}  // namespace duet
