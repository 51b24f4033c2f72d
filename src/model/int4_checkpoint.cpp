#include "model/int4_checkpoint.h"

#include <cstring>

#include "core/error.h"
#include "kernels/quantize.h"

namespace duet {

bool int4_packed_name(const std::string& name) {
  if (name.find(".experts.") == std::string::npos || !name.ends_with(".weight")) return false;
  return name.ends_with("_proj.weight") || name.ends_with(".w1.weight") ||
         name.ends_with(".w2.weight") || name.ends_with(".w3.weight");
}

std::vector<TensorData> int4_checkpoint_tensors(const TensorData& t) {
  if (t.shape.size() != 2 || !int4_packed_name(t.name)) return {t};
  DUET_CHECK(t.dtype == DType::kBF16, "int4 checkpoint: " << t.name << " is not bf16");
  const int64_t rows = t.shape[0], cols = t.shape[1];
  DUET_CHECK(cols % kQ8Group == 0,
             "int4 checkpoint: " << t.name << " has " << cols << " columns, not groups of 32");
  const int64_t words = (cols + 7) / 8, groups = cols / kQ8Group;
  TensorData packed{t.name + "_packed", DType::kI32, {rows, words}, {}};
  TensorData scale{t.name + "_scale", DType::kBF16, {rows, groups}, {}};
  TensorData shape{t.name + "_shape", DType::kI64, {2}, std::vector<uint8_t>(16)};
  packed.bytes.assign(static_cast<size_t>(rows * words * 4), 0);
  scale.bytes.resize(static_cast<size_t>(rows * groups * 2));
  std::memcpy(shape.bytes.data(), &rows, 8);
  std::memcpy(shape.bytes.data() + 8, &cols, 8);
  std::vector<int8_t> q(static_cast<size_t>(q8_ld(cols)));
  std::vector<float> d(static_cast<size_t>(q8_ld(cols) / kQ8Group));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row_q4(DType::kBF16, t.bytes.data() + r * cols * 2, cols, q.data(), d.data());
    for (int64_t k = 0; k < cols; ++k) {  // value k: nibble k % 2 of byte k / 2 (little-endian)
      uint8_t& b = packed.bytes[r * words * 4 + k / 2];
      b |= static_cast<uint8_t>((q[k] + 8) << (4 * (k % 2)));
    }
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t h = f32_to_bf16(d[g]);
      DUET_CHECK(bf16_to_f32(h) == d[g], "int4 checkpoint: " << t.name << " scale " << d[g]
                                                              << " is not a bf16");
      std::memcpy(scale.bytes.data() + 2 * (r * groups + g), &h, 2);
    }
  }
  return {packed, scale, shape};
}

nlohmann::json int4_quantization_config() {
  const nlohmann::json weights = {
      {"num_bits", 4},     {"type", "int"},        {"symmetric", true}, {"strategy", "group"},
      {"group_size", 32},  {"dynamic", false},     {"actorder", nullptr},
      {"observer", "minmax"}, {"block_structure", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", nullptr},
              {"output_activations", nullptr}}}}},
          {"ignore", {"lm_head", "re:.*self_attn.*", "re:.*shared_expert.*", "re:.*mlp\\.gate.*",
                      "re:.*mlp\\.(gate|up|down)_proj.*", "re:.*block_sparse_moe\\.gate.*"}},
          {"kv_cache_scheme", nullptr}};
}

}  // namespace duet
