// Group-wise symmetric int8 weights (DType::kQ8, --quantization int8): each row is cut into groups
// of kQ8Group columns, each group stored as int8 values q and one f32 scale d = max|w| / 127, so
// that w ≈ d · q with q = round(w / d) in [-127, 127] (to nearest even). llama.cpp's Q8_0 has the
// same groups with an f16 scale; an f32 one costs 1/32 byte more per weight and keeps every
// bf16 weight's range (an f16 scale underflows below 6e-8 · 127).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace duet {

// Quantizes row r of `cols` f32 or bf16 weights (as `dtype` says) into q [q8_ld(cols)] int8 and
// scales [q8_ld(cols) / kQ8Group] f32; the padding past cols is zero, with scale 0.
void quantize_row_q8(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales);

// A quantized copy of a weight matrix, owning its memory (64-byte aligned).
class Q8Matrix {
 public:
  // w (kF32 or kBF16, rows as stored; panels ignored) quantized row by row.
  explicit Q8Matrix(const Matrix& w);
  // The kQ8 view, valid as long as this lives.
  const Matrix& view() const { return view_; }

 private:
  struct FreeAligned {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeAligned> mem_;  // values, then scales
  Matrix view_;
};

// w (kQ8) back to f32: [w.rows, w.cols], element (r, c) = scale · q. For tests and references.
std::vector<float> dequantize_q8(const Matrix& w);

}  // namespace duet
