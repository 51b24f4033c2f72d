// Element-wise and row-wise f32 kernels used by every architecture. All pointers are f32,
// contiguous; "in place" is allowed where a comment says so.
#pragma once

#include <cstdint>

namespace duet {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:] for r < n_rows; x, y: [n_rows, n];
// w: [n]. y may equal x. The sum of squares is accumulated in f32 (as torch does for f32).
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);

// out[i] = silu(gate[i]) * up[i], silu(v) = v / (1 + exp(-v)); out may equal gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// x[:n] = softmax(x[:n]) in place, max-subtracted. n >= 1.
void softmax(float* x, int64_t n);

// The index of the first largest of x[:n] (n >= 1), or -1 if some x[i] is NaN or infinite.
int64_t argmax_finite(const float* x, int64_t n);

// The index of the first x[i] > t (i < n), or n if none is: a top-k scan's filter, which sees
// nearly every value fall below its k-th best so far.
int64_t first_above(const float* x, int64_t n, float t);

// Writes the indices i < n with x[i] >= t to ids in increasing order and returns their count m:
// top-p's filter of the tokens that can be in the nucleus. ids has room for n + 16 values; those
// past m are left undefined.
int64_t indices_at_least(const float* x, int64_t n, float t, int32_t* ids);

// Values per block of exp_scaled's block sums.
inline constexpr int64_t kExpBlock = 256;

// y[i] = exp(x[i] / t - m) for i < n (t > 0), returning Σ y[i]: a sampler's unnormalised
// probabilities at temperature t, m the largest x[i] / t. y may equal x. With block_sums,
// block_sums[b] = Σ y[i] over [b kExpBlock, (b + 1) kExpBlock) ∩ [0, n), summed in double, and
// the result is Σ block_sums[b] in order: a draw finds its block, then its value, in two short
// scans instead of one chain of n additions.
double exp_scaled(const float* x, int64_t n, float t, float m, float* y,
                  double* block_sums = nullptr);

// Σ a[i] b[i].
float dot(const float* a, const float* b, int64_t n);

// y[i] += alpha * x[i].
void axpy(float alpha, const float* x, int64_t n, float* y);

// y[i] += x[i].
void add_inplace(const float* x, int64_t n, float* y);

// y[i] = x[i] rounded to bf16 (to nearest even, NaN kept: f32_to_bf16).
void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y);
// y[i] = x[i] widened from bf16 (exact).
void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y);
// y[i] += alpha * x[i], x bf16.
void axpy_bf16(float alpha, const uint16_t* x, int64_t n, float* y);

}  // namespace duet
