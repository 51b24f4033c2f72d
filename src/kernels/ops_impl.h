// Private to src/kernels and its tests: each op of ops.h on one instruction set, so tests can
// check the AVX-512 versions against the scalar ones. ops.h's functions pick AVX-512 when the
// CPU has it and the scalar versions otherwise (these ops are a small share of a step; AVX2
// machines use the scalar code).
#pragma once

#include <cstdint>

namespace duet::ops_impl {

// Plain loops; sums (sum of squares, dot, softmax denominator) accumulate in double, which
// makes them the reference for the tests.
namespace scalar {
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// Returns the log-sum-exp of the x it was given: max + log(Σ exp(x - max)).
float softmax(float* x, int64_t n);
int64_t argmax_finite(const float* x, int64_t n);
int64_t first_above(const float* x, int64_t n, float t);
int64_t indices_at_least(const float* x, int64_t n, float t, int32_t* ids);
double exp_scaled(const float* x, int64_t n, float t, float m, float* y, double* block_sums);
float dot(const float* a, const float* b, int64_t n);
void axpy(float alpha, const float* x, int64_t n, float* y);
void add_inplace(const float* x, int64_t n, float* y);
void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y);
void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y);
void axpy_bf16(float alpha, const uint16_t* x, int64_t n, float* y);
}  // namespace scalar

// Call only when simd::isa_supported(simd::Isa::kAvx512). Sums accumulate in f32 over 64
// lanes; exp is a polynomial within 1 ulp of std::exp for normal results (exp16 in ops.cpp).
namespace avx512 {
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
float softmax(float* x, int64_t n);  // returns the log-sum-exp, as scalar's
int64_t argmax_finite(const float* x, int64_t n);
int64_t first_above(const float* x, int64_t n, float t);
int64_t indices_at_least(const float* x, int64_t n, float t, int32_t* ids);
double exp_scaled(const float* x, int64_t n, float t, float m, float* y, double* block_sums);
float dot(const float* a, const float* b, int64_t n);
void axpy(float alpha, const float* x, int64_t n, float* y);
void add_inplace(const float* x, int64_t n, float* y);
void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y);
void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y);
void axpy_bf16(float alpha, const uint16_t* x, int64_t n, float* y);
}  // namespace avx512

// Whether ops.h's functions (and fp8_rows.h's) take the AVX-512 versions on this CPU.
bool use_avx512();

}  // namespace duet::ops_impl
