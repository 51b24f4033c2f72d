// Matrices with panels (Matrix::panels, packed at load time): the layout pack_panels writes, the
// products read from them on every instruction set against scalar ones, and which token counts
// read them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "kernels/matmul_test_util.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

using matmul_impl::kPanelMinTokens;
using matmul_impl::Path;
using simd::Isa;
using namespace duet::test;  // NOLINT(google-build-using-namespace): the shared helpers

constexpr int64_t kP = Matrix::kPanelRows;

// A TestMatrix and its panels, in the matrix's dtype.
struct PackedMatrix {
  explicit PackedMatrix(TestMatrix m) : w(std::move(m)) {
    const Matrix v = w.view();
    storage.resize(static_cast<size_t>(panel_elems(v)) * dtype_size(v.dtype) / 4 + 1);
    pack_panels(v, storage.data());
  }
  Matrix view() const {
    Matrix m = w.view();
    m.panels = storage.data();
    return m;
  }
  TestMatrix w;
  std::vector<float> storage;  // 4-byte elements holding the panels' bytes (64-byte alignment
                               // is not required by the kernels)
};

// Element (r, k) of w read back from its panels as f32.
float panel_at(const Matrix& w, int64_t r, int64_t k) {
  const int64_t i = ((r / kP) * w.cols + k) * kP + r % kP;
  return w.dtype == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(w.panels)[i])
                                 : static_cast<const float*>(w.panels)[i];
}

TEST(MatmulPanelsTest, PackedLayoutHoldsEveryElementAndZeroPadding) {
  std::mt19937 rng(3);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : {1, 63, 64, 65, 130}) {
      const PackedMatrix pm(random_matrix(rng, dtype, rows, 7));
      const Matrix w = pm.view();
      EXPECT_EQ(panel_elems(w), (rows + kP - 1) / kP * kP * 7);
      for (int64_t r = 0; r < (rows + kP - 1) / kP * kP; ++r) {
        for (int64_t k = 0; k < 7; ++k) {
          const float want =
              r < rows
                  ? (dtype == DType::kBF16 ? bf16_to_f32(pm.w.bf16[static_cast<size_t>(r * 7 + k)])
                                           : pm.w.f32[static_cast<size_t>(r * 7 + k)])
                  : 0.0f;
          ASSERT_EQ(panel_at(w, r, k), want)
              << dtype_name(dtype) << " rows " << rows << " (" << r << ", " << k << ")";
        }
      }
    }
  }
}

// From panels, on a row range starting mid-panel and ending in a partial one, with widths that
// leave every kind of column tail and several column blocks, for token counts on both sides of
// kPanelMinTokens (below it the rows are read), one block of each size, and two token groups.
TEST(MatmulPanelsTest, ProductsMatchScalarOnEveryIsa) {
  std::mt19937 rng(11);
  const int64_t rows = 200, r_begin = 3, r_end = 197, ldy = r_end - r_begin + 5;
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::kScalar);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {5, 40, 129, 300}) {
      const PackedMatrix pm(random_matrix(rng, dtype, rows, cols));
      for (int64_t n_tokens :
           {int64_t{1}, kPanelMinTokens - 1, kPanelMinTokens, int64_t{12}, int64_t{17}, int64_t{33},
            int64_t{130}}) {
        std::vector<float> x = random_values(rng, n_tokens * cols);
        const Expectations want(pm.w, x.data(), n_tokens);
        for (Isa isa : isas) {
          const std::string what = case_name(isa, dtype, cols, n_tokens);
          std::vector<float> got(static_cast<size_t>(n_tokens * ldy), kGuard);
          matmul_impl::matmul_rows_with(isa, Path::kAuto, pm.view(), x.data(), n_tokens, got.data(),
                                        ldy, r_begin, r_end);
          expect_row_range(got, want(isa).y, want(isa).scale, n_tokens, rows, ldy, r_begin, r_end,
                           what);
          ThreadPool pool(2);
          std::vector<float> all(static_cast<size_t>(n_tokens * rows) + kPad, kGuard);
          matmul_impl::matmul_with(isa, Path::kAuto, pool, pm.view(), x.data(), n_tokens,
                                   all.data());
          expect_close(all, want(isa).y, want(isa).scale, n_tokens * rows, what + " whole");
        }
      }
    }
  }
}

