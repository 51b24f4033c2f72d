// Private to src/kernels and its tests: matmul with the instruction set and the loop structure
// chosen by the caller, so tests can check every path against matmul_scalar on this machine.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/matmul_q8_impl.h"
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

// From this many tokens on a matrix with panels (Matrix::panels) is read from them; below, its
// rows are read as stored (kDirect). From panels each weight is widened once per column block
// for all tokens (or in registers, for up to two blocks of tokens) and there are no horizontal
// sums, which pays off once the arithmetic shows. At the 32 tokens of a batch-32 decode step,
// timed per operation beside --no-repack on this Ice Lake VM, q/k/v took 1.66–1.72 ms instead
// of 1.80–2.04, o 1.10–1.16 instead of 1.31–1.51, the output head 17.0–17.3 instead of
// 17.6–19.8. At 8 tokens the rows were faster (output head 3.7–4.8 ms against 5.1–6.3) until
// the token blocks shared out the panels' prefetch (PanelPrefetch); since, in alternating
// batch-8 runs the panels took attention 8.7–12.4 ms per step against 10.1–16.5 and the output
// head 4.8–8.1 against 5.3–10.1, lower in most pairs. One token still reads the rows.
constexpr int64_t kPanelMinTokens = 8;

// Cache lines a microkernel call prefetches: `lines` lines from p on, spread evenly over its
// steps, so that the token blocks sweeping one column block share out the prefetch of the next
// one rather than the first block issuing all of it (a core has only a dozen or so outstanding
// misses; a burst of prefetches stalls the loads behind it).
struct PanelPrefetch {
  const char* p = nullptr;
  int64_t lines = 0;

  // The share of token block b of n_blocks in prefetching `bytes` at start: consecutive parts
  // of the same size that together cover every line.
  static PanelPrefetch share(const void* start, int64_t bytes, int64_t b, int64_t n_blocks) {
    const int64_t n_lines = (bytes + 63) / 64, per_block = (n_lines + n_blocks - 1) / n_blocks;
    return {static_cast<const char*>(start) + b * per_block * 64, per_block};
  }
};

// The first n floats of v, grown to hold them, at a 64-byte aligned address: a vector load that
// straddles two cache lines costs two loads, which cost an earlier prefill kernel 30 %.
inline float* aligned_floats(std::vector<float>& v, int64_t n) {
  v.resize(static_cast<size_t>(n + 16));
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t{63});
}

// Row stride for a packed copy of rows of n floats: whole cache lines plus one, so rows a
// register block reads together do not all fall into the same L1 sets.
constexpr int64_t padded_ld(int64_t n) {
  return (n + 15) / 16 * 16 + 16;
}

// n items cut into the fewest blocks of at most max_size, of sizes differing by at most one:
// 7 tokens run as 4 + 3 rather than 6 + 1, since a one-token block has too few accumulators to
// hide the multiply latency (and, widening bf16 in registers, widens for a single token).
struct EvenBlocks {
  EvenBlocks(int64_t n_items, int64_t max_size)
      : n((n_items + max_size - 1) / max_size),
        base(n ? n_items / n : 0),
        extra(n ? n_items % n : 0) {}
  int64_t begin(int64_t b) const { return b * base + (b < extra ? b : extra); }
  int64_t size(int64_t b) const { return base + (b < extra); }

  int64_t n, base, extra;
};

// Whether the direct path can read x's rows in place with several blocks of tokens: contiguous
// rows on 64-byte boundaries, so no vector load straddles two cache lines.
inline bool aligned_rows(const XRows& x, int64_t cols) {
  const int64_t ld = x.ld ? x.ld : cols;
  return !x.rows && reinterpret_cast<uintptr_t>(x.base) % 64 == 0 && ld % 16 == 0;
}

// The first n bf16 of v, grown to hold them, at a 64-byte aligned address.
inline uint16_t* aligned_bf16(std::vector<uint16_t>& v, int64_t n) {
  v.resize(static_cast<size_t>(n + 32));
  return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t{63});
}

// The instruction set the public products (matmul(), the grouped ones) run products with dtype
// weights on: simd::bf16_isa() for bf16 weights, simd::best_isa() for the others.
inline simd::Isa isa_for(DType dtype) {
  return dtype == DType::kBF16 ? simd::bf16_isa() : simd::best_isa();
}

// Whether products with dtype weights on isa read x rounded to bf16 (to nearest even, as round_x
// makes it): bf16 and fp8 weights on an instruction set that multiplies bf16 pairs, for every
// token count (so a row's result does not depend on how many tokens it runs with beyond f32
// summation order).
inline bool rounds_x(simd::Isa isa, DType dtype) {
  return simd::has_dpbf16(isa) && (dtype == DType::kBF16 || dtype == DType::kF8E4M3);
}

