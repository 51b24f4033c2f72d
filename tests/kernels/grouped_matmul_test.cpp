#include "kernels/grouped_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/grouped_matmul_impl.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "kernels/quantize.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

using grouped_impl::gated_matmul_grouped_with;
using grouped_impl::matmul_grouped_scatter_with;
using grouped_impl::matmul_grouped_with;
using simd::Isa;

// The instruction set the public entries run these tests' weights (bf16) on.
Isa public_isa() {
  return matmul_impl::isa_for(DType::kBF16);
}

constexpr float kRelTol = 1e-5f;
constexpr float kGuard = 12345.0f;

// bf16 weights of random normal values, with their storage.
struct Weights {
  std::vector<uint16_t> data;
  Matrix m;
};

Weights random_weights(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Weights w;
  w.data.resize(static_cast<size_t>(rows * cols));
  for (uint16_t& v : w.data) v = f32_to_bf16(normal(rng));
  w.m = Matrix{DType::kBF16, rows, cols, w.data.data()};
  return w;
}

std::vector<float> random_vector(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = normal(rng);
  return v;
}

// Every instruction set this CPU runs, the emulation of AVX-512 BF16 included.
std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa :
       {Isa::kAvx512Bf16, Isa::kAvx512Bf16Emulated, Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (simd::isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// x as isa's kernels multiply it by bf16 weights: rounded to bf16 where matmul_impl::rounds_x.
std::vector<float> as_multiplied(Isa isa, const std::vector<float>& x) {
  std::vector<float> out(x);
  if (matmul_impl::rounds_x(isa, DType::kBF16)) {
    for (float& v : out) v = bf16_to_f32(f32_to_bf16(v));
  }
  return out;
}

// Σ|w||x| per output: bounds the rounding error of any summation order.
std::vector<float> abs_product(const Matrix& w, const float* x, int64_t n_tokens) {
  std::vector<uint16_t> wa(static_cast<const uint16_t*>(w.data),
                           static_cast<const uint16_t*>(w.data) + w.rows * w.cols);
  for (uint16_t& v : wa) v &= 0x7fff;
  std::vector<float> xa(x, x + n_tokens * w.cols);
  for (float& v : xa) v = std::fabs(v);
  std::vector<float> out(static_cast<size_t>(n_tokens * w.rows));
  matmul_scalar(Matrix{DType::kBF16, w.rows, w.cols, wa.data()}, xa.data(), n_tokens, out.data());
  return out;
}

// Groups of every size from 0 to 17 rows (the rows a routed expert gets in a decode batch,
// including none), odd widths, against matmul_scalar per group, on every instruction set.
TEST(GroupedMatmulTest, MatchesScalarPerGroup) {
  ThreadPool pool(3);
  std::mt19937 rng(7);
  for (Isa isa : isas()) {
    for (int64_t cols : {1, 33, 100, 256}) {
      for (int64_t rows : {1, 37, 130}) {
        std::vector<Weights> ws;
        std::vector<std::vector<float>> xs, ys;
        std::vector<MatmulGroup> groups;
        for (int64_t n = 0; n <= 17; ++n) {
          ws.push_back(random_weights(rng, rows, cols));
          xs.push_back(random_vector(rng, n * cols));
          ys.emplace_back(static_cast<size_t>(n * rows + 8), kGuard);
        }
        for (int64_t n = 0; n <= 17; ++n) {
          groups.push_back({ws[n].m, xs[n].data(), n, ys[n].data()});
        }
        if (isa == public_isa()) {
          matmul_grouped(pool, groups);  // the public entry
        } else {
          matmul_grouped_with(isa, pool, groups);
        }
        for (int64_t n = 0; n <= 17; ++n) {
          const std::vector<float> x = as_multiplied(isa, xs[n]);
          std::vector<float> want(static_cast<size_t>(n * rows));
          matmul_scalar(ws[n].m, x.data(), n, want.data());
          std::vector<float> scale = abs_product(ws[n].m, x.data(), n);
          const std::string what = std::string(simd::isa_name(isa)) + " rows " +
                                   std::to_string(rows) + " cols " + std::to_string(cols) +
                                   " n_tokens " + std::to_string(n);
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_NEAR(ys[n][i], want[i], kRelTol * scale[i] + 1e-30f) << what << " at " << i;
          }
          for (size_t i = want.size(); i < ys[n].size(); ++i) {
            ASSERT_EQ(ys[n][i], kGuard) << what << ": wrote past the end";
          }
        }
      }
    }
  }
}

// Up to 4 tokens in every group (decode), the products share out long runs of rows, two tasks per
// thread, instead of 64-row tasks: each group's results are the same bits as when a group of 5
// tokens among them brings the 64-row tasks back (plain, gated and scattered products).
TEST(GroupedMatmulTest, DecodeTasksOfLongRunsGiveTheSameBits) {
  ThreadPool pool(2);
  std::mt19937 rng(13);
  const int64_t n_in = 130, n_ff = 300;
  const std::vector<int64_t> few = {1, 4, 0, 2, 3};
  for (Isa isa : isas()) {
    const std::string what = simd::isa_name(isa);
    std::vector<Weights> gates, ups, downs;
    std::vector<std::vector<float>> xs, ins;
    for (int64_t n : few) {
      gates.push_back(random_weights(rng, n_ff, n_in));
      ups.push_back(random_weights(rng, n_ff, n_in));
      downs.push_back(random_weights(rng, n_in, n_ff));
      xs.push_back(random_vector(rng, n * n_in));
      ins.push_back(random_vector(rng, n * n_ff));
    }
    const Weights extra_w = random_weights(rng, n_ff, n_in),
                  extra_down = random_weights(rng, n_in, n_ff);
    const std::vector<float> extra_x = random_vector(rng, 5 * n_in),
                             extra_in = random_vector(rng, 5 * n_ff);
    // Pass 0: the few groups alone (long runs); pass 1: with the 5-token group (64-row tasks).
    std::vector<std::vector<float>> plain[2], gated[2];
    std::vector<float> scattered[2];
    for (int pass = 0; pass < 2; ++pass) {
      const size_t n_groups = few.size() + static_cast<size_t>(pass);
      std::vector<MatmulGroup> mg;
      std::vector<GatedGroup> gg;
      std::vector<ScatterGroup> sg;
      std::vector<std::vector<float*>> rows(n_groups);
      std::vector<std::vector<float>> weights(n_groups);
      plain[pass].resize(n_groups);
      gated[pass].resize(n_groups);
      scattered[pass].assign(static_cast<size_t>(20 * n_in), 0.5f);
      int64_t next_row = 0;
      for (size_t g = 0; g < n_groups; ++g) {
        const bool extra = g == few.size();
        const int64_t n = extra ? 5 : few[g];
        const float* x = extra ? extra_x.data() : xs[g].data();
        plain[pass][g].assign(static_cast<size_t>(n * n_ff), kGuard);
        gated[pass][g].assign(static_cast<size_t>(n * n_ff), kGuard);
        mg.push_back({extra ? extra_w.m : gates[g].m, x, n, plain[pass][g].data()});
        gg.push_back({extra ? extra_w.m : gates[g].m, extra ? extra_w.m : ups[g].m, x, n,
                      gated[pass][g].data()});
        for (int64_t i = 0; i < n; ++i) {
          rows[g].push_back(scattered[pass].data() + (next_row++) * n_in);
          weights[g].push_back(0.25f * static_cast<float>(i + 1));
        }
        sg.push_back({extra ? extra_down.m : downs[g].m, extra ? extra_in.data() : ins[g].data(), n,
                      rows[g].data(), weights[g].data()});
      }
      matmul_grouped_with(isa, pool, mg);
      gated_matmul_grouped_with(isa, pool, gg);
      matmul_grouped_scatter_with(isa, pool, sg, {});
    }
    for (size_t g = 0; g < few.size(); ++g) {
      EXPECT_EQ(plain[0][g], plain[1][g]) << what << " plain group " << g;
      EXPECT_EQ(gated[0][g], gated[1][g]) << what << " gated group " << g;
    }
    const size_t shared = 10 * n_in;  // the output rows of the few groups (1 + 4 + 0 + 2 + 3)
    EXPECT_EQ(std::vector<float>(scattered[0].begin(), scattered[0].begin() + shared),
              std::vector<float>(scattered[1].begin(), scattered[1].begin() + shared))
        << what << " scatter";
  }
}

// Groups that multiply the same rows of x (attention's q, k and v; at one token a MoE layer's
// experts, whose gathered rows all point at the token's row) share one quantized or rounded copy
// of x: each group's results are the same bits as that group alone. A group of other weights
// (another width, or f32) over the same rows gets x made for its own.
TEST(GroupedMatmulTest, GroupsSharingXGiveEachGroupsBitsAlone) {
  ThreadPool pool(2);
  std::mt19937 rng(21);
  const int64_t n_in = 256, n_out = 72;
  const std::vector<float> x = random_vector(rng, 3 * n_in);                   // [3, n_in]
  const std::vector<const float*> gathered = {x.data() + 2 * n_in, x.data()};  // rows 2 and 0
  std::vector<Weights> ws;
  for (int i = 0; i < 4; ++i) ws.push_back(random_weights(rng, n_out, n_in));
  const Weights narrow = random_weights(rng, n_out, n_in - 128);
  const std::vector<float> wide_f32 = random_vector(rng, n_out * n_in);
  const QuantizedMatrix q8(ws[2].m, DType::kQ8), q4(ws[3].m, DType::kQ4);
  const Matrix f32{DType::kF32, n_out, n_in, wide_f32.data()};
  for (Isa isa : isas()) {
    const std::vector<std::pair<Matrix, XRows>> cases = {
        {ws[0].m, XRows(x.data())},          {ws[1].m, XRows(x.data())},
        {q8.view(), XRows(x.data())},        {q4.view(), XRows(x.data())},
        {narrow.m, XRows(x.data())},         {f32, XRows(x.data())},
        {q8.view(), XRows(gathered.data())}, {q4.view(), XRows(gathered.data())},
        {ws[1].m, XRows(gathered.data())}};
    std::vector<MatmulGroup> together;
    std::vector<std::vector<float>> ys(cases.size()), alone(cases.size());
    for (size_t g = 0; g < cases.size(); ++g) {
      ys[g].assign(2 * n_out, kGuard);
      alone[g].assign(2 * n_out, kGuard);
      together.push_back({cases[g].first, cases[g].second, 2, ys[g].data()});
    }
    matmul_grouped_with(isa, pool, together);
    for (size_t g = 0; g < cases.size(); ++g) {
      matmul_grouped_with(isa, pool, {{cases[g].first, cases[g].second, 2, alone[g].data()}});
      EXPECT_EQ(ys[g], alone[g]) << simd::isa_name(isa) << " group " << g;
    }
  }
}

// silu(x · gateᵀ) ⊙ (x · upᵀ) from the scalar products, for groups of 0..17 tokens, on every
// instruction set.
TEST(GroupedMatmulTest, GatedMatchesScalarSiluMul) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (Isa isa : isas()) {
    for (int64_t n_in : {7, 64, 130}) {
      for (int64_t n_ff : {5, 64, 200}) {
        std::vector<Weights> gates, ups;
        std::vector<std::vector<float>> xs, ys;
        for (int64_t n = 0; n <= 17; ++n) {
          gates.push_back(random_weights(rng, n_ff, n_in));
          ups.push_back(random_weights(rng, n_ff, n_in));
          xs.push_back(random_vector(rng, n * n_in));
          ys.emplace_back(static_cast<size_t>(n * n_ff + 8), kGuard);
        }
        std::vector<GatedGroup> groups;
        for (int64_t n = 0; n <= 17; ++n) {
          groups.push_back({gates[n].m, ups[n].m, xs[n].data(), n, ys[n].data()});
        }
        if (isa == public_isa()) {
          gated_matmul_grouped(pool, groups);  // the public entry
        } else {
          gated_matmul_grouped_with(isa, pool, groups);
        }
        for (int64_t n = 0; n <= 17; ++n) {
          const size_t size = static_cast<size_t>(n * n_ff);
          const std::vector<float> x = as_multiplied(isa, xs[n]);
          std::vector<float> g(size), u(size);
          matmul_scalar(gates[n].m, x.data(), n, g.data());
          matmul_scalar(ups[n].m, x.data(), n, u.data());
          std::vector<float> gs = abs_product(gates[n].m, x.data(), n);
          std::vector<float> us = abs_product(ups[n].m, x.data(), n);
          const std::string what = std::string(simd::isa_name(isa)) + " n_in " +
                                   std::to_string(n_in) + " n_ff " + std::to_string(n_ff) +
                                   " n_tokens " + std::to_string(n);
          for (size_t i = 0; i < size; ++i) {
            const double silu = g[i] / (1.0 + std::exp(-double(g[i])));
            const double want = silu * u[i];
            // Errors of g and u (relative to their Σ|w||x|) carried through silu (slope < 1.1).
            const double tol = 2e-5 * (1.1 * gs[i] * std::fabs(u[i]) + std::fabs(silu) * us[i]) +
                               1e-6 * std::fabs(want) + 1e-30;
            ASSERT_NEAR(ys[n][i], want, tol) << what << " at " << i;
          }
          for (size_t i = size; i < ys[n].size(); ++i) {
            ASSERT_EQ(ys[n][i], kGuard) << what << ": wrote past the end";
          }
        }
      }
    }
  }
}

