#include "kernels/matmul.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/matmul_fp8.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_impl.h"

namespace duet {

namespace {

// Chunk sizes handed to the pool: whole register blocks (direct), whole panels (tiled), and
// whole column blocks (matmul_xw), so only the last chunk has a ragged edge.
constexpr int64_t kDirectChunk = 4;
constexpr int64_t kTiledChunk = 64;
constexpr int64_t kXwChunk = 64;
// One token's (matmul_xw_cols reads 256 columns of each row a pass there): a head of MLA's W_UK
// on the small presets is one task, read as whole rows.
constexpr int64_t kXwOneChunk = 256;

// Below this many multiply-adds (a router's 32 × 1024 for one token) a product runs on the
// calling thread: waking a worker costs more than the work.
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;

namespace avx512 {
using S = simd::Avx512;
constexpr int kMmRows = 4;  // 24 accumulators + 4 weight vectors + 1 x vector of 32 zmm
constexpr int kMmTokens = 6;
constexpr int kPanelVecs = 4;  // 24 accumulators + 4 weight vectors + 1 broadcast x
constexpr int kPanelTokens = 6;
constexpr int kXwCols = 4;  // 64 columns
constexpr int kXwTokens = 4;
constexpr int kXwOneCols = 16;  // 256 columns: 16 accumulators
#define DUET_SIMD_TARGET DUET_TARGET_AVX512
#include "kernels/matmul_simd_impl.h"
#include "kernels/matmul_xw_simd_impl.h"
#undef DUET_SIMD_TARGET
static_assert(kTiledChunk % kPanelRows == 0 && kDirectChunk % kMmRows == 0 &&
              kXwChunk % (kXwCols * kW) == 0 && kXwOneChunk % (kXwOneCols * kW) == 0);
}  // namespace avx512

namespace avx2 {
using S = simd::Avx2;
constexpr int kMmRows = 4;  // 8 accumulators + 4 weight vectors + 1 x vector of 16 ymm
constexpr int kMmTokens = 2;
constexpr int kPanelVecs = 2;  // 12 accumulators + 2 weight vectors + 1 broadcast x
constexpr int kPanelTokens = 6;
constexpr int kXwCols = 2;  // 16 columns
constexpr int kXwTokens = 4;
constexpr int kXwOneCols = 8;  // 64 columns: 8 accumulators
#define DUET_SIMD_TARGET DUET_TARGET_AVX2
#include "kernels/matmul_simd_impl.h"
#include "kernels/matmul_xw_simd_impl.h"
#undef DUET_SIMD_TARGET
static_assert(kTiledChunk % kPanelRows == 0 && kDirectChunk % kMmRows == 0 &&
              kXwChunk % (kXwCols * kW) == 0 && kXwOneChunk % (kXwOneCols * kW) == 0);
}  // namespace avx2

inline float weight_at(const float* w, int64_t i) {
  return w[i];
}
inline float weight_at(const uint16_t* w, int64_t i) {
  return bf16_to_f32(w[i]);
}

// Plain loops accumulating in double: the reference the SIMD paths are tested against.
// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end).
template <typename W>
void scalar_rows(const W* w, int64_t cols, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                 int64_t r_begin, int64_t r_end) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    const W* wr = w + r * cols;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x.row(t, cols);
      double acc = 0;
      for (int64_t k = 0; k < cols; ++k) acc += double(weight_at(wr, k)) * double(xt[k]);
      y[t * ldy + (r - r_begin)] = static_cast<float>(acc);
    }
  }
}

template <typename W>
void scalar_xw_cols(const W* w, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
                    float* y, int64_t c_begin, int64_t c_end) {
  std::vector<double> acc(static_cast<size_t>(c_end - c_begin));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double xv = x[t * rows + r];
      const W* wr = w + r * cols;
      for (int64_t c = c_begin; c < c_end; ++c) acc[c - c_begin] += xv * double(weight_at(wr, c));
    }
    for (int64_t c = c_begin; c < c_end; ++c)
      y[t * cols + c] = static_cast<float>(acc[c - c_begin]);
  }
}

