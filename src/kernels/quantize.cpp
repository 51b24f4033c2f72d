#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul_fp8.h"

namespace duet {

namespace {

float weight_value(DType dtype, const void* row, int64_t k) {
  if (dtype == DType::kF32) return static_cast<const float*>(row)[k];
  uint16_t h;
  std::memcpy(&h, static_cast<const uint16_t*>(row) + k, 2);
  return bf16_to_f32(h);
}

// Offsets of weight (r, k) and of its group's scale in the kQ8 layout of quantize.h.
int64_t value_offset(int64_t ld, int64_t r, int64_t k) {
  const int64_t lane = (r % kQ8BlockRows) * 4 + (k % kQ8Align) / kQ8Group;
  return (r / kQ8BlockRows) * kQ8BlockRows * ld + (k / kQ8Align) * 512 + (k % kQ8Group) / 4 * 64 +
         lane * 4 + k % 4;
}
int64_t scale_offset(int64_t ld, int64_t r, int64_t k) {
  const int64_t lane = (r % kQ8BlockRows) * 4 + (k % kQ8Align) / kQ8Group;
  return (r / kQ8BlockRows) * kQ8BlockRows * (ld / kQ8Group) + (k / kQ8Align) * 16 + lane;
}

// kQ4: the byte of weight (r, k), and whether it is the high nibble. Element i of a group sits
// where kQ8 puts element i % 16, in half the bytes (kQ8's steps 0-3 and 4-7 share a vector).
int64_t q4_offset(int64_t ld, int64_t r, int64_t k) {
  const int64_t lane = (r % kQ8BlockRows) * 4 + (k % kQ8Align) / kQ8Group;
  return (r / kQ8BlockRows) * kQ8BlockRows * ld / 2 + (k / kQ8Align) * 256 +
         (k % (kQ8Group / 2)) / 4 * 64 + lane * 4 + k % 4;
}
bool q4_high(int64_t k) {
  return k % kQ8Group >= kQ8Group / 2;
}

void check_q8(const Matrix& w, int64_t r, int64_t k) {
  DUET_CHECK(is_int_quantized(w.dtype) && r >= 0 && r < w.rows && k >= 0 && k < q8_ld(w.cols),
             "q8 element (" << r << ", " << k << ") of " << dtype_name(w.dtype) << " [" << w.rows
                            << ", " << w.cols << "]");
}

// The f32 or bf16 weights of the group starting at k0 of a row of `cols`, zero past cols.
void load_group(DType dtype, const void* row, int64_t cols, int64_t k0, float* w) {
  DUET_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
             "quantize: weight dtype " << dtype_name(dtype));
  const int64_t n = std::clamp<int64_t>(cols - k0, 0, kQ8Group);
  for (int64_t i = 0; i < kQ8Group; ++i) w[i] = i < n ? weight_value(dtype, row, k0 + i) : 0.0f;
}

}  // namespace

int q8_value(const Matrix& w, int64_t r, int64_t k) {
  check_q8(w, r, k);
  const auto* data = static_cast<const uint8_t*>(w.data);
  if (w.dtype == DType::kQ4) {
    const uint8_t b = data[q4_offset(q8_ld(w.cols), r, k)];
    return int(q4_high(k) ? b >> 4 : b & 0x0f) - 8;
  }
  return int(data[value_offset(q8_ld(w.cols), r, k)]) - 128;
}

float q8_group_scale(const Matrix& w, int64_t r, int64_t k) {
  check_q8(w, r, k);
  return f16_to_f32(w.scales[scale_offset(q8_ld(w.cols), r, k)]);
}

float q8_row_scale(const Matrix& w, int64_t r) {
  check_q8(w, r, 0);
  return w.row_scales[r];
}

float q8_scale(const Matrix& w, int64_t r, int64_t k) {
  return q8_row_scale(w, r) * q8_group_scale(w, r, k);
}

namespace {

// The group rules: int8's d = max|w| / 127, int4's d = m / -8 (m the first weight of largest
// magnitude).
float scale_q8(const float* w) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kQ8Group; ++i) amax = std::max(amax, std::fabs(w[i]));
  return amax / 127.0f;
}
float scale_q4(const float* w) {
  float m = 0.0f;
  for (int64_t i = 0; i < kQ8Group; ++i) m = std::fabs(w[i]) > std::fabs(m) ? w[i] : m;
  return m / -8.0f;
}

