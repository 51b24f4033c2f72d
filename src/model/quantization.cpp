#include "model/quantization.h"

#include <cstdio>

#include "core/error.h"

namespace duet {

Quantization parse_quantization(const std::string& name) {
  if (name == "none") return Quantization::kNone;
  if (name == "int8") return Quantization::kInt8;
  if (name == "int4") return Quantization::kInt4;
  DUET_ERROR("--quantization " << name << ": expected none, int8 or int4");
}

const char* quantization_name(Quantization q) {
  switch (q) {
    case Quantization::kInt8:
      return "int8";
    case Quantization::kInt4:
      return "int4";
    case Quantization::kNone:
      break;
  }
  return "none";
}

DType quantized_dtype(Quantization q) {
  DUET_CHECK(q != Quantization::kNone, "quantized_dtype: no quantization");
  return q == Quantization::kInt4 ? DType::kQ4 : DType::kQ8;
}

bool quantized_at_load(const std::string& name) {
  const auto ends_with = [&](const char* tail) { return name.ends_with(tail); };
  return !ends_with("embed_tokens.weight") && !ends_with("mlp.gate.weight") &&
         !ends_with("block_sparse_moe.gate.weight") && !ends_with("self_attn.kv_b_proj.weight");
}

std::string describe(const QuantizationReport& r) {
  if (r.quantization == Quantization::kNone) return "none";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %lld matrices, %.1f MiB -> %.1f MiB",
                quantization_name(r.quantization), static_cast<long long>(r.n_matrices),
                r.bytes_before / 1048576.0, r.bytes_after / 1048576.0);
  return buf;
}

}  // namespace duet
