// Matrix products of f32 activations with weight matrices (bf16, f32, fp8, or int8 and int4:
// DType::kQ8, kQ4, kernels/quantize.h), accumulating in f32.
// The SIMD path (AVX-512 BF16, AVX-512, AVX2, scalar) is chosen once at run time from the CPU's
// features. With AVX-512 BF16, products with bf16 and fp8 weights round x to bf16 first (to
// nearest even) and multiply bf16 pairs with vdpbf16ps, as llama.cpp and oneDNN do on such CPUs
// (fp8 from a few tokens on; below, the rounded x by f32 FMAs: kernels/matmul_fp8.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace duet {

struct Q8Rows;  // x quantized for int8 weights (kernels/matmul_q8_impl.h)

// The rows of x a product reads: contiguous (row t at base + t · cols) or gathered in place, row t
// at rows[t] (a MoE layer's experts read the tokens routed to them where the dispatcher received
// them, rather than from a grouped copy). Converts from a contiguous pointer.
struct XRows {
  XRows(const float* contiguous) : base(contiguous) {}  // NOLINT(google-explicit-constructor)
  explicit XRows(const float* const* gathered) : rows(gathered) {}
  // Contiguous rows row_stride floats apart (at least the product's cols).
  XRows(const float* contiguous, int64_t row_stride) : base(contiguous), ld(row_stride) {}
  // x rounded to bf16 for kernels that multiply bf16 pairs, as matmul_impl::round_x makes it:
  // rows row_stride elements apart, zero from the product's cols to row_stride.
  static XRows rounded(const uint16_t* bf16_rows, int64_t row_stride) {
    XRows x(static_cast<const float*>(nullptr));
    x.bf16 = bf16_rows;
    x.ld = row_stride;
    return x;
  }

  // Row t of f32 rows (not of rounded ones).
  const float* row(int64_t t, int64_t cols) const {
    return rows ? rows[t] : base + t * (ld ? ld : cols);
  }
  bool empty() const { return !base && !rows && !bf16 && !q8; }

  const float* base = nullptr;
  const float* const* rows = nullptr;
  const uint16_t* bf16 = nullptr;  // rounded rows, or null
  // The rounded rows widened to f32 and multiplied by 2^64 (exactly), at the same ld, for the
  // fp8 kernels' shift widening (matmul_impl::widen_x), or null.
  const float* widened = nullptr;
  const Q8Rows* q8 = nullptr;      // x quantized for kQ8/kQ4 weights by direct_x, or null
  // Contiguous or rounded rows: elements from one row to the next; 0 = the product's cols.
  int64_t ld = 0;
};

// y[n_tokens, w.rows] = x[n_tokens, w.cols] · wᵀ. x and y are contiguous f32; y must not
// alias x. n_tokens may be 0 (nothing happens). Work is split over `pool`.
void matmul(ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens, float* y);

// y[n_tokens, w.cols] = x[n_tokens, w.rows] · w (the weight used untransposed, as MLA's
// absorbed attention multiplies queries by W_UK). Contiguous f32; y must not alias x.
void matmul_xw(ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens, float* y);

// One product of matmul_xw_grouped: y[n_tokens, w.cols] = x[n_tokens, w.rows] · w, contiguous
// f32, y aliasing no x.
struct XwGroup {
  Matrix w;
  const float* x = nullptr;
  int64_t n_tokens = 0;  // may be 0: the group is skipped
  float* y = nullptr;
};

// Every group's matmul_xw as one job on the pool, its tasks blocks of one group's columns: MLA's
// per-head q · W_UK pays one synchronisation of the pool for all heads instead of one per head.
// Each group's y equals matmul_xw's bit for bit (a column's sum does not depend on the blocks).
void matmul_xw_grouped(ThreadPool& pool, const std::vector<XwGroup>& groups);

// The same products computed the plainest way, for tests and as the fallback.
void matmul_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y);
void matmul_xw_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y);

// Elements of w's packed copy (Matrix::panels): whole panels of Matrix::kPanelRows rows.
int64_t panel_elems(const Matrix& w);

// Writes w's weights as panels (the layout Matrix::panels describes) into dst, panel_elems(w)
// elements of w.dtype (bf16 or f32), 64-byte aligned. w.data is read, w.panels ignored.
void pack_panels(const Matrix& w, void* dst);

// Whether matmul on this CPU reads a matrix of dtype from its panels when it has them, so a
// loader packs only what will be read. With panels the products of any token count run as
// outer products on them: no transposition per call, no horizontal sums. Without them (and on
// an AVX-512 BF16 CPU, whose vdpbf16ps kernels read the rows) the rows are read as stored.
bool matmul_reads_panels(DType dtype);

// Batch invariance (as vLLM's batch-invariant mode): while on, every product sums each output in
// one order whatever the number of tokens it runs with (the direct path for every token count,
// panels never read), so a row's result, and a sequence's logits, are the same bit for bit alone
// and in any batch. Off by default: from tens of tokens on the tiled and panel kernels are
// faster. Process-wide; set it before the products it should govern (products already running
// finish as they started). An explicit Path::kTiled (matmul_impl) is still honoured.
void set_matmul_batch_invariant(bool on);
bool matmul_batch_invariant();

// Name of the SIMD path in use ("avx512bf16", "avx512", "avx2" or "scalar"), for logs and
// benchmarks. The environment variable DUET_MATMUL_ISA, read once, picks another that the CPU
// runs, to compare (simd::best_isa).
const char* matmul_isa();
// Name of the one products with bf16 weights and attention run on: matmul_isa()'s, except
// "avx512" where that is "avx512bf16" by default on an Intel CPU (simd::bf16_isa: there f32 FMAs
// multiply faster than bf16 pairs).
const char* matmul_bf16_isa();

// Bytes ahead that one-token products prefetch the weights they stream (0: none): by default
// 4096 on Intel's CPUs and none on the others; the environment variable DUET_ONE_TOKEN_PREFETCH,
// read once, sets another count (0 to 65536), to compare (simd::one_token_prefetch_bytes).
int64_t matmul_one_token_prefetch();
// Bytes ahead that they also prefetch those weights into L2 (0: none): by default 16384 on
// Intel's CPUs and none on the others; DUET_ONE_TOKEN_PREFETCH_L2 sets another count likewise
// (simd::one_token_prefetch_l2_bytes).
int64_t matmul_one_token_prefetch_l2();

// Name of the kernel that products with int8 and int4 weights use on that path ("avx512vnni",
// "avx512", "avx2vnni", "avx2" or "scalar"), for logs and benchmarks.
const char* matmul_int_kernel();

}  // namespace duet