// Quantizes one row group by group: group g's scale is scale_of(its kQ8Group weights, g), each
// value the nearest-even multiple of it clamped to [lo, hi] (0 where the scale is 0).
template <class ScaleOf>
void quantize_groups(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales,
                     ScaleOf scale_of, float lo, float hi) {
  const int64_t ld = q8_ld(cols);
  float w[kQ8Group];
  for (int64_t g = 0; g < ld / kQ8Group; ++g) {
    const int64_t k0 = g * kQ8Group;
    load_group(dtype, row, cols, k0, w);
    const float d = scale_of(w, g);
    scales[g] = d;
    for (int64_t i = 0; i < kQ8Group; ++i) {
      const float v = d != 0.0f ? round_even(w[i] / d) : 0.0f;
      q[k0 + i] = static_cast<int8_t>(std::clamp(v, lo, hi));
    }
  }
}

}  // namespace

void quantize_row_q8(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales) {
  quantize_groups(
      dtype, row, cols, q, scales, [](const float* w, int64_t) { return scale_q8(w); }, -127.0f,
      127.0f);
}

void quantize_row_q4(DType dtype, const void* row, int64_t cols, int8_t* q, float* scales) {
  quantize_groups(
      dtype, row, cols, q, scales, [](const float* w, int64_t) { return scale_q4(w); }, -8.0f,
      7.0f);
}

float row_scale_for(const float* scales, int64_t n_groups) {
  float amax = 0.0f;
  for (int64_t g = 0; g < n_groups; ++g) amax = std::max(amax, std::fabs(scales[g]));
  if (amax == 0.0f) return 0.0f;
  int e;
  std::frexp(amax, &e);  // amax in [2^(e - 1), 2^e)
  return std::ldexp(1.0f, std::max(e - 15, -149));
}

void quantize_row(DType to, DType dtype, const void* row, int64_t cols, int8_t* q, uint16_t* scales,
                  float& row_scale) {
  DUET_CHECK(is_int_quantized(to), "quantize_row: to " << dtype_name(to));
  const bool q4 = to == DType::kQ4;
  const int64_t n_groups = q8_ld(cols) / kQ8Group;
  std::vector<float> d(static_cast<size_t>(n_groups));  // the rule's scales, then the stored
  float w[kQ8Group];
  for (int64_t g = 0; g < n_groups; ++g) {
    load_group(dtype, row, cols, g * kQ8Group, w);
    d[g] = q4 ? scale_q4(w) : scale_q8(w);
  }
  row_scale = row_scale_for(d.data(), n_groups);
  for (int64_t g = 0; g < n_groups; ++g) {
    // d / row_scale is exact (a power of two, the quotient below 2^15): only the f16 rounds.
    scales[g] = row_scale != 0.0f ? f32_to_f16(d[g] / row_scale) : 0;
    d[g] = row_scale * f16_to_f32(scales[g]);
  }
  quantize_groups(
      dtype, row, cols, q, d.data(), [&](const float*, int64_t g) { return d[g]; },
      q4 ? -8.0f : -127.0f, q4 ? 7.0f : 127.0f);
}

void QuantizedMatrix::FreeAligned::operator()(void* p) const {
  std::free(p);
}

QuantizedMatrix::QuantizedMatrix(const Matrix& w, DType to, HugePageArena* arena) {
  DUET_CHECK(w.rows >= 0 && w.cols >= 0 && (w.rows * w.cols == 0 || w.data),
             "QuantizedMatrix: [" << w.rows << ", " << w.cols << "] at " << w.data);
  const size_t elem = dtype_size(w.dtype);
  std::vector<float> widened(w.dtype == DType::kF8E4M3 ? static_cast<size_t>(w.cols) : 0);
  build(to, w.rows, w.cols, arena,
        [&](int64_t r, int8_t* row_q, uint16_t* row_s, float& row_scale) {
          const void* row = static_cast<const char*>(w.data) + r * w.cols * elem;
          if (w.dtype == DType::kF8E4M3) {  // each weight's value, as fp8_weight gives it
            for (int64_t c = 0; c < w.cols; ++c) widened[c] = fp8_weight(w, r, c);
            quantize_row(to, DType::kF32, widened.data(), w.cols, row_q, row_s, row_scale);
          } else {
            quantize_row(to, w.dtype, row, w.cols, row_q, row_s, row_scale);
          }
        });
}

