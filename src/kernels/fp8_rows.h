// Rows of f32 values carried as 8-bit floats (OCP FP8 E4M3: 4 exponent bits, bias 7, 3 mantissa
// bits, largest finite 448), the way DeepEP's fp8 dispatch carries hidden states: each group of
// kFp8Group consecutive values shares one f32 scale, the group's largest magnitude / 448, and
// each value is stored as the E4M3 nearest (ties to even) to value × (448 / largest), so the
// largest maps to ±448 and the relative error of a value is at most 2^-4 (above the group's
// largest / 2^15, where E4M3 runs out of exponent, the absolute error is at most scale × 2^-10).
// A group of zeros has scale 0. Values must be finite (a row with an infinity or NaN does not
// survive). AVX-512 where the CPU has it, else the scalar versions, which give the same bits.
#pragma once

#include <cstdint>

namespace duet {

constexpr int64_t kFp8Group = 128;
inline int64_t fp8_groups(int64_t n) {
  return (n + kFp8Group - 1) / kFp8Group;
}

// The E4M3 code nearest to q (ties to even), saturated at ±448; q finite.
uint8_t f32_to_e4m3(float q);
// The value of an E4M3 code (0x7f and 0xff, E4M3's NaNs, are never written by f32_to_e4m3).
float e4m3_to_f32(uint8_t c);

// x[n] as scales[fp8_groups(n)] and codes[n].
void f32_to_fp8_row(const float* x, int64_t n, float* scales, uint8_t* codes);
// y[n] = the values the scales and codes stand for: e4m3_to_f32(code) × its group's scale.
void fp8_to_f32_row(const float* scales, const uint8_t* codes, int64_t n, float* y);
// y[n] += alpha × those values.
void axpy_fp8(float alpha, const float* scales, const uint8_t* codes, int64_t n, float* y);

namespace fp8_impl {
// The scalar versions (tests compare the dispatching ones with them).
void f32_to_fp8_row_scalar(const float* x, int64_t n, float* scales, uint8_t* codes);
void fp8_to_f32_row_scalar(const float* scales, const uint8_t* codes, int64_t n, float* y);
void axpy_fp8_scalar(float alpha, const float* scales, const uint8_t* codes, int64_t n, float* y);
}  // namespace fp8_impl

}  // namespace duet
