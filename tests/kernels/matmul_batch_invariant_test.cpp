// Batch invariance (set_matmul_batch_invariant): a row's product is the same, bit for bit,
// whatever the number of tokens it is computed with: below and above the panel and tiled
// thresholds, with and without panels, in every instruction set this CPU runs, for plain and
// grouped products. Without it the paths for many tokens sum in another order (checked too, so
// that the test shows what the mode changes).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/grouped_matmul.h"
#include "kernels/grouped_matmul_impl.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "kernels/matmul_test_util.h"

namespace duet {
namespace {

using matmul_impl::Path;
using simd::Isa;
using namespace duet::test;  // NOLINT(google-build-using-namespace): the shared helpers

// Turns the mode on for a scope.
struct BatchInvariant {
  explicit BatchInvariant(bool on) { set_matmul_batch_invariant(on); }
  ~BatchInvariant() { set_matmul_batch_invariant(false); }
};

struct Packed {
  explicit Packed(TestMatrix m) : w(std::move(m)) {
    storage.resize(static_cast<size_t>(panel_elems(w.view())) * dtype_size(w.dtype) / 4 + 1);
    pack_panels(w.view(), storage.data());
  }
  Matrix view() const {
    Matrix m = w.view();
    m.panels = storage.data();
    return m;
  }
  TestMatrix w;
  std::vector<float> storage;
};

std::vector<Isa> all_isas() {
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::kScalar);
  return isas;
}

constexpr int64_t kTokenCounts[] = {1, 2, 5, 8, 9, 31, 47, 48, 63, 64, 65, 130};

// Rows of the product of n tokens that differ in any bit from the same token's product alone.
int64_t rows_unlike_alone(Isa isa, ThreadPool& pool, const Matrix& w, const std::vector<float>& x,
                          int64_t n) {
  std::vector<float> many(static_cast<size_t>(n * w.rows));
  matmul_impl::matmul_with(isa, Path::kAuto, pool, w, x.data(), n, many.data());
  int64_t unlike = 0;
  std::vector<float> one(static_cast<size_t>(w.rows));
  for (int64_t t = 0; t < n; ++t) {
    matmul_impl::matmul_with(isa, Path::kAuto, pool, w, x.data() + t * w.cols, 1, one.data());
    unlike += std::memcmp(one.data(), many.data() + t * w.rows, one.size() * sizeof(float)) != 0;
  }
  return unlike;
}

TEST(MatmulBatchInvariantTest, EveryRowEqualsItsProductAloneWhateverTheTokenCount) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  bool some_path_differs = false;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Packed w(random_matrix(rng, dtype, 200, 333));
    const std::vector<float> x = random_values(rng, 130 * w.w.cols);
    for (Isa isa : all_isas()) {
      for (int64_t n : kTokenCounts) {
        for (bool panels : {false, true}) {
          const Matrix m = panels ? w.view() : w.w.view();
          const std::string what = case_name(isa, dtype, m.cols, n) + (panels ? " panels" : "");
          {
            const BatchInvariant on(true);
            EXPECT_EQ(rows_unlike_alone(isa, pool, m, x, n), 0) << what;
          }
          some_path_differs |= rows_unlike_alone(isa, pool, m, x, n) > 0;
        }
      }
    }
  }
  // On a SIMD CPU the many-token paths sum in another order: what the mode is for.
  if (!simd_isas().empty()) {
    EXPECT_TRUE(some_path_differs);
  }
}

TEST(MatmulBatchInvariantTest, GroupedProductsToo) {
  ThreadPool pool(2);
  std::mt19937 rng(6);
  const BatchInvariant on(true);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Packed gate(random_matrix(rng, dtype, 96, 160)), up(random_matrix(rng, dtype, 96, 160));
    const std::vector<float> x = random_values(rng, 130 * 160);
    for (Isa isa : all_isas()) {
      for (int64_t n : kTokenCounts) {
        // The n tokens as one group, and each token as a group of its own.
        std::vector<float> many(static_cast<size_t>(n * 96)), alone(many.size());
        std::vector<float> gated_many(many.size()), gated_alone(many.size());
        std::vector<MatmulGroup> one{{gate.view(), x.data(), n, many.data()}};
        std::vector<GatedGroup> gated_one{{gate.view(), up.view(), x.data(), n, gated_many.data()}};
        std::vector<MatmulGroup> each;
        std::vector<GatedGroup> gated_each;
        for (int64_t t = 0; t < n; ++t) {
          each.push_back({gate.view(), x.data() + t * 160, 1, alone.data() + t * 96});
          gated_each.push_back(
              {gate.view(), up.view(), x.data() + t * 160, 1, gated_alone.data() + t * 96});
        }
        grouped_impl::matmul_grouped_with(isa, pool, one);
        grouped_impl::matmul_grouped_with(isa, pool, each);
        grouped_impl::gated_matmul_grouped_with(isa, pool, gated_one);
        grouped_impl::gated_matmul_grouped_with(isa, pool, gated_each);
        const std::string what = case_name(isa, dtype, 160, n);
        EXPECT_EQ(std::memcmp(many.data(), alone.data(), many.size() * sizeof(float)), 0) << what;
        EXPECT_EQ(std::memcmp(gated_many.data(), gated_alone.data(), many.size() * sizeof(float)),
                  0)
            << "gated " << what;
      }
    }
  }
}

}  // namespace
}  // namespace duet