// Panels that disagree with the rows (packed from another matrix) show which one a product
// read: the panels from kPanelMinTokens tokens on where the instruction set reads them, the rows
// below that and on the others.
TEST(MatmulPanelsTest, PanelsAreReadFromKPanelMinTokensOnWhereTheIsaReadsThem) {
  std::mt19937 rng(5);
  const int64_t rows = 70, cols = 33;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const TestMatrix rows_m = random_matrix(rng, dtype, rows, cols);
    const PackedMatrix other(random_matrix(rng, dtype, rows, cols));
    Matrix w = rows_m.view();
    w.panels = other.view().panels;
    std::vector<Isa> isas = simd_isas();
    isas.push_back(Isa::kScalar);
    for (int64_t n_tokens : {kPanelMinTokens - 1, kPanelMinTokens}) {
      std::vector<float> x = random_values(rng, n_tokens * cols);
      const Expectations of_rows(rows_m, x.data(), n_tokens);
      const Expectations of_panels(other.w, x.data(), n_tokens);
      for (Isa isa : isas) {
        const bool reads = n_tokens >= kPanelMinTokens && isa != Isa::kScalar &&
                           !matmul_impl::rounds_x(isa, dtype);
        const std::string what = std::string(simd::isa_name(isa)) + " " + dtype_name(dtype) +
                                 " n_tokens " + std::to_string(n_tokens);
        std::vector<float> got(static_cast<size_t>(n_tokens * rows) + kPad, kGuard);
        ThreadPool pool(2);
        matmul_impl::matmul_with(isa, Path::kAuto, pool, w, x.data(), n_tokens, got.data());
        const Expected& want = reads ? of_panels(isa) : of_rows(isa);
        expect_close(got, want.y, want.scale, n_tokens * rows, what);
      }
    }
  }
  const Isa bf16 = matmul_impl::isa_for(DType::kBF16);
  EXPECT_EQ(matmul_reads_panels(DType::kBF16), bf16 != Isa::kScalar && !simd::has_dpbf16(bf16));
  EXPECT_EQ(matmul_reads_panels(DType::kF32), simd::best_isa() != Isa::kScalar);
}

// The token blocks sweeping a column block prefetch the next one between them: replaying the
// microkernel's schedule over its kc steps, every line is fetched by exactly one block, at most
// one line per step while a block's share fits its steps, and fewer than one line per block
// past the end.
TEST(MatmulPanelsTest, TokenBlocksSharePrefetchOfTheNextColumnBlock) {
  using matmul_impl::PanelPrefetch;
  const char* base = reinterpret_cast<const char*>(uintptr_t{1} << 20);
  for (int64_t bytes : {int64_t{64}, int64_t{16384}, int64_t{32768}, int64_t{100000}}) {
    for (int64_t n_blocks : {1, 2, 3, 6}) {
      for (int64_t kc : {1, 16, 100, 128}) {
        SCOPED_TRACE(std::to_string(bytes) + " bytes, " + std::to_string(n_blocks) +
                     " blocks, kc " + std::to_string(kc));
        const int64_t n_lines = (bytes + 63) / 64;
        std::vector<int> fetched_by(static_cast<size_t>(n_lines + n_blocks), -1);
        int64_t end = 0;
        for (int64_t b = 0; b < n_blocks; ++b) {
          PanelPrefetch pf = PanelPrefetch::share(base, bytes, b, n_blocks);
          int64_t pf_due = 0;
          for (int64_t k = 0; k < kc; ++k) {  // as panel_block
            int per_step = 0;
            for (pf_due += pf.lines; pf_due >= kc; pf_due -= kc, pf.p += 64) {
              const int64_t line = (pf.p - base) / 64;
              ASSERT_LT(line, static_cast<int64_t>(fetched_by.size()));
              EXPECT_EQ(fetched_by[static_cast<size_t>(line)], -1) << "line " << line;
              fetched_by[static_cast<size_t>(line)] = static_cast<int>(b);
              end = std::max(end, line + 1);
              ++per_step;
            }
            if (pf.lines <= kc) {
              EXPECT_LE(per_step, 1);
            }
          }
        }
        for (int64_t line = 0; line < n_lines; ++line) {
          EXPECT_NE(fetched_by[static_cast<size_t>(line)], -1) << "line " << line;
        }
        EXPECT_LT(end - n_lines, n_blocks);
      }
    }
  }
}

