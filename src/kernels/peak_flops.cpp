#include "kernels/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/simd_impl.h"

namespace duet {

namespace {

constexpr int kChains = 12;             // independent accumulators: > FMA latency × ports
constexpr int64_t kIters = 20'000'000;  // per thread: ≈ 0.1 s at 2 FMA/cycle

// Each runs kIters × kChains FMAs of its width and returns a value that depends on all of them.
DUET_TARGET_AVX512 float run_avx512() {
  using S = simd::Avx512;
  S::V acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = S::set1(1.0f + 0.001f * i);
  const S::V a = S::set1(0.999999f), b = S::set1(1e-7f);
  for (int64_t it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = S::fmadd(acc[i], a, b);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = S::add(acc[0], acc[i]);
  return S::hsum(acc[0]);
}

DUET_TARGET_AVX2 float run_avx2() {
  using S = simd::Avx2;
  S::V acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = S::set1(1.0f + 0.001f * i);
  const S::V a = S::set1(0.999999f), b = S::set1(1e-7f);
  for (int64_t it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = S::fmadd(acc[i], a, b);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = S::add(acc[0], acc[i]);
  return S::hsum(acc[0]);
}

}  // namespace

double measure_peak_flops(ThreadPool& pool, int repeats) {
  // The f32 FMA peak, also on AVX-512 BF16 (where vdpbf16ps does twice the FLOPs of an FMA).
  const simd::Isa used = simd::best_isa();
  const simd::Isa isa = simd::has_dpbf16(used) ? simd::Isa::kAvx512 : used;
  const int lanes = isa == simd::Isa::kAvx512 ? 16 : isa == simd::Isa::kAvx2 ? 8 : 0;
  if (lanes == 0) return 0.0;  // no FMA instructions to measure
  const int64_t n = pool.n_threads();
  std::vector<float> sink(static_cast<size_t>(n));
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        sink[static_cast<size_t>(i)] = isa == simd::Isa::kAvx512 ? run_avx512() : run_avx2();
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * lanes * kChains * double(kIters) * double(n) / s);
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

}  // namespace duet
