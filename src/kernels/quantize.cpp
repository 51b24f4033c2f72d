#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace duet {

namespace {

float weight_value(DType dtype, const void* row, int64_t k) {
  if (dtype == DType::kF32) return static_cast<const float*>(row)[k];
  uint16_t h;
  std::memcpy(&h, static_cast<const uint16_t*>(row) + k, 2);
  return bf16_to_f32(h);
}

}  // namespace

void quantize_row_q8(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales) {
  DUET_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
             "quantize_row_q8: weight dtype " << dtype_name(dtype));
  const int64_t ld = q8_ld(cols);
  float w[kQ8Group];
  for (int64_t g = 0; g < ld / kQ8Group; ++g) {
    const int64_t k0 = g * kQ8Group, n = std::clamp<int64_t>(cols - k0, 0, kQ8Group);
    float amax = 0.0f;
    for (int64_t i = 0; i < kQ8Group; ++i) {
      w[i] = i < n ? weight_value(dtype, row, k0 + i) : 0.0f;
      amax = std::max(amax, std::fabs(w[i]));
    }
    const float d = amax / 127.0f;
    scales[g] = d;
    for (int64_t i = 0; i < kQ8Group; ++i) {
      const float v = d > 0.0f ? std::nearbyint(w[i] / d) : 0.0f;
      q[k0 + i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

void Q8Matrix::FreeAligned::operator()(void* p) const {
  std::free(p);
}

Q8Matrix::Q8Matrix(const Matrix& w) {
  DUET_CHECK(w.rows >= 0 && w.cols >= 0 && (w.rows * w.cols == 0 || w.data),
             "Q8Matrix: [" << w.rows << ", " << w.cols << "] at " << w.data);
  const int64_t ld = q8_ld(w.cols), n_groups = ld / kQ8Group;
  const size_t q_bytes = static_cast<size_t>(w.rows * ld);
  const size_t bytes = q_bytes + static_cast<size_t>(w.rows * n_groups) * sizeof(float);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  DUET_CHECK(p, "Q8Matrix: out of memory for " << bytes << " bytes");
  mem_.reset(p);
  auto* q = static_cast<int8_t*>(p);
  auto* scales = reinterpret_cast<float*>(q + q_bytes);
  const size_t elem = dtype_size(w.dtype);
  for (int64_t r = 0; r < w.rows; ++r) {
    quantize_row_q8(w.dtype, static_cast<const char*>(w.data) + r * w.cols * elem, w.cols,
                    q + r * ld, scales + r * n_groups);
  }
  view_.dtype = DType::kQ8;
  view_.rows = w.rows;
  view_.cols = w.cols;
  view_.data = q;
  view_.scales = scales;
}

std::vector<float> dequantize_q8(const Matrix& w) {
  DUET_CHECK(w.dtype == DType::kQ8, "dequantize_q8: dtype " << dtype_name(w.dtype));
  const int64_t ld = q8_ld(w.cols), n_groups = ld / kQ8Group;
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  const auto* q = static_cast<const int8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t k = 0; k < w.cols; ++k) {
      out[r * w.cols + k] = w.scales[r * n_groups + k / kQ8Group] * q[r * ld + k];
    }
  }
  return out;
}

}  // namespace duet
