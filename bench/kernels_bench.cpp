// Micro-benchmarks of the CPU kernels. Decode is bound by reading weights, so matmul reports the
// weight bytes read per second ("weight_GB/s"; compare with ≈ 40 GB/s read bandwidth here) and
// the arithmetic rate ("GFLOP/s", 2 · rows · cols · n_tokens per call).
//
// Args: rows, cols, n_tokens, threads, cold. cold = 1 cycles through enough copies of the
// weights (≥ 256 MiB) that every call reads them from memory, as a decode step does; cold = 0
// reuses one matrix, which then sits in cache.
//
// BM_ReadBandwidth reads 256 MiB (kernels/bandwidth.h's or_words) with the same pool: the ceiling
// for decode, to quote matmul's weight_GB/s against side by side (timings on shared machines drift
// between runs).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/huge_pages.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/attend.h"
#include "kernels/bandwidth.h"
#include "kernels/fp8_rows.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "kernels/matmul_q8_impl.h"
#include "kernels/quantize.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

constexpr size_t kColdBytes = size_t{256} << 20;

void BM_ReadBandwidth(benchmark::State& state) {
  const int n_threads = static_cast<int>(state.range(0));
  const size_t n = kColdBytes / sizeof(uint32_t);
  std::vector<uint32_t> data(n, 1);  // [n] u32, 256 MiB
  ThreadPool pool(n_threads);
  for (auto _ : state) {
    // 1 MiB blocks, so no chunk has a ragged edge.
    const int64_t kBlock = 1 << 18;
    pool.parallel_for(static_cast<int64_t>(n) / kBlock, [&](int64_t begin, int64_t end) {
      uint32_t s = or_words(data.data() + begin * kBlock, (end - begin) * kBlock);
      benchmark::DoNotOptimize(s);
    });
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(kColdBytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_ReadBandwidth)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

// Runs product(copy) once per iteration over the weights' n_copies copies in turn (cold: each
// read from memory, not from cache), keeping its output y alive.
template <typename Product>
void cycle_copies(benchmark::State& state, size_t n_copies, const std::vector<float>& y,
                  Product product) {
  size_t copy = 0;
  for (auto _ : state) {
    product(copy);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    copy = (copy + 1) % n_copies;
  }
}

void BM_MatmulBf16(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t cols = state.range(1);
  const int64_t n_tokens = state.range(2);
  const int n_threads = static_cast<int>(state.range(3));
  const bool cold = state.range(4) != 0;
  const bool packed = state.range(5) != 0;

  const size_t matrix_bytes = static_cast<size_t>(rows * cols) * 2;
  const size_t n_copies = cold ? (kColdBytes + matrix_bytes - 1) / matrix_bytes : 1;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> weights(n_copies *
                                static_cast<size_t>(rows * cols));  // [n_copies, rows, cols] bf16
  for (uint16_t& w : weights) w = f32_to_bf16(normal(rng) * 0.02f);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));  // [n_tokens, cols] f32
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));  // [n_tokens, rows] f32
  const size_t per_copy = static_cast<size_t>(panel_elems(Matrix{DType::kBF16, rows, cols}));
  std::vector<uint16_t> panels(packed ? n_copies * per_copy : 0);  // [n_copies, panel_elems] bf16
  for (size_t c = 0; c < (packed ? n_copies : 0); ++c) {
    pack_panels(
        Matrix{DType::kBF16, rows, cols, weights.data() + c * static_cast<size_t>(rows * cols)},
        panels.data() + c * per_copy);
  }

  ThreadPool pool(n_threads);
  cycle_copies(state, n_copies, y, [&](size_t copy) {
    Matrix w{DType::kBF16, rows, cols, weights.data() + copy * static_cast<size_t>(rows * cols)};
    if (packed) w.panels = panels.data() + copy * per_copy;
    matmul(pool, w, x.data(), n_tokens, y.data());
  });
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(matrix_bytes) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * cols * n_tokens) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(matmul_isa());
}

void matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "n_tokens", "threads", "cold", "panels"});
  for (int64_t cold : {1, 0}) {
    for (int64_t threads : {1, 2}) {
      for (int64_t rows : {1024, 2048, 32000}) {
        for (int64_t n_tokens : {1, 4, 8, 12, 16, 32, 128}) {
          for (int64_t panels : {0, 1}) b->Args({rows, 1024, n_tokens, threads, cold, panels});
        }
      }
    }
  }
  b->UseRealTime();
}

BENCHMARK(BM_MatmulBf16)->Apply(matmul_args);

// Products with fp8 weights (E4M3 codes, an f32 scale per 128 × 128 block, as DeepSeek-V3 ships
// them), from memory (cold 1) or cache (cold 0), on an instruction set (isa: 0 the CPU's best, 1
// AVX-512 without BF16, as on Ice Lake): weight_GB/s counts the codes and scales. The codes are a
// checkpoint's: normal values scaled so that 5 standard deviations reach 448, about 1 in 10^4 of
// them zero or subnormal (uniform random codes would put one in nearly every 64, and the
// kernels widen such groups the slow way); every copy holds the same codes.
void BM_MatmulFp8(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), n_tokens = state.range(2);
  const int n_threads = static_cast<int>(state.range(3));
  const bool cold = state.range(4) != 0;
  const simd::Isa isa = state.range(5) == 0 ? simd::best_isa() : simd::Isa::kAvx512;
  if (!simd::isa_supported(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const int64_t n_scales = (rows + 127) / 128 * ((cols + 127) / 128);
  const size_t matrix_bytes = static_cast<size_t>(rows * cols + 4 * n_scales);
  const size_t n_copies = cold ? (kColdBytes + matrix_bytes - 1) / matrix_bytes : 1;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> codes(n_copies *
                             static_cast<size_t>(rows * cols));  // [n_copies, rows, cols]
  const size_t per_copy = static_cast<size_t>(rows * cols);
  for (size_t i = 0; i < per_copy; ++i) codes[i] = f32_to_e4m3(normal(rng) * (448.0f / 5.0f));
  for (size_t copy = 1; copy < n_copies; ++copy)
    std::copy(codes.begin(), codes.begin() + static_cast<ptrdiff_t>(per_copy),
              codes.begin() + static_cast<ptrdiff_t>(copy * per_copy));
  std::vector<float> scales(n_copies * static_cast<size_t>(n_scales), 0.01f);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));  // [n_tokens, cols] f32
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));  // [n_tokens, rows] f32
  ThreadPool pool(n_threads);
  cycle_copies(state, n_copies, y, [&](size_t copy) {
    Matrix w{DType::kF8E4M3, rows, cols, codes.data() + copy * static_cast<size_t>(rows * cols)};
    w.f8 = {scales.data() + copy * static_cast<size_t>(n_scales), 128, 128, 0};
    matmul_impl::matmul_with(isa, matmul_impl::Path::kAuto, pool, w, x.data(), n_tokens, y.data());
  });
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(matrix_bytes) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * cols * n_tokens) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(simd::isa_name(isa));
}

BENCHMARK(BM_MatmulFp8)
    ->ArgNames({"rows", "cols", "n_tokens", "threads", "cold", "isa"})
    ->ArgsProduct({{512, 2048}, {1024}, {1, 4, 6, 8, 16, 128}, {1, 2}, {1, 0}, {0, 1}})
    ->UseRealTime();

