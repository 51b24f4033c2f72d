// Non-owning views of weight tensors (usually memory-mapped from safetensors files).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace duet {

// A read-only view: `data` points at shape-product elements of `dtype`, row-major.
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
};

// A weight matrix as linear layers use it: W[rows = n_out, cols = n_in], row-major, y = W x.
struct Matrix {
  // Weight rows per panel of the optional packed copy below.
  static constexpr int64_t kPanelRows = 64;

  DType dtype = DType::kF32;  // kF32, kBF16 or kF8E4M3 (f16 files are widened to f32 at load),
                              // or kQ8, kQ4 (quantized at load)
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;  // kQ8, kQ4: blocks of kQ8BlockRows rows (kernels/quantize.h)
  // Optional: the same weights, in the same dtype, re-laid once at load time as panels of
  // kPanelRows rows each stored column by column, for the matmul kernels that multiply many
  // tokens by a panel at once (kernels/matmul.h, pack_panels). Element (r, k) sits at
  // panels[((r / kPanelRows) * cols + k) * kPanelRows + r % kPanelRows]; rows past `rows` in the
  // last panel are zero. [ceil(rows / kPanelRows), cols, kPanelRows] dtype, or null.
  const void* panels = nullptr;
  // kQ8 and kQ4 only (kernels/quantize.h): the f16 scale of each group relative to its row's
  // factor, blocked as `data`, and the rows' factors (powers of two), [rows padded to
  // kQ8BlockRows] f32; a group's scale is row_scales[r] · scales[...].
  const uint16_t* scales = nullptr;
  const float* row_scales = nullptr;

  // Bytes of the weights as stored (int8 or int4 values, group scales and row factors for kQ8,
  // kQ4), panels apart.
  uint64_t nbytes() const {
    if (!is_int_quantized(dtype)) return static_cast<uint64_t>(rows * cols) * dtype_size(dtype);
    const int64_t padded_rows = (rows + kQ8BlockRows - 1) / kQ8BlockRows * kQ8BlockRows;
    const uint64_t group_bytes = dtype == DType::kQ4 ? kQ8Group / 2 : kQ8Group;
    return static_cast<uint64_t>(padded_rows) *
           ((q8_ld(cols) / kQ8Group) * (group_bytes + sizeof(uint16_t)) + sizeof(float));
  }

  // --- fp8 (dtype kF8E4M3 only) ---
  // The block scales of an fp8 checkpoint's weight (its `weight_scale_inv`): weight (r, c) is
  // e4m3_to_f32(code) × scale_inv[((row0 + r) / block_rows) * ceil(cols / block_cols) +
  // c / block_cols]. row0 is where this matrix starts in the blocks (a row_slice moves it, not
  // scale_inv). Never panels: the codes are read as stored.
  struct BlockScales {
    // [ceil((row0 + rows) / block_rows), ceil(cols / block_cols)] f32
    const float* scale_inv = nullptr;
    int64_t block_rows = 0;
    int64_t block_cols = 0;
    int64_t row0 = 0;
  };
  BlockScales f8 = {};
  // --- end fp8 ---

  // Rows [r0, r0 + n) as a matrix of their own (e.g. one expert's slice or one head). Keeps the
  // panels when r0 starts one. For kQ8 and kQ4, r0 must start a block of kQ8BlockRows rows.
  Matrix row_slice(int64_t r0, int64_t n) const {
    Matrix m = *this;
    m.rows = n;
    m.f8.row0 += r0;  // fp8
    if (is_int_quantized(dtype)) {
      if (r0 % kQ8BlockRows != 0) throw std::logic_error("row_slice of int8 rows mid-block");
      m.data = static_cast<const uint8_t*>(data) + r0 * q8_ld(cols) / (dtype == DType::kQ4 ? 2 : 1);
      m.scales = scales + r0 * (q8_ld(cols) / kQ8Group);
      m.row_scales = row_scales + r0;
      return m;
    }
    m.data = static_cast<const char*>(data) + static_cast<size_t>(r0 * cols) * dtype_size(dtype);
    m.panels =
        panels && r0 % kPanelRows == 0
            ? static_cast<const char*>(panels) + static_cast<size_t>(r0 * cols) * dtype_size(dtype)
            : nullptr;
    return m;
  }
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace duet
