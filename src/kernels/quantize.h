// Group-wise symmetric int8 weights (DType::kQ8, --quantization int8): each row is cut into groups
// of kQ8Group columns, each group stored as int8 values q and one f32 scale d = max|w| / 127, so
// that w ≈ d · q with q = round(w / d) in [-127, 127] (to nearest even). llama.cpp's Q8_0 has the
// same groups with an f16 scale; an f32 one costs 1/32 byte more per weight and keeps every
// bf16 weight's range (an f16 scale underflows below 6e-8 · 127).
//
// Layout, for the integer dot products (vpdpbusd sums 4 byte products per 32-bit lane): rows in
// blocks of kQ8BlockRows = 4 (the last padded with zero rows), columns in superblocks of
// kQ8Align = 128 (4 groups; padded with zeros). A block's superblock is 8 vectors of 64 bytes;
// lane L = 4 · r + j (row r of the block, group j of the superblock) of vector k holds bytes
// [4k, 4k + 4) of that row's group, as q + 128 (uint8, the unsigned operand of vpdpbusd). So 8
// vpdpbusd accumulate the exact dot products of 16 (row, group) pairs, one per lane, with
// no shuffles; the 16 scales of a block's superblock are stored together in the same order:
//   data   [rows / 4, ld / 128, 8, 16, 4] uint8, ld = q8_ld(cols)
//   scales [rows / 4, ld / 128, 16] f32
//
// Group-wise symmetric int4 weights (DType::kQ4, --quantization int4): the same groups, each
// stored as 4-bit values q in [-8, 7] and one f32 scale d = m / -8, m the group's weight of
// largest magnitude (so m itself is exact, at -8), q = round(w / d) clamped to [-8, 7]: the 16
// levels of llama.cpp's Q4_0, which has the same rule and an f16 scale.
// Layout: the blocks, superblocks and scales of kQ8, each block's superblock in 4 vectors of 64
// bytes: byte i of lane L = 4 · r + j of vector v holds q + 8 of elements 4v + i (low nibble)
// and 16 + 4v + i (high nibble) of that row's group j, so the low nibbles of vector v are kQ8's
// step v and the high nibbles its step v + 4:
//   data   [rows / 4, ld / 128, 4, 16, 4] uint8 (two values each)
//   scales [rows / 4, ld / 128, 16] f32
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace duet {

// Quantizes row r of `cols` f32 or bf16 weights (as `dtype` says) into q [q8_ld(cols)] int8 and
// scales [q8_ld(cols) / kQ8Group] f32; the padding past cols is zero, with scale 0.
void quantize_row_q8(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales);

// v rounded to the nearest integer, ties to even, for |v| < 2^22 (as std::nearbyint in the
// default rounding mode, without its library call): adding 1.5 · 2^23 leaves no fraction bits.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// Quantizes row r of `cols` f32 or bf16 weights into q [q8_ld(cols)] int4 values (in [-8, 7],
// one an int8) and scales [q8_ld(cols) / kQ8Group] f32, as kQ4 stores them; zero past cols.
void quantize_row_q4(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales);

// Value q (in [-127, 127] for kQ8, [-8, 7] for kQ4) and scale d of weight (r, k) of a kQ8 or kQ4
// matrix: w ≈ d · q.
int q8_value(const Matrix& w, int64_t r, int64_t k);
float q8_scale(const Matrix& w, int64_t r, int64_t k);

// A quantized copy of a weight matrix, owning its memory (64-byte aligned).
class QuantizedMatrix {
 public:
  // w (kF32 or kBF16, rows as stored; panels ignored) quantized row by row to `to` (kQ8, kQ4).
  QuantizedMatrix(const Matrix& w, DType to);
  // The kQ8 or kQ4 view, valid as long as this lives.
  const Matrix& view() const { return view_; }

 private:
  struct FreeAligned {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeAligned> mem_;  // values, then scales (the layouts above)
  Matrix view_;
};

class Q8Matrix : public QuantizedMatrix {
 public:
  explicit Q8Matrix(const Matrix& w) : QuantizedMatrix(w, DType::kQ8) {}
};

class Q4Matrix : public QuantizedMatrix {
 public:
  explicit Q4Matrix(const Matrix& w) : QuantizedMatrix(w, DType::kQ4) {}
};

// w (kQ8 or kQ4) back to f32: [w.rows, w.cols], element (r, c) = scale · q. For tests and
// references.
std::vector<float> dequantize_int(const Matrix& w);

}  // namespace duet