void scalar_matmul_rows(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t r_begin, int64_t r_end, bool /*tiled*/) {
  if (w.dtype == DType::kF8E4M3) {  // fp8
    return fp8_impl::matmul_rows_scalar(w, x, n_tokens, y, ldy, r_begin, r_end, false);
  }
  if (w.dtype == DType::kBF16) {
    scalar_rows(static_cast<const uint16_t*>(w.data), w.cols, x, n_tokens, y, ldy, r_begin, r_end);
  } else {
    scalar_rows(static_cast<const float*>(w.data), w.cols, x, n_tokens, y, ldy, r_begin, r_end);
  }
}

void scalar_matmul_xw_range(const Matrix& w, const float* x, int64_t n_tokens, float* y,
                            int64_t c_begin, int64_t c_end) {
  if (w.dtype == DType::kF8E4M3) {  // fp8
    return fp8_impl::matmul_xw_cols_scalar(w, x, n_tokens, y, c_begin, c_end);
  }
  if (w.dtype == DType::kBF16) {
    scalar_xw_cols(static_cast<const uint16_t*>(w.data), w.rows, w.cols, x, n_tokens, y, c_begin,
                   c_end);
  } else {
    scalar_xw_cols(static_cast<const float*>(w.data), w.rows, w.cols, x, n_tokens, y, c_begin,
                   c_end);
  }
}

void check_args(const char* op, const Matrix& w, const void* x, int64_t n_tokens, const float* y) {
  DUET_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF8E4M3 ||
                 is_int_quantized(w.dtype),
             op << ": weight dtype " << dtype_name(w.dtype) << " is not supported");
  DUET_CHECK(w.dtype != DType::kF8E4M3 ||
                 (w.f8.scale_inv && w.f8.block_rows > 0 && w.f8.block_cols > 0 && !w.panels),
             op << ": fp8 weights without block scales (block " << w.f8.block_rows << " x "
                << w.f8.block_cols << ")");
  DUET_CHECK(w.rows >= 0 && w.cols >= 0 && n_tokens >= 0,
             op << ": rows " << w.rows << " cols " << w.cols << " n_tokens " << n_tokens);
  DUET_CHECK(n_tokens == 0 || w.rows * w.cols == 0 || (w.data && x && y),
             op << ": null pointer (w " << w.data << " x " << x << " y " << y << ")");
  DUET_CHECK(n_tokens == 0 || x != y, op << ": y aliases x");
}

const void* first_row(const XRows& x) {
  if (x.q8) return x.q8;
  if (x.rows) return *x.rows;
  if (x.bf16) return x.bf16;
  return x.base;
}

void check_isa(simd::Isa isa) {
  DUET_CHECK(simd::isa_supported(isa),
             "matmul: instruction set " << simd::isa_name(isa) << " not supported by this CPU");
}

using RowsFn = void (*)(const Matrix&, XRows, int64_t, float*, int64_t, int64_t, int64_t, bool);

// On an instruction set that multiplies bf16 pairs: bf16 weights on x rounded to bf16
// (matmul_bf16.cpp), f32 weights on the AVX-512 kernels.
template <simd::Isa kIsa>
void dpbf16_matmul_rows(const Matrix& w, XRows x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t r_begin, int64_t r_end, bool tiled) {
  if (w.dtype == DType::kBF16) {
    matmul_impl::matmul_rows_dpbf16(kIsa, w, x, n_tokens, y, ldy, r_begin, r_end, tiled);
  } else {
    avx512::matmul_rows(w, x, n_tokens, y, ldy, r_begin, r_end, tiled);
  }
}

RowsFn rows_fn_for(simd::Isa isa, DType dtype) {
  if (dtype == DType::kF8E4M3) return fp8_impl::rows_fn(isa);  // fp8
  switch (isa) {
    case simd::Isa::kAvx512Bf16:
      return &dpbf16_matmul_rows<simd::Isa::kAvx512Bf16>;
    case simd::Isa::kAvx512Bf16Emulated:
      return &dpbf16_matmul_rows<simd::Isa::kAvx512Bf16Emulated>;
    case simd::Isa::kAvx512:
      return &avx512::matmul_rows;
    case simd::Isa::kAvx2:
      return &avx2::matmul_rows;
    case simd::Isa::kScalar:
      break;
  }
  return &scalar_matmul_rows;
}

std::atomic<bool> g_batch_invariant{false};  // set_matmul_batch_invariant

