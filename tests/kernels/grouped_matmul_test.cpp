#include "kernels/grouped_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/matmul.h"

namespace duet {
namespace {

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
// including none), odd widths, against matmul_scalar per group.
TEST(GroupedMatmulTest, MatchesScalarPerGroup) {
  ThreadPool pool(3);
  std::mt19937 rng(7);
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
      matmul_grouped(pool, groups);
      for (int64_t n = 0; n <= 17; ++n) {
        std::vector<float> want(static_cast<size_t>(n * rows));
        matmul_scalar(ws[n].m, xs[n].data(), n, want.data());
        std::vector<float> scale = abs_product(ws[n].m, xs[n].data(), n);
        const std::string what = "rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
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

// silu(x · gateᵀ) ⊙ (x · upᵀ) from the scalar products, for groups of 0..17 tokens.
TEST(GroupedMatmulTest, GatedMatchesScalarSiluMul) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
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
      gated_matmul_grouped(pool, groups);
      for (int64_t n = 0; n <= 17; ++n) {
        const size_t size = static_cast<size_t>(n * n_ff);
        std::vector<float> g(size), u(size);
        matmul_scalar(gates[n].m, xs[n].data(), n, g.data());
        matmul_scalar(ups[n].m, xs[n].data(), n, u.data());
        std::vector<float> gs = abs_product(gates[n].m, xs[n].data(), n);
        std::vector<float> us = abs_product(ups[n].m, xs[n].data(), n);
        const std::string what = "n_in " + std::to_string(n_in) + " n_ff " + std::to_string(n_ff) +
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

TEST(GroupedMatmulTest, NoGroupsAndAllEmpty) {
  ThreadPool pool(2);
  matmul_grouped(pool, {});
  gated_matmul_grouped(pool, {});
  std::mt19937 rng(3);
  Weights w = random_weights(rng, 8, 8);
  matmul_grouped(pool, {{w.m, nullptr, 0, nullptr}, {w.m, nullptr, 0, nullptr}});
  gated_matmul_grouped(pool, {{w.m, w.m, nullptr, 0, nullptr}});
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
