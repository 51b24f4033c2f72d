// compressed-tensors int4 checkpoints (Kimi K2 Thinking): a weight stored as `<name>_packed` (I32
// [rows, ceil(cols / 8)], eight values q + 8 a word from the low bits up), `<name>_scale` (one
// scale per group of ModelConfig::packed_int4's size in a row) and `<name>_shape` ([rows, cols]),
// read into duet's int4 matrix of the same values: w = scale · q, q in [-8, 7].
#include <cstring>

#include "core/error.h"
#include "kernels/quantize.h"
#include "model/weight_source.h"

namespace duet {

Matrix CheckpointSource::packed_int4(const std::string& name, int64_t rows, int64_t cols) {
  if (auto it = quantized_copies_.find(name); it != quantized_copies_.end())
    return it->second.view();
  const std::string packed_name = name + "_packed", scale_name = name + "_scale";
  const std::string shape_name = name + "_shape";
  const std::string at = set_.file_of(packed_name) + ": tensor '" + packed_name + "'";
  if (!opt_.packed_int4.enabled) {
    throw Error(at +
                ": is a packed int4 weight but config.json has no compressed-tensors "
                "quantization_config");
  }
  const TensorView& p = set_.get(packed_name);
  const std::vector<int64_t> packed_shape = {rows, (cols + 7) / 8};
  if (p.dtype != DType::kI32 || p.shape != packed_shape) {
    throw Error(at + ": expected I32 " + shape_str(packed_shape) + " (eight 4-bit values a word, " +
                std::to_string(rows) + " x " + std::to_string(cols) + " weights), found " +
                dtype_name(p.dtype) + " " + shape_str(p.shape));
  }
  if (set_.has(shape_name)) {  // [rows, cols] as I32 or I64
    const TensorView& s = set_.get(shape_name);
    const char* d = static_cast<const char*>(s.data);
    int64_t got[2] = {-1, -1};
    if (s.shape == std::vector<int64_t>{2} && (s.dtype == DType::kI32 || s.dtype == DType::kI64)) {
      for (int i = 0; i < 2; ++i) {
        if (s.dtype == DType::kI64) {
          std::memcpy(&got[i], d + 8 * i, 8);
        } else {
          int32_t v;
          std::memcpy(&v, d + 4 * i, 4);
          got[i] = v;
        }
      }
    }
    if (got[0] != rows || got[1] != cols) {
      throw Error(set_.file_of(shape_name) + ": tensor '" + shape_name + "': expected [" +
                  std::to_string(rows) + ", " + std::to_string(cols) +
                  "] (I32 or I64), the shape the model has for '" + name + "'");
    }
  }
  if (!set_.has(scale_name)) throw Error(at + ": its scales '" + scale_name + "' are missing");
  const TensorView& s = set_.get(scale_name);
  const int64_t group = opt_.packed_int4.group_size;
  const std::vector<int64_t> scale_shape = {rows, (cols + group - 1) / group};
  if ((s.dtype != DType::kBF16 && s.dtype != DType::kF16 && s.dtype != DType::kF32) ||
      s.shape != scale_shape) {
    throw Error(set_.file_of(scale_name) + ": tensor '" + scale_name + "': expected BF16, F16 or " +
                "F32 " + shape_str(scale_shape) + " (one scale per " + std::to_string(group) +
                " columns, quantization_config's group_size), found " + dtype_name(s.dtype) + " " +
                shape_str(s.shape));
  }
  const auto* words = static_cast<const uint8_t*>(p.data);
  const auto* scales = static_cast<const uint8_t*>(s.data);
  const auto scale_at = [&](int64_t r, int64_t g) {
    const int64_t i = r * scale_shape[1] + g;
    uint16_t h;
    float v;
    switch (s.dtype) {
      case DType::kF32: std::memcpy(&v, scales + 4 * i, 4); return v;
      case DType::kF16: std::memcpy(&h, scales + 2 * i, 2); return f16_to_f32(h);
      default: std::memcpy(&h, scales + 2 * i, 2); return bf16_to_f32(h);
    }
  };
  const auto values = [&](int64_t r, int8_t* q, float* d) {
    const uint8_t* row = words + r * packed_shape[1] * 4;  // little-endian words: bytes in order
    for (int64_t k = 0; k < cols; ++k) {
      const uint8_t b = row[k / 2];
      q[k] = static_cast<int8_t>(((k % 2) ? b >> 4 : b & 0x0f) - 8);
    }
    for (int64_t g = 0; g * kQ8Group < cols; ++g) d[g] = scale_at(r, g * kQ8Group / group);
  };
  const QuantizedMatrix& m =
      quantized_copies_
          .try_emplace(name, DType::kQ4, rows, cols, values, at + " (with its scales)", &arena_)
          .first->second;
  bytes_by_name_[name] = m.view().nbytes();
  quantized_.n_stored_int4 += 1;
  quantized_.stored_int4_bytes += m.view().nbytes();
  return m.view();
}

}  // namespace duet
