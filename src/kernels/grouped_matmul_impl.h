// Private to src/kernels and its tests: the grouped products on an instruction set chosen by the
// caller (which must be supported), so tests can run every path, the emulated AVX-512 BF16 one
// included, on this machine. The public functions use simd::best_isa().
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "kernels/grouped_matmul.h"
#include "kernels/simd_impl.h"

namespace duet::grouped_impl {

void matmul_grouped_with(simd::Isa isa, ThreadPool& pool, const std::vector<MatmulGroup>& groups);

void gated_matmul_grouped_with(simd::Isa isa, ThreadPool& pool,
                               const std::vector<GatedGroup>& groups);

void matmul_grouped_scatter_with(simd::Isa isa, ThreadPool& pool,
                                 const std::vector<ScatterGroup>& groups,
                                 const std::vector<float*>& clear);

}  // namespace duet::grouped_impl
