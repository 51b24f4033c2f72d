// Writing compressed-tensors int4 checkpoints as Kimi K2 Thinking publishes them (make-model
// --dtype int4): the routed experts' projections as pack-quantized int4 (`<name>_packed`,
// `<name>_scale` in bf16, `<name>_shape`), groups of 32 columns, everything else in bf16, and the
// quantization_config that says so.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace duet {

// Whether Kimi K2 Thinking stores the tensor `name` (a 2-D weight) in int4: the routed experts'
// projections ("experts.N.*_proj.weight", Mixtral's "experts.N.w1/w2/w3.weight").
bool int4_packed_name(const std::string& name);

// The tensors of an int4 checkpoint for one bf16 weight `t`: where int4_packed_name, its values
// by duet's int4 rule (each group of 32 its scale d = m / -8, m the weight of largest magnitude,
// exact in bf16; q = round(w / d) in [-8, 7]) as `_packed` (I32, eight q + 8 a word from the low
// bits up), `_scale` (BF16 [rows, cols / 32]) and `_shape` (I64 [2]); else t as it is.
std::vector<TensorData> int4_checkpoint_tensors(const TensorData& t);

// compressed-tensors' pack-quantized W4A16 config: one group of 4-bit symmetric integer weights,
// group-wise scales of 32 columns, the routed experts quantized and everything else ignored.
nlohmann::json int4_quantization_config();

}  // namespace duet
