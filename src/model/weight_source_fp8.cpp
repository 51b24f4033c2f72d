// fp8 checkpoints (DeepSeek-V3, Qwen3-FP8): an F8_E4M3 weight and its `<name>_scale_inv`, one f32
// per block of ModelConfig::fp8's size, handed out as a Matrix of the codes as stored.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/weight_source.h"

namespace duet {

namespace {

int64_t n_blocks(int64_t n, int64_t block) {
  return (n + block - 1) / block;
}

// Whether `name` (a tensor) belongs to `module` (a module path as modules_to_not_convert lists
// them: "lm_head", "model.layers.0.mlp.gate").
bool in_module(const std::string& name, const std::string& module) {
  return name.size() > module.size() && name.compare(0, module.size(), module) == 0 &&
         name[module.size()] == '.';
}

}  // namespace

Matrix CheckpointSource::fp8_view(const std::string& name, const TensorView& t, int64_t rows,
                                  int64_t cols) {
  const std::string at = set_.file_of(name) + ": tensor '" + name + "'";
  if (!opt_.fp8.enabled) {
    throw Error(at +
                ": is F8_E4M3 but config.json has no fp8 quantization_config "
                "(quant_method \"fp8\")");
  }
  for (const std::string& module : opt_.fp8.modules_to_not_convert) {
    if (in_module(name, module)) {
      throw Error(at + ": is F8_E4M3 but its module '" + module +
                  "' is in quantization_config.modules_to_not_convert");
    }
  }
  const std::string scale_name = name + "_scale_inv";
  if (!set_.has(scale_name)) {
    throw Error(at + ": is F8_E4M3 but its block scales '" + scale_name + "' are missing");
  }
  const TensorView& s = set_.get(scale_name);
  const std::string scale_at = set_.file_of(scale_name) + ": tensor '" + scale_name + "'";
  const std::vector<int64_t> want = {n_blocks(rows, opt_.fp8.block_rows),
                                     n_blocks(cols, opt_.fp8.block_cols)};
  if (s.shape != want) {
    throw Error(scale_at + ": expected shape " + shape_str(want) + " (one scale per [" +
                std::to_string(opt_.fp8.block_rows) + ", " + std::to_string(opt_.fp8.block_cols) +
                "] block of " + shape_str(t.shape) +
                ", quantization_config.weight_block_size), found " + shape_str(s.shape));
  }
  if (s.dtype != DType::kF32 && s.dtype != DType::kBF16) {
    throw Error(scale_at + ": dtype " + dtype_name(s.dtype) + ", expected F32 (or BF16)");
  }
  // A copy of the scales, aligned for the kernels (the file's may be at any byte offset) and
  // widened from bf16 where a checkpoint stores them so: 1/16384 of the weights' bytes.
  std::vector<float>& scales = owned_.emplace_back(static_cast<size_t>(s.numel()));
  const char* src = static_cast<const char*>(s.data);
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (s.dtype == DType::kF32) {
      std::memcpy(&scales[i], src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      scales[i] = bf16_to_f32(h);
    }
  }
  Matrix m;
  m.dtype = DType::kF8E4M3;
  m.rows = rows;
  m.cols = cols;
  m.data = t.data;
  m.f8.scale_inv = scales.data();
  m.f8.block_rows = opt_.fp8.block_rows;
  m.f8.block_cols = opt_.fp8.block_cols;
  bytes_by_name_[name] = t.nbytes();
  bytes_by_name_[scale_name] = scales.size() * 4;
  return m;
}

}  // namespace duet