// Rows gathered in place (a routed expert's rows, scattered over a receive buffer in any order)
// give exactly what a contiguous copy of them gives, on the direct path and the tiled one, on
// every instruction set and through the public entries.
TEST(GroupedMatmulTest, GatheredRowsMatchContiguousCopy) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  const int64_t n_in = 100, n_ff = 70, n_pool = 200;
  const std::vector<float> pool_rows = random_vector(rng, n_pool * n_in);
  Weights gate = random_weights(rng, n_ff, n_in), up = random_weights(rng, n_ff, n_in);
  for (int64_t n : {1, 3, 17, 60, 130}) {
    std::vector<const float*> rows;
    std::vector<float> copy;
    for (int64_t t = 0; t < n; ++t) {
      const float* r = pool_rows.data() + (rng() % n_pool) * n_in;  // repeats allowed
      rows.push_back(r);
      copy.insert(copy.end(), r, r + n_in);
    }
    std::vector<float> got(static_cast<size_t>(n * n_ff)), want(got.size());
    for (Isa isa : isas()) {
      const std::string what = std::string(simd::isa_name(isa)) + ", " + std::to_string(n);
      matmul_grouped_with(isa, pool, {{gate.m, XRows(rows.data()), n, got.data()}});
      matmul_grouped_with(isa, pool, {{gate.m, copy.data(), n, want.data()}});
      EXPECT_EQ(got, want) << "matmul, " << what << " tokens";
      gated_matmul_grouped_with(isa, pool, {{gate.m, up.m, XRows(rows.data()), n, got.data()}});
      gated_matmul_grouped_with(isa, pool, {{gate.m, up.m, copy.data(), n, want.data()}});
      EXPECT_EQ(got, want) << "gated, " << what << " tokens";
    }
    matmul_grouped(pool, {{gate.m, XRows(rows.data()), n, got.data()}});
    matmul_grouped_with(public_isa(), pool, {{gate.m, copy.data(), n, want.data()}});
    EXPECT_EQ(got, want) << "matmul_grouped(), " << n << " tokens";
    gated_matmul_grouped(pool, {{gate.m, up.m, XRows(rows.data()), n, got.data()}});
    gated_matmul_grouped_with(public_isa(), pool, {{gate.m, up.m, copy.data(), n, want.data()}});
    EXPECT_EQ(got, want) << "gated_matmul_grouped(), " << n << " tokens";
  }
}