QuantizedMatrix::QuantizedMatrix(DType to, int64_t rows, int64_t cols, const RowValues& values,
                                 const std::string& what, HugePageArena* arena) {
  const int64_t n_groups = q8_ld(cols) / kQ8Group;
  std::vector<float> d(static_cast<size_t>(n_groups));
  build(to, rows, cols, arena,
        [&](int64_t r, int8_t* row_q, uint16_t* row_s, float& row_scale) {
          std::fill_n(row_q, q8_ld(cols), int8_t{0});
          std::fill(d.begin(), d.end(), 0.0f);
          values(r, row_q, d.data());
          row_scale = row_scale_for(d.data(), n_groups);
          for (int64_t g = 0; g < n_groups; ++g) {
            row_s[g] = row_scale != 0.0f ? f32_to_f16(d[g] / row_scale) : 0;
            if (row_scale * f16_to_f32(row_s[g]) != d[g]) {
              DUET_ERROR(what << ": the scale " << d[g] << " of row " << r << ", columns "
                              << g * kQ8Group << ".., is not one the 16-bit scales hold exactly "
                              << "(11 significant bits, down to 2^-28 of the row's largest)");
            }
          }
        });
}

void QuantizedMatrix::build(DType to, int64_t rows, int64_t cols, HugePageArena* arena,
                            const RowFill& fill) {
  DUET_CHECK(is_int_quantized(to), "QuantizedMatrix: to " << dtype_name(to));
  const bool q4 = to == DType::kQ4;
  const int64_t ld = q8_ld(cols), n_groups = ld / kQ8Group;
  const int64_t padded_rows = (rows + kQ8BlockRows - 1) / kQ8BlockRows * kQ8BlockRows;
  const size_t q_bytes = static_cast<size_t>(padded_rows * ld / (q4 ? 2 : 1));
  const size_t scale_bytes = static_cast<size_t>(padded_rows * n_groups) * sizeof(uint16_t);
  const size_t bytes = q_bytes + scale_bytes + static_cast<size_t>(padded_rows) * sizeof(float);
  const size_t alloc_bytes = (bytes + 63) / 64 * 64 + 64;
  void* p = arena ? arena->allocate(alloc_bytes) : std::aligned_alloc(64, alloc_bytes);
  DUET_CHECK(p, "QuantizedMatrix: out of memory for " << bytes << " bytes");
  if (!arena) mem_.reset(p);
  auto* q = static_cast<uint8_t*>(p);
  auto* scales = reinterpret_cast<uint16_t*>(q + q_bytes);
  auto* row_scales = reinterpret_cast<float*>(q + q_bytes + scale_bytes);
  std::memset(q, q4 ? 0x88 : 0x80, q_bytes);  // padding: value 0
  std::fill_n(scales, padded_rows * n_groups, uint16_t{0});
  std::fill_n(row_scales, padded_rows, 0.0f);
  std::vector<int8_t> row_q(static_cast<size_t>(ld));
  std::vector<uint16_t> row_s(static_cast<size_t>(n_groups));
  for (int64_t r = 0; r < rows; ++r) {
    fill(r, row_q.data(), row_s.data(), row_scales[r]);
    if (q4) {
      for (int64_t k = 0; k < ld; ++k) {
        uint8_t& b = q[q4_offset(ld, r, k)];
        const auto u = static_cast<uint8_t>(row_q[k] + 8);
        b = q4_high(k) ? uint8_t((b & 0x0f) | (u << 4)) : uint8_t((b & 0xf0) | u);
      }
    } else {
      for (int64_t k = 0; k < ld; ++k) q[value_offset(ld, r, k)] = uint8_t(row_q[k] + 128);
    }
    for (int64_t g = 0; g < n_groups; ++g) scales[scale_offset(ld, r, g * kQ8Group)] = row_s[g];
  }
  view_.dtype = to;
  view_.rows = rows;
  view_.cols = cols;
  view_.data = q;
  view_.scales = scales;
  view_.row_scales = row_scales;
}

std::vector<float> dequantize_int(const Matrix& w) {
  DUET_CHECK(is_int_quantized(w.dtype), "dequantize_int: dtype " << dtype_name(w.dtype));
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t k = 0; k < w.cols; ++k)
      out[r * w.cols + k] = q8_scale(w, r, k) * q8_value(w, r, k);
  }
  return out;
}

}  // namespace duet
