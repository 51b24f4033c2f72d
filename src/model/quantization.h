// --quantization: which weights a model quantizes at load, and what it came to.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace duet {

enum class Quantization {
  kNone,  // weights as the checkpoint stores them
  kInt8,  // DType::kQ8 (kernels/quantize.h): groups of 32 columns, an f16 scale each, a row factor
  kInt4,  // DType::kQ4 (kernels/quantize.h): the same groups of 4-bit values, but the output
          // head kQ8, as llama-quantize keeps Q4_0's output head at 6 bits (Q6_K): the head is
          // one matrix, the last, and its rounding moves every logit
  kInt4Pure,  // every quantized matrix kQ4, the head too (llama-quantize's --pure)
};

// "none" | "int8" | "int4" | "int4_pure"; anything else throws duet::Error naming the value and
// the choices.
Quantization parse_quantization(const std::string& name);
const char* quantization_name(Quantization q);
// The weight layout q (not kNone) gives the matrix `name` (one quantized_at_load accepts): kQ8
// or kQ4.
DType quantized_dtype(Quantization q, const std::string& name);

// Whether the loader quantizes the matrix `name`: every linear layer's weights (routed and
// shared experts, dense MLPs, attention projections, the output head) except those read other
// than by matmul: the embedding table (gathered row by row; so also a tied output head), the
// routers (a few rows, whose rounding would move the choice of experts) and MLA's kv_b_proj
// (CheckpointSource::mla_kv_b quantizes it after splitting it by head, as quantized_dtype says
// for its name).
bool quantized_at_load(const std::string& name);

// Whether q quantizes a matrix quantized_at_load names that the checkpoint stores as `stored`:
// bf16, f16 and f32 ones under every quantization; fp8 ones (a byte a weight already) only under
// the 4-bit ones (each weight's value, code × block scale, quantized as a bf16 one's).
bool quantizes_stored(Quantization q, DType stored);

// What a load quantized: the matrices, and their bytes before (as stored, or as converted from
// f16) and after.
struct QuantizationReport {
  Quantization quantization = Quantization::kNone;
  int64_t n_matrices = 0;
  uint64_t bytes_before = 0;
  uint64_t bytes_after = 0;
  // A compressed-tensors int4 checkpoint's packed matrices, read as int4 (not counted above).
  int64_t n_stored_int4 = 0;
  uint64_t stored_int4_bytes = 0;  // as duet holds them
};

// "12 matrices int4 as stored (compressed-tensors, 3.1 MiB)", or "" without any.
std::string describe_stored_int4(const QuantizationReport& r);

// "int8: 36 matrices, 1.2 GiB → 650.0 MiB" (or "none"); int4 adds "(output head int8)".
std::string describe(const QuantizationReport& r);

}  // namespace duet