// Experts' down projections with the weighted sum over a token's experts fused in: tokens route to
// several groups; the even tokens' rows start as garbage and are cleared, the odd ones' hold 1.5
// and are added to, so each ends as (0 or 1.5) + Σ weight · (x · wᵀ); rows that no group names
// are left alone. Group sizes from 0 to 17 and one on the tiled path; output widths below, at and
// above a task's column block. And decode's groups of at most 4 tokens (each group's product
// whole, then added up in order: on the calling thread, or at the widest width on the pool).
TEST(GroupedMatmulTest, ScatterAddsWeightedProductsToOutputRows) {
  ThreadPool pool(3);
  std::mt19937 rng(9);
  const std::vector<std::vector<int64_t>> size_sets = {{0, 1, 2, 5, 17, 0, 3, 60},
                                                       {0, 1, 4, 2, 0, 3, 1, 4}};
  for (Isa isa : isas()) {
    for (const std::vector<int64_t>& sizes : size_sets) {
      for (int64_t n_out : {5, 64, 200, 2100}) {
        if (n_out == 2100 && sizes[2] != 4) continue;
        const int64_t n_in = 37, n_tok = 40;
        std::vector<float> out(static_cast<size_t>((n_tok + 1) * n_out), kGuard);  // last: unnamed
        std::vector<Weights> ws;
        std::vector<std::vector<float>> xs, wts;
        std::vector<std::vector<float*>> outs;
        std::vector<int64_t> tokens_of;  // [groups, rows] flattened: the token of each row
        std::vector<ScatterGroup> groups;
        for (int64_t n : sizes) {
          ws.push_back(random_weights(rng, n_out, n_in));
          xs.push_back(random_vector(rng, n * n_in));
          wts.push_back(random_vector(rng, n));
          outs.emplace_back();
          for (int64_t i = 0; i < n; ++i) {
            tokens_of.push_back(static_cast<int64_t>(rng() % n_tok));
            outs.back().push_back(out.data() + tokens_of.back() * n_out);
          }
        }
        for (size_t g = 0; g < ws.size(); ++g) {
          const int64_t n = static_cast<int64_t>(wts[g].size());
          groups.push_back({ws[g].m, xs[g].data(), n, outs[g].data(), wts[g].data()});
        }
        std::vector<float*> clear;
        for (int64_t t = 0; t < n_tok; ++t) {
          if (t % 2 == 0)
            clear.push_back(out.data() + t * n_out);
          else
            std::fill_n(out.data() + t * n_out, n_out, 1.5f);
        }
        if (isa == public_isa()) {
          matmul_grouped_scatter(pool, groups, clear);  // the public entry
        } else {
          matmul_grouped_scatter_with(isa, pool, groups, clear);
        }
        std::vector<double> want(static_cast<size_t>(n_tok * n_out), 0.0), scale(want.size(), 0.0);
        for (int64_t t = 1; t < n_tok; t += 2) std::fill_n(want.begin() + t * n_out, n_out, 1.5);
        std::vector<bool> named(static_cast<size_t>(n_tok), false);
        size_t row = 0;
        for (size_t g = 0; g < ws.size(); ++g) {
          const int64_t n = static_cast<int64_t>(wts[g].size());
          const std::vector<float> x = as_multiplied(isa, xs[g]);
          std::vector<float> y(static_cast<size_t>(n * n_out));
          matmul_scalar(ws[g].m, x.data(), n, y.data());
          std::vector<float> ys = abs_product(ws[g].m, x.data(), n);
          for (int64_t i = 0; i < n; ++i, ++row) {
            named[tokens_of[row]] = true;
            for (int64_t c = 0; c < n_out; ++c) {
              want[tokens_of[row] * n_out + c] += double(wts[g][i]) * y[i * n_out + c];
              scale[tokens_of[row] * n_out + c] += std::fabs(wts[g][i]) * ys[i * n_out + c];
            }
          }
        }
        for (int64_t t = 0; t <= n_tok; ++t) {
          for (int64_t c = 0; c < n_out; ++c) {
            const float got = out[t * n_out + c];
            if (t == n_tok || (!named[t] && t % 2 == 1)) {
              ASSERT_EQ(got, t == n_tok ? kGuard : 1.5f)
                  << simd::isa_name(isa) << " n_out " << n_out << ": unnamed row " << t
                  << " written";
            } else {
              ASSERT_NEAR(got, want[t * n_out + c], 2 * kRelTol * scale[t * n_out + c] + 1e-30)
                  << simd::isa_name(isa) << " n_out " << n_out << " token " << t << " column " << c;
            }
          }
        }
      }
    }
  }
}

