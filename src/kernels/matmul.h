// Matrix products of f32 activations with weight matrices (bf16 or f32), accumulating in f32.
// The SIMD path (AVX-512, AVX2, scalar) is chosen once at run time from the CPU's features.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace duet {

// The rows of x a product reads: contiguous (row t at base + t · cols) or gathered in place, row t
// at rows[t] (a MoE layer's experts read the tokens routed to them where the dispatcher received
// them, rather than from a grouped copy). Converts from a contiguous pointer.
struct XRows {
  XRows(const float* contiguous) : base(contiguous) {}  // NOLINT(google-explicit-constructor)
  explicit XRows(const float* const* gathered) : rows(gathered) {}

  const float* row(int64_t t, int64_t cols) const { return rows ? rows[t] : base + t * cols; }
  bool empty() const { return !base && !rows; }

  const float* base = nullptr;
  const float* const* rows = nullptr;
};

// y[n_tokens, w.rows] = x[n_tokens, w.cols] · wᵀ. x and y are contiguous f32; y must not
// alias x. n_tokens may be 0 (nothing happens). Work is split over `pool`.
void matmul(ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens, float* y);

// y[n_tokens, w.cols] = x[n_tokens, w.rows] · w (the weight used untransposed, as MLA's
// absorbed attention multiplies queries by W_UK). Contiguous f32; y must not alias x.
void matmul_xw(ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens, float* y);

// The same products computed the plainest way, for tests and as the fallback.
void matmul_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y);
void matmul_xw_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y);

// Name of the SIMD path in use ("avx512", "avx2" or "scalar"), for logs and benchmarks.
const char* matmul_isa();

}  // namespace duet