// Products with int8 or int4 weights (--quantization int8 | int4), the weights' values random
// bytes, read from memory (cold 1: copies cycled as for BM_MatmulBf16) or from cache (cold 0, the
// kernel's own ceiling): the rate at which decode streams quantized weights, to quote against
// BM_ReadBandwidth of the same run. weight_GB/s counts values, scales and row factors
// (Matrix::nbytes).
void BM_MatmulQuant(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), n_tokens = state.range(2);
  const int n_threads = static_cast<int>(state.range(3));
  const DType dtype = state.range(4) == 4 ? DType::kQ4 : DType::kQ8;
  const bool cold = state.range(5) != 0;
  const int64_t ld = q8_ld(cols),
                padded_rows = (rows + kQ8BlockRows - 1) / kQ8BlockRows * kQ8BlockRows;
  const size_t value_bytes = static_cast<size_t>(padded_rows * ld / (dtype == DType::kQ4 ? 2 : 1));
  const size_t n_scales = static_cast<size_t>(padded_rows * ld / kQ8Group);
  const uint64_t matrix_bytes = Matrix{dtype, rows, cols}.nbytes();
  const size_t n_copies = cold ? (kColdBytes + matrix_bytes - 1) / matrix_bytes : 1;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> values(n_copies * value_bytes);  // [n_copies, value_bytes] kQ8 / kQ4
  for (uint8_t& v : values) v = static_cast<uint8_t>(rng());
  std::vector<uint16_t> scales(n_copies * n_scales);  // [n_copies, n_scales] f16
  for (uint16_t& v : scales) v = f32_to_f16(20000.0f * (1.0f + 0.1f * normal(rng)));
  std::vector<float> row_scales(n_copies * padded_rows, 0x1p-24f);  // [n_copies, padded_rows]
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));       // [n_tokens, cols] f32
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));  // [n_tokens, rows] f32
  ThreadPool pool(n_threads);
  cycle_copies(state, n_copies, y, [&](size_t copy) {
    Matrix w{dtype, rows, cols, values.data() + copy * value_bytes};
    w.scales = scales.data() + copy * n_scales;
    w.row_scales = row_scales.data() + copy * padded_rows;
    matmul(pool, w, x.data(), n_tokens, y.data());
  });
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(matrix_bytes) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(matmul_isa()) + " " + matmul_int_kernel());
}

BENCHMARK(BM_MatmulQuant)
    ->ArgNames({"rows", "cols", "n_tokens", "threads", "bits", "cold"})
    ->ArgsProduct({{512, 2048, 32000}, {1024}, {1}, {1, 2}, {4, 8}, {1, 0}})
    ->UseRealTime();