// Whether the kernels of isa read w from its panels for n_tokens tokens (the AVX-512 and AVX2
// ones, for f32 weights on an AVX-512 BF16 CPU too; vdpbf16ps and scalar read the rows). Never
// while batch-invariant.
bool reads_panels(simd::Isa isa, const Matrix& w, int64_t n_tokens) {
  return !is_int_quantized(w.dtype) && w.panels && n_tokens >= matmul_impl::kPanelMinTokens &&
         isa != simd::Isa::kScalar && !matmul_impl::rounds_x(isa, w.dtype) &&
         !g_batch_invariant.load(std::memory_order_relaxed);
}

bool use_tiled(matmul_impl::Path path, const Matrix& w, int64_t n_tokens) {
  return path == matmul_impl::Path::kTiled ||
         (path == matmul_impl::Path::kAuto && n_tokens >= matmul_impl::tiled_min_tokens(w.dtype) &&
          !g_batch_invariant.load(std::memory_order_relaxed));
}

// w as the kernels should see it: without its panels while batch-invariant (the kernels read
// panels wherever a matrix has them and there are enough tokens).
Matrix as_read(const Matrix& w) {
  if (!w.panels || !g_batch_invariant.load(std::memory_order_relaxed)) return w;
  Matrix rows = w;
  rows.panels = nullptr;
  return rows;
}

}  // namespace

namespace matmul_impl {

XRows direct_x(simd::Isa isa, const Matrix& w, XRows x, int64_t n_tokens, XBuffer& buf) {
  const int64_t cols = w.cols;
  if (is_int_quantized(w.dtype)) {  // int8 or int4 weights (matmul_q8.cpp)
    XRows q(static_cast<const float*>(nullptr));
    q.q8 = &matmul_q8::quantize_x(x, cols, n_tokens, buf.q8, matmul_q8::kernel_for(isa));
    return q;
  }
  if (rounds_x(isa, w.dtype)) {
    if (n_tokens == 0) return x;
    const XRows rounded = round_x(x, cols, n_tokens, buf.bf16);
    return w.dtype == DType::kF8E4M3 && fp8_reads_widened(isa, w, n_tokens)
               ? widen_x(rounded, cols, n_tokens, buf.f32)
               : rounded;
  }
  if (reads_panels(isa, w, n_tokens) || n_tokens < 2 || n_tokens >= tiled_min_tokens(w.dtype) ||
      aligned_rows(x, cols)) {
    return x;
  }
  const int64_t ld = padded_ld(cols);
  float* packed = aligned_floats(buf.f32, n_tokens * ld);  // [n_tokens, ld] f32
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* row = x.row(t, cols);
    std::copy(row, row + cols, packed + t * ld);
  }
  return XRows(packed, ld);
}

void matmul_with(simd::Isa isa, Path path, ThreadPool& pool, const Matrix& w_in, const float* x,
                 int64_t n_tokens, float* y) {
  check_args("matmul", w_in, x, n_tokens, y);
  check_isa(isa);
  if (n_tokens == 0 || w_in.rows == 0) return;
  if (w_in.cols == 0) {
    std::fill(y, y + n_tokens * w_in.rows, 0.0f);
    return;
  }
  if (is_int_quantized(w_in.dtype)) {  // int8/int4 weights (matmul_q8.cpp): batch-invariant
    matmul_q8::matmul_with(matmul_q8::kernel_for(isa), pool, w_in, x, n_tokens, y);
    return;
  }
  const Matrix w = as_read(w_in);
  const bool tiled = use_tiled(path, w, n_tokens);
  const RowsFn rows_fn = rows_fn_for(isa, w.dtype);
  if (w.rows * w.cols * n_tokens < kMinParallelMacs) {
    rows_fn(w, x, n_tokens, y, w.rows, 0, w.rows, tiled);
    return;
  }
  thread_local XBuffer x_buf;
  const bool panels = reads_panels(isa, w, n_tokens);
  const XRows xr =
      tiled && !rounds_x(isa, w.dtype) ? XRows(x) : direct_x(isa, w, x, n_tokens, x_buf);
  pool.parallel_for(
      w.rows,
      [&](int64_t begin, int64_t end) {
        rows_fn(w, xr, n_tokens, y + begin, w.rows, begin, end, tiled);
      },
      tiled || panels ? kTiledChunk : kDirectChunk);
}

