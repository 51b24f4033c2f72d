// Private to src/kernels and its tests: matmul with the instruction set and the loop structure
// chosen by the caller, so tests can check every path against matmul_scalar on this machine.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/simd_impl.h"

namespace duet::matmul_impl {

enum class Path {
  kAuto,    // what matmul() does: kDirect below tiled_min_tokens(dtype) tokens, else kTiled
  kDirect,  // weights read in place, each row once for all tokens (decode)
  kTiled,   // weight panels widened, transposed once and reused by all tokens (prefill)
};

// From this many tokens on kTiled is faster. The direct path widens each bf16 weight vector
// once per block of kMmTokens tokens (from L1) and copies x; the tiled path widens and
// transposes each weight panel once for all tokens and reads x in place, which pays off once
// there are enough tokens to amortise the transposition and x outgrows L2 (BM_MatmulBf16Path on
// this Ice Lake VM, 1024 × 1024, one thread: the two even at 32 tokens, tiled ahead from 48, and
// 2.5× ahead at 512). For f32 the tiled path only saves the copy of x.
inline int64_t tiled_min_tokens(DType dtype) {
  return dtype == DType::kBF16 ? 48 : 64;
}

// matmul() on a given instruction set (which must be supported) and path.
void matmul_with(simd::Isa isa, Path path, ThreadPool& pool, const Matrix& w, const float* x,
                 int64_t n_tokens, float* y);

// Part of matmul() on the calling thread: y[t * ldy + r - r_begin] = x[t] · w[r] for r in
// [r_begin, r_end) and t < n_tokens, x's rows contiguous or gathered. The building block of
// kernels that split several products over one pool themselves (grouped_matmul.h).
void matmul_rows_with(simd::Isa isa, Path path, const Matrix& w, XRows x, int64_t n_tokens,
                      float* y, int64_t ldy, int64_t r_begin, int64_t r_end);

// matmul_xw() on a given instruction set (which must be supported).
void matmul_xw_with(simd::Isa isa, ThreadPool& pool, const Matrix& w, const float* x,
                    int64_t n_tokens, float* y);

}  // namespace duet::matmul_impl