// One int8 or int4 kernel (kernel: a matmul_q8::Kernel; those this CPU lacks are skipped) on one
// thread, the weights in cache, timed in the thread's CPU time: the kernels of one instruction
// set side by side in one run, e.g. AVX-VNNI's (here in its EVEX form, avx2vnni-evex) against
// AVX2's. x's quantization is included, as in matmul.
void BM_MatmulQuantKernel(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), n_tokens = state.range(2);
  const DType dtype = state.range(3) == 4 ? DType::kQ4 : DType::kQ8;
  const auto kernel = static_cast<matmul_q8::Kernel>(state.range(4));
  state.SetLabel(matmul_q8::kernel_name(kernel));
  if (!matmul_q8::kernel_supported(kernel)) {
    state.SkipWithError("this CPU lacks the kernel");
    return;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w_f32(static_cast<size_t>(rows * cols));  // [rows, cols] f32
  for (float& v : w_f32) v = normal(rng);
  const QuantizedMatrix w(Matrix{DType::kF32, rows, cols, w_f32.data()}, dtype);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));  // [n_tokens, cols] f32
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));  // [n_tokens, rows] f32
  ThreadPool pool(1);
  cycle_copies(state, 1, y, [&](size_t) {
    matmul_q8::matmul_with(kernel, pool, w.view(), x.data(), n_tokens, y.data());
  });
  state.counters["GOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * cols * n_tokens) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_MatmulQuantKernel)
    ->ArgNames({"rows", "cols", "n_tokens", "bits", "kernel"})
    ->ArgsProduct({{512},
                   {1024},
                   {1, 4, 8, 32, 64},
                   {8, 4},
                   {static_cast<int64_t>(matmul_q8::Kernel::kAvx2),
                    static_cast<int64_t>(matmul_q8::Kernel::kAvx2Vnni),
                    static_cast<int64_t>(matmul_q8::Kernel::kAvx2VnniEvex),
                    static_cast<int64_t>(matmul_q8::Kernel::kAvx512Vnni)}});

// One thread's product on a given path (0 direct, 1 tiled, 2 from panels packed at load time
// as Matrix::panels), with the weights in cache (cold 0)
// or read from memory (cold 1): the arithmetic rate of each kernel, to place tiled_min_tokens
// and to compare with the FMA peak. Timed in the thread's CPU time, so neighbours on a shared
// machine distort it less.
void BM_MatmulBf16Path(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), n_tokens = state.range(2);
  const auto path = state.range(3) == 1 ? matmul_impl::Path::kTiled : matmul_impl::Path::kDirect;
  const bool packed = state.range(3) == 2;
  const bool cold = state.range(4) != 0;
  const size_t matrix_elems = static_cast<size_t>(rows * cols);
  const size_t n_copies = cold ? (kColdBytes + 2 * matrix_elems - 1) / (2 * matrix_elems) : 1;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> weights(n_copies * matrix_elems);  // [n_copies, rows, cols] bf16
  for (uint16_t& w : weights) w = f32_to_bf16(normal(rng) * 0.02f);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));  // [n_tokens, cols] f32
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));  // [n_tokens, rows] f32
  const Matrix w0{DType::kBF16, rows, cols, weights.data()};
  const size_t panel_elems_per_copy = static_cast<size_t>(panel_elems(w0));
  std::vector<uint16_t> panels(packed ? n_copies * panel_elems_per_copy : 0);
  for (size_t c = 0; c < (packed ? n_copies : 0); ++c) {
    pack_panels(Matrix{DType::kBF16, rows, cols, weights.data() + c * matrix_elems},
                panels.data() + c * panel_elems_per_copy);
  }
  ThreadPool pool(1);
  cycle_copies(state, n_copies, y, [&](size_t copy) {
    Matrix w{DType::kBF16, rows, cols, weights.data() + copy * matrix_elems};
    if (packed) w.panels = panels.data() + copy * panel_elems_per_copy;
    matmul_impl::matmul_with(simd::best_isa(), path, pool, w, x.data(), n_tokens, y.data());
  });
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * cols * n_tokens) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(simd::isa_name(simd::best_isa()));
}

BENCHMARK(BM_MatmulBf16Path)
    ->ArgNames({"rows", "cols", "n_tokens", "path", "cold"})
    ->ArgsProduct({{1024}, {1024}, {1, 8, 16, 32, 48, 64, 128, 512}, {0, 1, 2}, {0, 1}});