void matmul_rows_with(simd::Isa isa, Path path, const Matrix& w, XRows x, int64_t n_tokens,
                      float* y, int64_t ldy, int64_t r_begin, int64_t r_end) {
  check_args("matmul_rows", w, first_row(x), n_tokens, y);
  check_isa(isa);
  DUET_CHECK(!x.bf16 || rounds_x(isa, w.dtype), "matmul_rows: x rounded to bf16 for "
                                                    << simd::isa_name(isa) << " and "
                                                    << dtype_name(w.dtype) << " weights");
  DUET_CHECK(
      0 <= r_begin && r_begin <= r_end && r_end <= w.rows && ldy >= r_end - r_begin,
      "matmul_rows: rows [" << r_begin << ", " << r_end << ") of " << w.rows << ", ldy " << ldy);
  if (n_tokens == 0 || r_begin == r_end) return;
  if (w.cols == 0) {
    for (int64_t t = 0; t < n_tokens; ++t) std::fill_n(y + t * ldy, r_end - r_begin, 0.0f);
    return;
  }
  if (is_int_quantized(w.dtype)) {  // int8/int4 weights (matmul_q8.cpp): batch-invariant
    matmul_q8::rows_from_f32(matmul_q8::kernel_for(isa), w, x, n_tokens, y, ldy, r_begin, r_end);
    return;
  }
  DUET_CHECK(!x.q8, "matmul_rows: x quantized for " << dtype_name(w.dtype) << " weights");
  rows_fn_for(isa, w.dtype)(as_read(w), x, n_tokens, y, ldy, r_begin, r_end,
                            use_tiled(path, w, n_tokens));
}

namespace {

// Checks an xw product's arguments; false where there is nothing to compute (y is then final).
bool xw_needs_work(const char* op, const Matrix& w, const float* x, int64_t n_tokens, float* y) {
  check_args(op, w, x, n_tokens, y);
  DUET_CHECK(!is_int_quantized(w.dtype), op << ": int8 and int4 weights are not supported");
  if (n_tokens == 0 || w.cols == 0) return false;
  if (w.rows == 0) {
    std::fill(y, y + n_tokens * w.cols, 0.0f);
    return false;
  }
  return true;
}

fp8_impl::XwColsFn xw_cols_for(simd::Isa isa, DType dtype) {
  return dtype == DType::kF8E4M3     ? fp8_impl::xw_cols_fn(isa)
         : isa == simd::Isa::kAvx2   ? &avx2::matmul_xw_range
         : isa == simd::Isa::kScalar ? &scalar_matmul_xw_range
                                     : &avx512::matmul_xw_range;
}

}  // namespace

void matmul_xw_with(simd::Isa isa, ThreadPool& pool, const Matrix& w, const float* x,
                    int64_t n_tokens, float* y) {
  check_isa(isa);
  if (!xw_needs_work("matmul_xw", w, x, n_tokens, y)) return;
  const auto cols_fn = xw_cols_for(isa, w.dtype);
  pool.parallel_for(
      w.cols, [&](int64_t begin, int64_t end) { cols_fn(w, x, n_tokens, y, begin, end); },
      n_tokens == 1 ? kXwOneChunk : kXwChunk);
}

void matmul_xw_grouped_with(simd::Isa isa, ThreadPool& pool, const std::vector<XwGroup>& groups) {
  check_isa(isa);
  struct Block {  // columns [begin, end) of group g, by its dtype's kernel
    size_t g;
    int64_t begin, end;
    fp8_impl::XwColsFn cols_fn;
  };
  thread_local std::vector<Block> caller_blocks;  // reused: a decode step does not allocate
  std::vector<Block>& blocks = caller_blocks;     // the workers read the caller's
  blocks.clear();
  int64_t macs = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const XwGroup& gr = groups[g];
    if (!xw_needs_work("matmul_xw_grouped", gr.w, gr.x, gr.n_tokens, gr.y)) continue;
    const fp8_impl::XwColsFn cols_fn = xw_cols_for(isa, gr.w.dtype);
    const int64_t chunk = gr.n_tokens == 1 ? kXwOneChunk : kXwChunk;
    for (int64_t c = 0; c < gr.w.cols; c += chunk)
      blocks.push_back({g, c, std::min(gr.w.cols, c + chunk), cols_fn});
    macs += gr.n_tokens * gr.w.rows * gr.w.cols;
  }
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Block& b = blocks[static_cast<size_t>(i)];
      const XwGroup& gr = groups[b.g];
      b.cols_fn(gr.w, gr.x, gr.n_tokens, gr.y, b.begin, b.end);
    }
  };
  const auto n = static_cast<int64_t>(blocks.size());
  if (macs < kMinParallelMacs) {
    run(0, n);
  } else {
    pool.parallel_for(n, run);
  }
}

}  // namespace matmul_impl