TEST(GroupedMatmulTest, ScatterRejectsGroupsOfDifferentWidths) {
  ThreadPool pool(1);
  std::mt19937 rng(3);
  Weights a = random_weights(rng, 8, 4), b = random_weights(rng, 6, 4);
  std::vector<float> x(4), out(8), w(1, 1.0f);
  std::vector<float*> rows = {out.data()};
  EXPECT_THROW(matmul_grouped_scatter(
                   pool, {{a.m, x.data(), 1, rows.data(), w.data()},
                          {b.m, x.data(), 1, rows.data(), w.data()}}),
               Error);
}

TEST(GroupedMatmulTest, NoGroupsAndAllEmpty) {
  ThreadPool pool(2);
  matmul_grouped(pool, {});
  gated_matmul_grouped(pool, {});
  std::mt19937 rng(3);
  Weights w = random_weights(rng, 8, 8);
  matmul_grouped(pool, {{w.m, nullptr, 0, nullptr}, {w.m, nullptr, 0, nullptr}});
  gated_matmul_grouped(pool, {{w.m, w.m, nullptr, 0, nullptr}});
  matmul_grouped_scatter(pool, {});
  matmul_grouped_scatter(pool, {{w.m, nullptr, 0, nullptr, nullptr}});
}

TEST(GroupedMatmulTest, RejectsMismatchedGateAndUp) {
  ThreadPool pool(1);
  std::mt19937 rng(3);
  Weights gate = random_weights(rng, 8, 4), up = random_weights(rng, 6, 4);
  std::vector<float> x(4), y(8);
  EXPECT_THROW(gated_matmul_grouped(pool, {{gate.m, up.m, x.data(), 1, y.data()}}), Error);
}

}  // namespace
}  // namespace duet
