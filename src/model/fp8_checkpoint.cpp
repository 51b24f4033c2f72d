#include "model/fp8_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/fp8_rows.h"

namespace duet {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool fp8_quantized_name(const std::string& name) {
  if (ends_with(name, "_proj.weight")) return true;
  return name.find(".experts.") != std::string::npos &&
         (ends_with(name, ".w1.weight") || ends_with(name, ".w2.weight") ||
          ends_with(name, ".w3.weight"));
}

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                         uint8_t* codes, float* scale_inv) {
  const int64_t n_cb = (cols + bc - 1) / bc;
  for (int64_t r0 = 0; r0 < rows; r0 += br) {
    const int64_t r1 = std::min(rows, r0 + br);
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t c1 = std::min(cols, c0 + bc);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float scale = amax / 448.0f;
      scale_inv[r0 / br * n_cb + c0 / bc] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          codes[r * cols + c] = scale > 0.0f ? f32_to_e4m3(w[r * cols + c] / scale) : 0;
    }
  }
}

std::vector<TensorData> fp8_checkpoint_tensors(const TensorData& t) {
  DUET_CHECK(t.dtype == DType::kF32, t.name << ": expected f32, found " << dtype_name(t.dtype));
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  if (t.shape.size() != 2 || !fp8_quantized_name(t.name)) {
    TensorData b{t.name, DType::kBF16, t.shape, std::vector<uint8_t>(static_cast<size_t>(2 * n))};
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, t.bytes.data() + 4 * i, 4);
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(b.bytes.data() + 2 * i, &h, 2);
    }
    return {b};
  }
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const std::vector<int64_t> sshape = {(rows + kFp8Block - 1) / kFp8Block,
                                       (cols + kFp8Block - 1) / kFp8Block};
  TensorData codes{t.name, DType::kF8E4M3, t.shape, std::vector<uint8_t>(static_cast<size_t>(n))};
  TensorData scales{t.name + "_scale_inv", DType::kF32, sshape,
                    std::vector<uint8_t>(static_cast<size_t>(sshape[0] * sshape[1] * 4))};
  std::vector<float> s(static_cast<size_t>(sshape[0] * sshape[1]));
  std::vector<float> wv(static_cast<size_t>(n));
  std::memcpy(wv.data(), t.bytes.data(), wv.size() * 4);  // the bytes need not be aligned for f32
  quantize_fp8_blocks(wv.data(), rows, cols, kFp8Block, kFp8Block, codes.bytes.data(), s.data());
  std::memcpy(scales.bytes.data(), s.data(), s.size() * 4);
  return {codes, scales};
}

nlohmann::json fp8_quantization_config() {
  return {{"quant_method", "fp8"},
          {"fmt", "e4m3"},
          {"weight_block_size", {kFp8Block, kFp8Block}},
          {"activation_scheme", "dynamic"}};
}

}  // namespace duet