int64_t panel_elems(const Matrix& w) {
  return (w.rows + Matrix::kPanelRows - 1) / Matrix::kPanelRows * Matrix::kPanelRows * w.cols;
}

namespace {

template <typename W>
void pack_panels_of(const W* w, int64_t rows, int64_t cols, W* dst) {
  constexpr int64_t kP = Matrix::kPanelRows;
  for (int64_t r0 = 0; r0 < rows; r0 += kP) {
    W* panel = dst + r0 * cols;  // [cols, kP]
    const int64_t nr = std::min(kP, rows - r0);
    std::fill(panel + (nr < kP ? 0 : cols * kP), panel + cols * kP, W{0});
    for (int64_t j = 0; j < nr; ++j) {
      const W* row = w + (r0 + j) * cols;
      for (int64_t k = 0; k < cols; ++k) panel[k * kP + j] = row[k];
    }
  }
}

}  // namespace

void pack_panels(const Matrix& w, void* dst) {
  check_args("pack_panels", w, w.data, 1, static_cast<const float*>(dst));
  DUET_CHECK(!is_int_quantized(w.dtype), "pack_panels: int8 and int4 weights have no panels");
  if (w.rows == 0 || w.cols == 0) return;
  if (w.dtype == DType::kBF16) {
    pack_panels_of(static_cast<const uint16_t*>(w.data), w.rows, w.cols,
                   static_cast<uint16_t*>(dst));
  } else {
    pack_panels_of(static_cast<const float*>(w.data), w.rows, w.cols, static_cast<float*>(dst));
  }
}

bool matmul_reads_panels(DType dtype) {
  if (dtype == DType::kF8E4M3) return false;  // fp8: the codes are read as stored
  Matrix probe;
  probe.dtype = dtype;
  probe.panels = &probe;
  return reads_panels(matmul_impl::isa_for(dtype), probe, matmul_impl::kPanelMinTokens);
}

void matmul(ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens, float* y) {
  matmul_impl::matmul_with(matmul_impl::isa_for(w.dtype), matmul_impl::Path::kAuto, pool, w, x,
                           n_tokens, y);
}

void matmul_xw(ThreadPool& pool, const Matrix& w, const float* x, int64_t n_tokens, float* y) {
  matmul_impl::matmul_xw_with(simd::best_isa(), pool, w, x, n_tokens, y);
}

void matmul_xw_grouped(ThreadPool& pool, const std::vector<XwGroup>& groups) {
  matmul_impl::matmul_xw_grouped_with(simd::best_isa(), pool, groups);
}

void matmul_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y) {
  check_args("matmul_scalar", w, x, n_tokens, y);
  if (n_tokens == 0) return;
  if (is_int_quantized(w.dtype)) {
    matmul_q8::rows_from_f32(matmul_q8::Kernel::kScalar, w, x, n_tokens, y, w.rows, 0, w.rows);
    return;
  }
  scalar_matmul_rows(w, x, n_tokens, y, w.rows, 0, w.rows, false);
}

void matmul_xw_scalar(const Matrix& w, const float* x, int64_t n_tokens, float* y) {
  check_args("matmul_xw_scalar", w, x, n_tokens, y);
  DUET_CHECK(!is_int_quantized(w.dtype),
             "matmul_xw_scalar: int8 and int4 weights are not supported");
  if (n_tokens == 0) return;
  scalar_matmul_xw_range(w, x, n_tokens, y, 0, w.cols);
}

void set_matmul_batch_invariant(bool on) {
  g_batch_invariant.store(on);
}

bool matmul_batch_invariant() {
  return g_batch_invariant.load();
}

const char* matmul_isa() {
  return simd::isa_name(simd::best_isa());
}

const char* matmul_bf16_isa() {
  return simd::isa_name(simd::bf16_isa());
}

int64_t matmul_one_token_prefetch() {
  return simd::one_token_prefetch_bytes();
}

int64_t matmul_one_token_prefetch_l2() {
  return simd::one_token_prefetch_l2_bytes();
}

const char* matmul_int_kernel() {
  return matmul_q8::kernel_name(matmul_q8::kernel_for(simd::best_isa()));
}

}  // namespace duet