TEST(MatmulPanelsTest, RowSliceKeepsPanelsOnlyFromAPanelStart) {
  std::mt19937 rng(8);
  const PackedMatrix pm(random_matrix(rng, DType::kBF16, 200, 16));
  const Matrix w = pm.view();
  const Matrix from_64 = w.row_slice(64, 100);
  ASSERT_NE(from_64.panels, nullptr);
  for (int64_t r = 0; r < 100; ++r) EXPECT_EQ(panel_at(from_64, r, 5), panel_at(w, 64 + r, 5));
  EXPECT_EQ(w.row_slice(3, 10).panels, nullptr);
  std::vector<float> x = random_values(rng, kPanelMinTokens * 16);
  std::vector<float> got(static_cast<size_t>(kPanelMinTokens * 100) + kPad, kGuard);
  ThreadPool pool(2);
  matmul(pool, from_64, x.data(), kPanelMinTokens, got.data());
  TestMatrix slice{DType::kBF16, 100, 16, {}, {}};
  slice.bf16.assign(pm.w.bf16.begin() + 64 * 16, pm.w.bf16.begin() + 164 * 16);
  const Expectations want(slice, x.data(), kPanelMinTokens);
  expect_close(got, want(matmul_impl::isa_for(DType::kBF16)).y,
               want(matmul_impl::isa_for(DType::kBF16)).scale, kPanelMinTokens * 100, "slice");
}

// The grouped products read panels too: q/k/v-like groups, a gated pair, and the down projection
// whose tasks are column blocks of 16 (partial panels), against scalar products of x as the
// ISA in use reads it.
TEST(MatmulPanelsTest, GroupedProductsReadPanels) {
  std::mt19937 rng(21);
  const int64_t n_in = 72, n_ff = 80, n_tokens = 20;
  const PackedMatrix gate(random_matrix(rng, DType::kBF16, n_ff, n_in));
  const PackedMatrix up(random_matrix(rng, DType::kBF16, n_ff, n_in));
  const PackedMatrix down(random_matrix(rng, DType::kBF16, n_in, n_ff));
  std::vector<float> x = random_values(rng, n_tokens * n_in);
  ThreadPool pool(2);

  std::vector<float> g(static_cast<size_t>(n_tokens * n_ff) + kPad, kGuard);
  matmul_grouped(pool, {MatmulGroup{gate.view(), x.data(), n_tokens, g.data()}});
  const Expectations want_g(gate.w, x.data(), n_tokens);
  expect_close(g, want_g(matmul_impl::isa_for(DType::kBF16)).y,
               want_g(matmul_impl::isa_for(DType::kBF16)).scale, n_tokens * n_ff, "matmul_grouped");

  std::vector<float> h(static_cast<size_t>(n_tokens * n_ff) + kPad, kGuard);
  gated_matmul_grouped(pool, {GatedGroup{gate.view(), up.view(), x.data(), n_tokens, h.data()}});
  // Both products read x as this ISA does (rounded to bf16 where it multiplies bf16 pairs).
  const Expectations want_u(up.w, x.data(), n_tokens);
  for (int64_t i = 0; i < n_tokens * n_ff; ++i) {
    const float gv = want_g(matmul_impl::isa_for(DType::kBF16)).y[static_cast<size_t>(i)];
    const float uv = want_u(matmul_impl::isa_for(DType::kBF16)).y[static_cast<size_t>(i)];
    const float want = gv / (1.0f + std::exp(-gv)) * uv;
    // Each product is within kRelTol of its scale (Σ|w||x|); silu's slope is below 1.1.
    const float tol_g =
        kRelTol * want_g(matmul_impl::isa_for(DType::kBF16)).scale[static_cast<size_t>(i)];
    const float tol_u =
        kRelTol * want_u(matmul_impl::isa_for(DType::kBF16)).scale[static_cast<size_t>(i)];
    const float tol = std::fabs(gv) * tol_u + 1.1f * std::fabs(uv) * tol_g + 2 * tol_g * tol_u;
    ASSERT_NEAR(h[static_cast<size_t>(i)], want, tol + 1e-6f * std::fabs(want)) << i;
  }

  std::vector<float> out(static_cast<size_t>(n_tokens * n_in), 0.0f);
  std::vector<float*> out_rows;
  std::vector<float> weights(static_cast<size_t>(n_tokens), 1.0f);
  for (int64_t t = 0; t < n_tokens; ++t) out_rows.push_back(out.data() + t * n_in);
  matmul_grouped_scatter(
      pool, {ScatterGroup{down.view(), h.data(), n_tokens, out_rows.data(), weights.data()}});
  const Expectations want_d(down.w, h.data(), n_tokens);
  out.resize(out.size() + kPad, kGuard);
  expect_close(out, want_d(matmul_impl::isa_for(DType::kBF16)).y,
               want_d(matmul_impl::isa_for(DType::kBF16)).scale, n_tokens * n_in,
               "matmul_grouped_scatter");
}

}  // namespace
}  // namespace duet
