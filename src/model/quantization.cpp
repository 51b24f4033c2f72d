#include "model/quantization.h"

#include <cstdio>

#include "core/error.h"

namespace duet {

Quantization parse_quantization(const std::string& name) {
  if (name == "none") return Quantization::kNone;
  if (name == "int8") return Quantization::kInt8;
  if (name == "int4") return Quantization::kInt4;
  if (name == "int4_pure") return Quantization::kInt4Pure;
  DUET_ERROR("--quantization " << name << ": expected none, int8, int4 or int4_pure");
}

const char* quantization_name(Quantization q) {
  switch (q) {
    case Quantization::kInt8:
      return "int8";
    case Quantization::kInt4:
      return "int4";
    case Quantization::kInt4Pure:
      return "int4_pure";
    case Quantization::kNone:
      break;
  }
  return "none";
}

namespace {

bool is_output_head(const std::string& name) {
  return name == "lm_head.weight";
}

}  // namespace

DType quantized_dtype(Quantization q, const std::string& name) {
  switch (q) {
    case Quantization::kInt8:
      return DType::kQ8;
    case Quantization::kInt4:
      return is_output_head(name) ? DType::kQ8 : DType::kQ4;
    case Quantization::kInt4Pure:
      return DType::kQ4;
    case Quantization::kNone:
      break;
  }
  DUET_ERROR("quantized_dtype: no quantization for " << name);
}

bool quantized_at_load(const std::string& name) {
  const auto ends_with = [&](const char* tail) { return name.ends_with(tail); };
  return !ends_with("embed_tokens.weight") && !ends_with("mlp.gate.weight") &&
         !ends_with("block_sparse_moe.gate.weight") && !ends_with("self_attn.kv_b_proj.weight");
}

bool quantizes_stored(Quantization q, DType stored) {
  if (q == Quantization::kNone) return false;
  return stored != DType::kF8E4M3 || q == Quantization::kInt4 || q == Quantization::kInt4Pure;
}

std::string describe(const QuantizationReport& r) {
  if (r.quantization == Quantization::kNone) return "none";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s%s: %lld matrices, %.1f MiB -> %.1f MiB",
                quantization_name(r.quantization),
                r.quantization == Quantization::kInt4 ? " (output head int8)" : "",
                static_cast<long long>(r.n_matrices), r.bytes_before / 1048576.0,
                r.bytes_after / 1048576.0);
  return buf;
}

std::string describe_stored_int4(const QuantizationReport& r) {
  if (r.n_stored_int4 == 0) return "";
  char buf[120];
  std::snprintf(buf, sizeof buf, "%lld matrices int4 as stored (compressed-tensors, %.1f MiB)",
                static_cast<long long>(r.n_stored_int4), r.stored_int4_bytes / 1048576.0);
  return buf;
}

}  // namespace duet