// From this many tokens on, products with fp8 weights on an instruction set that multiplies bf16
// pairs widen the codes to bf16 (exactly) and multiply them with x in pairs
// (matmul_fp8_pairs.cpp); with fewer, and while batch-invariant, the codes are widened to f32 and
// multiplied with x (rounded all the same) by FMAs (matmul_fp8.cpp). BM_MatmulFp8 on the Zen 4 VM,
// 512 × 1024 (a routed expert), one thread: at 4 tokens the FMAs were faster (41–49 GFLOP/s from
// memory against 36), at 6 even, from 8 on the pairs (86–89 from cache against 63–72).
constexpr int64_t kFp8PairsMinTokens = 8;

// Whether products with fp8 weights w on isa (one that multiplies bf16 pairs) read x's rounded
// rows widened to f32 × 2^64 (widen_x) for n_tokens tokens: below kFp8PairsMinTokens where the
// byte look-ups do not serve them (fp8_impl::lut_serves), and at every count while
// batch-invariant (matmul_fp8_pairs.cpp).
bool fp8_reads_widened(simd::Isa isa, const Matrix& w, int64_t n_tokens);

// dst[0 : cols) = src[0 : cols) rounded to bf16 (to nearest even, NaN kept, as f32_to_bf16),
// dst[cols : ld) = 0. Needs AVX-512.
void round_row(const float* src, int64_t cols, uint16_t* dst, int64_t ld);

// x[n_tokens, cols] rounded to bf16 (to nearest even, NaN kept, as f32_to_bf16) into buf: rows
// at a 64-byte aligned address, whole cache lines plus one apart, zero past cols. Needs AVX-512
// (simd::isa_supported(simd::Isa::kAvx512)).
XRows round_x(XRows x, int64_t cols, int64_t n_tokens, std::vector<uint16_t>& buf);

// x, rounded (x.bf16, as round_x makes it), with its rounded rows also widened to f32 and
// multiplied by 2^64 into buf (x.widened, rows x.ld floats apart at a 64-byte aligned address):
// exact short of |x| >= 2^64, what fp8_impl::matmul_rows_shift_avx512 multiplies. Needs AVX-512.
XRows widen_x(XRows x, int64_t cols, int64_t n_tokens, std::vector<float>& buf);

// Where direct_x puts its copies of x.
struct XBuffer {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  matmul_q8::Buffer q8;
};

// x as the kernels of isa best read it for a product with weights w of n_tokens rows:
// - rounded to bf16 (round_x, into buf.bf16) where rounds_x(isa, w.dtype), for any token count
//   and either path, and for fp8 weights where fp8_reads_widened(isa, w, n_tokens) also
//   widened (widen_x, into buf.f32), once per product rather than in each of its tasks;
// - quantized to int8 (matmul_q8::quantize_x, into buf.q8) for kQ8 and kQ4 weights;
// - x itself where isa's kernels read w from its panels (they broadcast x's elements in place);
// - else as the direct path reads it: x itself where it reads it in place (few tokens, aligned
//   rows, or the tiled path), else a copy in aligned rows in buf.f32.
// Products split into many tasks call this once, rather than each task copying x.
XRows direct_x(simd::Isa isa, const Matrix& w, XRows x, int64_t n_tokens, XBuffer& buf);

// matmul() on a given instruction set (which must be supported) and path.
void matmul_with(simd::Isa isa, Path path, ThreadPool& pool, const Matrix& w, const float* x,
                 int64_t n_tokens, float* y);

// Part of matmul() on the calling thread: y[t * ldy + r - r_begin] = x[t] · w[r] for r in
// [r_begin, r_end) and t < n_tokens, x's rows contiguous, gathered, or rounded by direct_x for
// this isa. The building block of kernels that split several products over one pool themselves
// (grouped_matmul.h).
void matmul_rows_with(simd::Isa isa, Path path, const Matrix& w, XRows x, int64_t n_tokens,
                      float* y, int64_t ldy, int64_t r_begin, int64_t r_end);

// matmul_rows_with for bf16 weights on an instruction set that multiplies bf16 pairs
// (simd::has_dpbf16(isa)), from matmul_bf16.cpp; x is rounded here unless it comes rounded.
void matmul_rows_dpbf16(simd::Isa isa, const Matrix& w, XRows x, int64_t n_tokens, float* y,
                        int64_t ldy, int64_t r_begin, int64_t r_end, bool tiled);

// matmul_xw() on a given instruction set (which must be supported). The BF16 ones run the
// AVX-512 kernels: MLA's absorbed attention multiplies f32 x by the weights as they are.
void matmul_xw_with(simd::Isa isa, ThreadPool& pool, const Matrix& w, const float* x,
                    int64_t n_tokens, float* y);
// matmul_xw_grouped() likewise.
void matmul_xw_grouped_with(simd::Isa isa, ThreadPool& pool, const std::vector<XwGroup>& groups);

}  // namespace duet::matmul_impl
