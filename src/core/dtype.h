// Element types of weights and their conversions. Activations are always f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace duet {

// kF8E4M3: OCP FP8 E4M3 codes (kernels/fp8_rows.h), stored as fp8 checkpoints publish them,
// with one f32 scale per block of weights beside them (Matrix::f8).
// kQ8 and kQ4 are weight layouts of their own (--quantization int8 | int4, kernels/quantize.h),
// never a file's: int8 or int4 values in groups of kQ8Group columns, each group with one f16
// scale relative to an f32 factor per row.
// kI32, kI64: a file's integers only (compressed-tensors' weight_packed, weight_shape), never a
// matrix the kernels read.
enum class DType { kF32, kF16, kBF16, kF8E4M3, kQ8, kQ4, kI32, kI64 };

// The weights quantized at load, whose products quantize x to int8 (kernels/matmul_q8_impl.h).
inline bool is_int_quantized(DType t) {
  return t == DType::kQ8 || t == DType::kQ4;
}

// Bytes per element; for kF8E4M3 and kQ8 those of the codes or int8 values, the scales apart;
// kQ4 packs two values in a byte and is sized by Matrix::nbytes alone (1 here).
inline size_t dtype_size(DType t) {
  if (t == DType::kF8E4M3 || is_int_quantized(t)) return 1;
  if (t == DType::kI64) return 8;
  return t == DType::kF32 || t == DType::kI32 ? 4 : 2;
}

// kQ8: columns per group (one scale each), as llama.cpp's Q8_0; rows are padded with zeros to a
// multiple of kQ8Align columns (q8_ld) and, in blocks of kQ8BlockRows rows, interleaved so that
// one 64-byte vector holds 4 bytes of each of 4 groups of each of the block's rows
// (kernels/quantize.h). kQ4 has the same groups, blocks and scales, a block's superblock in half
// the bytes.
constexpr int64_t kQ8Group = 32;
constexpr int64_t kQ8Align = 128;
constexpr int64_t kQ8BlockRows = 4;
inline int64_t q8_ld(int64_t cols) {
  return (cols + kQ8Align - 1) / kQ8Align * kQ8Align;
}

// The safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "I32", "I64".
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kQ8:
      return "Q8";
    case DType::kQ4:
      return "Q4";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as F16C's vcvtps2ph does: subnormals kept, magnitudes from 65520 on
// to infinity, NaN stays NaN.
inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // ≥ 65520 (half-way to 2^16): infinity
  if (u < 0x38800000u) {                        // below 2^-14: a multiple of 2^-24
    float a;
    std::memcpy(&a, &u, 4);
    // a · 2^24 is exact and below 2^10, so adding 1.5 · 2^23 rounds it to an integer, ties to
    // even; 2^10 itself is the smallest normal's code.
    const float m = (a * 0x1p24f + 12582912.0f) - 12582912.0f;
    return sign | static_cast<uint16_t>(m);
  }
  u -= 0x38000000u;                 // exponent bias 127 -> 15
  u += 0x0fffu + ((u >> 13) & 1u);  // round the 13 dropped bits to nearest even
  return sign | static_cast<uint16_t>(u >> 13);
}

}  // namespace duet