// One GQA group (4 query heads, head_dim 128) over n_ctx cached positions as one decode task,
// with the rows of 4 KV heads per position as KvCache keeps one layer (stride 4 · 128 floats),
// or (stride_heads 32) 8 layers of them per position, as a position-major cache would.
// Reports the KV bytes read per second.
void BM_Attend(benchmark::State& state) {
  const int64_t n_ctx = state.range(0), hd = 128, stride = state.range(1) * hd;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(n_ctx * stride)), values(keys.size());
  for (float& v : keys) v = normal(rng);
  for (float& v : values) v = normal(rng);
  std::vector<float> q(4 * hd), out(4 * hd), scores;  // [4, hd] f32
  for (float& v : q) v = normal(rng);
  const std::vector<KvSpan> spans = {{keys.data(), values.data(), stride, stride, n_ctx}};
  const AttendShape shape{4, hd, hd, hd, hd, 0.088f};
  for (auto _ : state) {
    attend(shape, q.data(), spans, out.data(), scores);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["kv_GB/s"] = benchmark::Counter(2.0 * n_ctx * hd * sizeof(float) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Attend)
    ->ArgNames({"n_ctx", "stride_heads"})
    ->ArgsProduct({{128, 1024, 8192}, {4, 32}});

// A decode step's attention of one layer, as the serving engine runs it: 4 KV heads (a task each,
// 4 query heads per group, head_dim 128), bf16 rows of the 4 heads per position, in one span
// (block_size 0: KvCache) or in blocks of block_size positions scattered over the pool (the
// paged cache hands out a span per block). Cold: each iteration reads another of the copies
// filling 512 MiB, in 4 KiB pages or (huge 1) in huge pages. The kernel: f32 products (pairs 0)
// or, where the CPU multiplies bf16 pairs, the bf16-pair one (pairs 1; attend's choice there).
// Reports the KV bytes read per second; compare block_size 16 against 0, pairs 1 against 0.
void BM_AttendPaged(benchmark::State& state) {
  const int64_t n_ctx = state.range(0), bs = state.range(1), hd = 128, n_kv = 4;
  const simd::Isa isa = state.range(3) ? simd::best_isa() : simd::Isa::kAvx512;
  if (state.range(3) && !simd::has_dpbf16(isa)) {
    state.SkipWithError("the matmuls' instruction set does not multiply bf16 pairs");
    return;
  }
  if (!simd::isa_supported(simd::Isa::kAvx512)) {
    state.SkipWithError("no AVX-512 on this CPU");
    return;
  }
  const int64_t kv_w = n_kv * hd, step_rows = bs > 0 ? (n_ctx + bs - 1) / bs * bs : n_ctx;
  const int64_t n_copies = std::max<int64_t>(2, (int64_t{512} << 20) / (4 * step_rows * kv_w));
  std::mt19937 rng(1);
  const size_t n_elems = static_cast<size_t>(n_copies * step_rows * kv_w);
  // In 4 KiB pages (huge 0) or in huge pages (1).
  std::vector<uint16_t> small_k, small_v;
  HugePtr huge_k, huge_v;
  uint16_t *k, *v;
  if (state.range(2)) {
    huge_k = allocate_huge(n_elems * 2);
    huge_v = allocate_huge(n_elems * 2);
    k = static_cast<uint16_t*>(huge_k.get());
    v = static_cast<uint16_t*>(huge_v.get());
  } else {
    small_k.resize(n_elems);
    small_v.resize(n_elems);
    k = small_k.data();
    v = small_v.data();
  }
  for (size_t i = 0; i < n_elems; ++i) {
    k[i] = f32_to_bf16(std::ldexp(float(rng() % 2048) - 1024.0f, -10));
    v[i] = f32_to_bf16(std::ldexp(float(rng() % 2048) - 1024.0f, -10));
  }
  // The blocks of every copy, shuffled over the whole pool.
  std::vector<int64_t> blocks(static_cast<size_t>(bs > 0 ? n_copies * step_rows / bs : 0));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int64_t>(i);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<float> q(static_cast<size_t>(4 * kv_w)), out(q.size()), scores;  // 16 heads
  for (float& x : q) x = float(rng() % 2000) / 1000.0f - 1.0f;
  std::vector<KvSpan> spans;
  const AttendShape shape{4, hd, hd, hd, hd, 0.088f};
  int64_t copy = 0;
  for (auto _ : state) {
    for (int64_t h = 0; h < n_kv; ++h) {
      spans.clear();
      if (bs == 0) {
        const int64_t off = copy * step_rows * kv_w + h * hd;
        spans.push_back({k + off, v + off, kv_w, kv_w, n_ctx, DType::kBF16});
      } else {
        for (int64_t b = 0; b * bs < n_ctx; ++b) {
          const int64_t off = blocks[static_cast<size_t>(copy * step_rows / bs + b)] * bs * kv_w;
          spans.push_back({k + off + h * hd, v + off + h * hd, kv_w, kv_w,
                           std::min(bs, n_ctx - b * bs), DType::kBF16});
        }
      }
      attend_with(isa, shape, q.data() + h * 4 * hd, spans, out.data() + h * 4 * hd, scores);
    }
    benchmark::DoNotOptimize(out.data());
    copy = (copy + 1) % n_copies;
  }
  state.counters["kv_GB/s"] = benchmark::Counter(2.0 * n_ctx * kv_w * sizeof(uint16_t) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_AttendPaged)
    ->ArgNames({"n_ctx", "block_size", "huge", "pairs"})
    ->ArgsProduct({{1024, 4096}, {0, 16}, {0, 1}, {0, 1}});

}  // namespace
}  // namespace duet
