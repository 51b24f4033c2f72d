// Private to src/kernels and its tests: matmul with the instruction set and the loop structure
// chosen by the caller, so tests can check every path against matmul_scalar on this machine.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/simd_impl.h"

namespace duet::matmul_impl {

enum class Path {
  kAuto,    // what matmul() does: kDirect below tiled_min_tokens(dtype) tokens, else kTiled
  kDirect,  // weights read in place, each row once for all tokens (decode)
  kTiled,   // k blocked; bf16 tiles widened to f32 once and reused by all tokens (prefill)
};

// From this many tokens on kTiled is faster. For bf16 it saves widening each weight vector once
// per 4 tokens; for f32 it only keeps the x slice in L1, which pays off later (measured on
// Ice Lake, 1024 and 7168 columns).
inline int64_t tiled_min_tokens(DType dtype) {
  return dtype == DType::kBF16 ? 16 : 64;
}

// matmul() on a given instruction set (which must be supported) and path.
void matmul_with(simd::Isa isa, Path path, ThreadPool& pool, const Matrix& w, const float* x,
                 int64_t n_tokens, float* y);

// matmul_xw() on a given instruction set (which must be supported).
void matmul_xw_with(simd::Isa isa, ThreadPool& pool, const Matrix& w, const float* x,
                    int64_t n_tokens, float* y);

}  // namespace duet::matmul_impl
