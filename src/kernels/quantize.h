// Group-wise symmetric int8 weights (DType::kQ8, --quantization int8): each row is cut into groups
// of kQ8Group columns, each group stored as int8 values q and one scale d = max|w| / 127, so
// that w ≈ d · q with q = round(w / d) in [-127, 127] (to nearest even), as llama.cpp's Q8_0.
//
// The scales are 16-bit with f32's range: d is stored as D · s, D = 2^e one f32 factor per row
// and s an f16, e chosen so that the row's largest |d| / D lies in [2^14, 2^15) (D at least
// 2^-149). s = d / D rounded to nearest even in f16 (the division is exact), and q is rounded
// against the stored D · s. So every group within 2^-28 of its row's largest scale keeps f16's
// 11 significant bits, whatever the row's magnitude (a plain f16 d underflows below 6e-8 · 127
// and overflows above 65504 · 127, which bf16 weights reach); groups down to 2^-38 of it keep
// fewer bits (f16 subnormals), and below 2^-39 their scale and values are 0 (such a group's
// weights are below 2^-32 of the row's largest step). The kernels widen a block's s (F16C) and
// multiply them by D in registers, exactly, so they compute with d itself. Q8_0's f16 scale reads
// 1.0625 bytes per weight; this 1.0625 and 4 bytes per row.
//
// Layout, for the integer dot products (vpdpbusd sums 4 byte products per 32-bit lane): rows in
// blocks of kQ8BlockRows = 4 (the last padded with zero rows), columns in superblocks of
// kQ8Align = 128 (4 groups; padded with zeros). A block's superblock is 8 vectors of 64 bytes;
// lane L = 4 · r + j (row r of the block, group j of the superblock) of vector k holds bytes
// [4k, 4k + 4) of that row's group, as q + 128 (uint8, the unsigned operand of vpdpbusd). So 8
// vpdpbusd accumulate the exact dot products of 16 (row, group) pairs, one per lane, with
// no shuffles; the 16 scales of a block's superblock are stored together in the same order:
//   data       [rows / 4, ld / 128, 8, 16, 4] uint8, ld = q8_ld(cols)
//   scales     [rows / 4, ld / 128, 16] f16 (s)
//   row_scales [rows] f32 (D; rows padded to a multiple of 4)
//
// Group-wise symmetric int4 weights (DType::kQ4, --quantization int4): the same groups, each
// stored as 4-bit values q in [-8, 7] and one scale d = m / -8, m the group's weight of
// largest magnitude (so m itself is exact, at -8, when d is), q = round(w / d) clamped to
// [-8, 7]: the 16 levels of llama.cpp's Q4_0, which has the same rule and an f16 scale. d is
// stored as for kQ8 (0.5625 bytes per weight and 4 per row).
// Layout: the blocks, superblocks and scales of kQ8, each block's superblock in 4 vectors of 64
// bytes: byte i of lane L = 4 · r + j of vector v holds q + 8 of elements 4v + i (low nibble)
// and 16 + 4v + i (high nibble) of that row's group j, so the low nibbles of vector v are kQ8's
// step v and the high nibbles its step v + 4:
//   data       [rows / 4, ld / 128, 4, 16, 4] uint8 (two values each)
//   scales     [rows / 4, ld / 128, 16] f16
//   row_scales [rows] f32
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/huge_pages.h"
#include "core/tensor.h"

namespace duet {

// The group rule alone, with f32 scales: row r of `cols` f32 or bf16 weights (as `dtype` says)
// into q [q8_ld(cols)] int8 and scales [q8_ld(cols) / kQ8Group] f32, each group's d exactly as
// the rule gives it; the padding past cols is zero, with scale 0. QuantizedMatrix stores the
// scales in 16 bits (quantize_row).
void quantize_row_q8(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales);

// v rounded to the nearest integer, ties to even, for |v| < 2^22 (as std::nearbyint in the
// default rounding mode, without its library call): adding 1.5 · 2^23 leaves no fraction bits.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// The same for int4: q [q8_ld(cols)] in [-8, 7], one an int8, and scales [q8_ld(cols) /
// kQ8Group] f32, as the rule gives them; zero past cols.
void quantize_row_q4(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales);

// The row factor D of a row whose group scales are scales[n_groups] (f32, as the rule gives
// them): 2^e with max |scale| / D in [2^14, 2^15), e ≥ -149; 0 for a row of zero scales.
float row_scale_for(const float* scales, int64_t n_groups);

// A row as QuantizedMatrix stores it (`to` kQ8 or kQ4): the rule's scales d, the row factor
// row_scale = row_scale_for(d), scales [q8_ld(cols) / kQ8Group] f16 = d / row_scale rounded to
// nearest even, and q [q8_ld(cols)] rounded against row_scale · f16 scale (zero past cols).
void quantize_row(DType to, DType dtype, const void* row, int64_t cols, int8_t* q, uint16_t* scales,
                  float& row_scale);

// Value q (in [-127, 127] for kQ8, [-8, 7] for kQ4) and scale d of weight (r, k) of a kQ8 or kQ4
// matrix: w ≈ d · q, d = q8_row_scale · q8_group_scale (the f16 widened; the product is exact
// unless it falls below f32's normal range).
int q8_value(const Matrix& w, int64_t r, int64_t k);
float q8_scale(const Matrix& w, int64_t r, int64_t k);
float q8_group_scale(const Matrix& w, int64_t r, int64_t k);
float q8_row_scale(const Matrix& w, int64_t r);

// A quantized copy of a weight matrix, in memory of its own or an arena's (64-byte aligned).
class QuantizedMatrix {
 public:
  // w (kF32, kBF16 or kF8E4M3 with its block scales, rows as stored; panels ignored) quantized
  // row by row to `to` (kQ8, kQ4), into memory of its own or, given an arena, into the arena's
  // (which must outlive this). An fp8 weight is quantized as its value (fp8_weight) in f32.
  QuantizedMatrix(const Matrix& w, DType to, HugePageArena* arena = nullptr);
  // Row r's values q [q8_ld(cols)] (in [-8, 7] for kQ4, [-127, 127] for kQ8; zero past cols,
  // which they are on entry) and its group scales d [q8_ld(cols) / kQ8Group] (f32, zero on entry).
  using RowValues = std::function<void(int64_t r, int8_t* q, float* d)>;
  // A matrix of given values and scales (a checkpoint's, quantized already): weight (r, k) is
  // d[k / kQ8Group] · q[k] of row r, exactly. Throws duet::Error naming `what` for a scale the
  // layout's 16-bit scales cannot hold exactly (one below 2^-28 of its row's largest).
  QuantizedMatrix(DType to, int64_t rows, int64_t cols, const RowValues& values,
                  const std::string& what, HugePageArena* arena = nullptr);
  // The kQ8 or kQ4 view, valid as long as this lives.
  const Matrix& view() const { return view_; }

 private:
  // Writes row r's values (all q8_ld(cols) of them), f16 scales and row factor.
  using RowFill = std::function<void(int64_t r, int8_t* q, uint16_t* s, float& row_scale)>;
  void build(DType to, int64_t rows, int64_t cols, HugePageArena* arena, const RowFill& fill);

  struct FreeAligned {
    void operator()(void* p) const;
  };
  // Values, scales, row factors (the layouts above); null when they are in an arena.
  std::unique_ptr<void, FreeAligned> mem_;
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

// w (kQ8 or kQ4) back to f32: [w.rows, w.cols], element (r, c) = q8_scale · q. For tests and
// references.
std::vector<float> dequantize_int(const Matrix& w);

}  // namespace duet
