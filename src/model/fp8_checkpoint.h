// Writing fp8 checkpoints as DeepSeek-V3 and Qwen3-FP8 publish them (make-model --dtype fp8): the
// linear projections as F8_E4M3 codes with a `<name>_scale_inv` of one f32 per 128 × 128 block
// (the block's largest magnitude / 448), everything else in bf16, and the quantization_config
// that says so.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace duet {

constexpr int64_t kFp8Block = 128;

// Whether DeepSeek-V3's fp8 release stores the tensor `name` (a 2-D weight) in fp8: the linear
// projections (attention, dense, shared and routed experts' MLPs: "*_proj.weight", Mixtral's
// "experts.N.w1/w2/w3.weight"); not the embeddings, the output head or a router's gate.
bool fp8_quantized_name(const std::string& name);

// codes[rows, cols] and scale_inv[ceil(rows / br), ceil(cols / bc)] for w[rows, cols] f32: each
// block's scale is its largest magnitude / 448 (0 for a block of zeros), each code the E4M3
// nearest (ties to even) to w / scale.
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                         uint8_t* codes, float* scale_inv);

// The tensors of an fp8 checkpoint for one f32 weight `t` (2-D): the codes and their
// `<name>_scale_inv` in 128 × 128 blocks where fp8_quantized_name, else t in bf16 (vectors too).
std::vector<TensorData> fp8_checkpoint_tensors(const TensorData& t);

// {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
//  "activation_scheme": "dynamic"}
nlohmann::json fp8_quantization_config();

}  // namespace duet
