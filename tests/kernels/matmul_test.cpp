#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/matmul_impl.h"
#include "kernels/matmul_test_util.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

using matmul_impl::Path;
using simd::Isa;
using namespace duet::test;  // NOLINT(google-build-using-namespace): the shared helpers

// A matrix of cols columns and dtype, for direct_x (which reads only those, and the panels).
Matrix weights_of(DType dtype, int64_t cols) {
  Matrix m;
  m.dtype = dtype;
  m.rows = 1;
  m.cols = cols;
  return m;
}

const char* path_name(Path p) {
  switch (p) {
    case Path::kAuto:
      return "auto";
    case Path::kDirect:
      return "direct";
    case Path::kTiled:
      return "tiled";
  }
  return "?";
}

TEST(MatmulTest, ScalarMatchesHandComputedProduct) {
  // W [2, 3], x [2 tokens, 3] → y [2, 2]
  TestMatrix w{DType::kF32, 2, 3, {1, 2, 3, -1, 0.5f, 4}, {}};
  std::vector<float> x = {1, 1, 1, 2, -1, 0.25f};
  std::vector<float> y(4);
  matmul_scalar(w.view(), x.data(), 2, y.data());
  EXPECT_EQ(y, (std::vector<float>{6, 3.5f, 0.75f, -1.5f}));

  // matmul_xw with W [2 rows, 3 cols]: x [2 tokens, 2] → y [2, 3]
  std::vector<float> x2 = {1, 2, -1, 0.5f};
  std::vector<float> y2(6);
  matmul_xw_scalar(w.view(), x2.data(), 2, y2.data());
  EXPECT_EQ(y2, (std::vector<float>{-1, 3, 11, -1.5f, -1.75f, -1}));
}

TEST(MatmulTest, ScalarBf16WidensExactly) {
  TestMatrix w{DType::kBF16, 1, 3, {}, {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f)}};
  std::vector<float> x = {2, 3, 4};
  float y = 0;
  matmul_scalar(w.view(), x.data(), 1, &y);
  EXPECT_EQ(y, 3.0f - 6.0f + 1.0f);
}

TEST(MatmulTest, IsaNameIsKnown) {
  std::string isa = matmul_isa();
  EXPECT_TRUE(isa == "avx512bf16" || isa == "avx512" || isa == "avx2" || isa == "scalar") << isa;
  EXPECT_EQ(isa, simd::isa_name(simd::best_isa()));
}

// Every SIMD path × dtype × shape against matmul_scalar.
TEST(MatmulTest, SimdMatchesScalar) {
  ThreadPool pool(3);
  std::mt19937 rng(1234);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {1, 7, 16, 17, 33, 100, 513, 1003}) {
      for (int64_t rows : {1, 5, 37}) {
        TestMatrix w = random_matrix(rng, dtype, rows, cols);
        for (int64_t n_tokens : {0, 1, 3, 8, 9, 31, 64, 70}) {
          // x starts one float into its buffer so rows are not 64-byte aligned.
          std::vector<float> x_buf = random_values(rng, n_tokens * cols + 1);
          const float* x = x_buf.data() + 1;
          int64_t n_out = n_tokens * rows;
          const Expectations want(w, x, n_tokens, kPad);
          for (Isa isa : simd_isas()) {
            for (Path path : {Path::kAuto, Path::kDirect, Path::kTiled}) {
              std::string what = std::string(simd::isa_name(isa)) + " " + path_name(path) + " " +
                                 dtype_name(dtype) + " rows " + std::to_string(rows) + " cols " +
                                 std::to_string(cols) + " n_tokens " + std::to_string(n_tokens);
              std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
              std::fill(got.begin(), got.begin() + n_out, std::nanf(""));
              matmul_impl::matmul_with(isa, path, pool, w.view(), x, n_tokens, got.data());
              expect_close(got, want(isa).y, want(isa).scale, n_out, what);
            }
          }
        }
      }
    }
  }
}

// Many rows, so every thread gets several chunks; the pooled scalar fallback too.
TEST(MatmulTest, ManyRowsAllPathsAndPublicEntry) {
  ThreadPool pool(2);
  std::mt19937 rng(99);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t rows = 1003, cols = 70;
    TestMatrix w = random_matrix(rng, dtype, rows, cols);
    for (int64_t n_tokens : {1, 9, 64}) {
      std::vector<float> x = random_values(rng, n_tokens * cols);
      int64_t n_out = n_tokens * rows;
      const Expectations want(w, x.data(), n_tokens, kPad);
      std::vector<Isa> isas = simd_isas();
      isas.push_back(Isa::kScalar);
      for (Isa isa : isas) {
        std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
        matmul_impl::matmul_with(isa, Path::kAuto, pool, w.view(), x.data(), n_tokens, got.data());
        expect_close(got, want(isa).y, want(isa).scale, n_out,
                     std::string("pooled ") + simd::isa_name(isa));
      }
      std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
      matmul(pool, w.view(), x.data(), n_tokens, got.data());
      const Expected& best = want(matmul_impl::isa_for(dtype));
      expect_close(got, best.y, best.scale, n_out, "matmul()");
    }
  }
}

// Every token count from 1 to 17 (the rows a routed expert gets in a decode batch: register
// blocks of every size, ragged token blocks) on both paths, through matmul_rows_with on a range
// of rows written at a row stride wider than the range; nothing else may be written.
TEST(MatmulTest, EveryTokenCountOnARowRange) {
  std::mt19937 rng(17);
  const int64_t rows = 23, r_begin = 5, r_end = 19, ldy = 20;
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::kScalar);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    // Odd widths: part of one vector, of 16-float vectors, of 32-bf16 vectors.
    for (int64_t cols : {1, 45, 67}) {
      TestMatrix w = random_matrix(rng, dtype, rows, cols);
      for (int64_t n_tokens = 1; n_tokens <= 17; ++n_tokens) {
        std::vector<float> x = random_values(rng, n_tokens * cols);
        const Expectations want(w, x.data(), n_tokens);
        for (Isa isa : isas) {
          for (Path path : {Path::kDirect, Path::kTiled}) {
            const std::string what = std::string(simd::isa_name(isa)) + " " + path_name(path) +
                                     " " + dtype_name(dtype) + " cols " + std::to_string(cols) +
                                     " n_tokens " + std::to_string(n_tokens);
            std::vector<float> got(static_cast<size_t>(n_tokens * ldy), kGuard);
            matmul_impl::matmul_rows_with(isa, path, w.view(), x.data(), n_tokens, got.data(), ldy,
                                          r_begin, r_end);
            expect_row_range(got, want(isa).y, want(isa).scale, n_tokens, rows, ldy, r_begin, r_end,
                             what);
          }
        }
      }
    }
  }
}

// The tiled path's panels (64 weight rows × 128 columns with AVX-512, 16 × 128 with AVX2, 64 ×
// 256 with AVX-512 BF16) on a row range that starts mid-panel and ends in a partial panel, with
// columns that leave every kind of tail when packing (bf16 pairs of 2 · width columns, a whole
// vector, part of one, an odd number of columns in the last block) and several column blocks;
// each token block size occurs, and 130 tokens make two token groups. Nothing outside the range
// is written.
TEST(MatmulTest, TiledPanelEdges) {
  std::mt19937 rng(64);
  const int64_t rows = 200, r_begin = 3, r_end = 197, ldy = r_end - r_begin + 5;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {5, 32, 40, 63, 257, 300, 513}) {
      TestMatrix w = random_matrix(rng, dtype, rows, cols);
      for (int64_t n_tokens : {1, 6, 7, 13, 50, 130}) {
        std::vector<float> x = random_values(rng, n_tokens * cols);
        const Expectations want(w, x.data(), n_tokens);
        for (Isa isa : simd_isas()) {
          const std::string what = case_name(isa, dtype, cols, n_tokens);
          std::vector<float> got(static_cast<size_t>(n_tokens * ldy), kGuard);
          matmul_impl::matmul_rows_with(isa, Path::kTiled, w.view(), x.data(), n_tokens, got.data(),
                                        ldy, r_begin, r_end);
          expect_row_range(got, want(isa).y, want(isa).scale, n_tokens, rows, ldy, r_begin, r_end,
                           what);
        }
      }
    }
  }
}

// x given as rows at a stride wider than cols (as direct_x hands out a copy), or gathered from
// anywhere in any order, gives the same products, bit for bit, as the same rows contiguous, on
// every path and instruction set.
TEST(MatmulTest, StridedAndGatheredRowsMatchContiguous) {
  std::mt19937 rng(21);
  const int64_t rows = 37, cols = 70, ld = 96;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    TestMatrix w = random_matrix(rng, dtype, rows, cols);
    for (int64_t n_tokens : {1, 5, 7, 20, 50}) {
      std::vector<float> x = random_values(rng, n_tokens * cols);
      std::vector<float> strided(static_cast<size_t>(n_tokens * ld), kGuard);
      std::vector<const float*> gathered(static_cast<size_t>(n_tokens));
      for (int64_t t = 0; t < n_tokens; ++t) {
        std::copy_n(x.begin() + t * cols, cols, strided.begin() + t * ld);
        // Row t of x from row n_tokens - 1 - t of the strided copy, read in reverse order.
        const int64_t from = n_tokens - 1 - t;
        gathered[static_cast<size_t>(from)] = strided.data() + t * ld;
      }
      std::vector<float> reversed(x.size());
      for (int64_t t = 0; t < n_tokens; ++t) {
        std::copy_n(x.begin() + (n_tokens - 1 - t) * cols, cols, reversed.begin() + t * cols);
      }
      for (Isa isa : simd_isas()) {
        for (Path path : {Path::kDirect, Path::kTiled}) {
          const std::string what = std::string(simd::isa_name(isa)) + " " + path_name(path) + " " +
                                   dtype_name(dtype) + " n_tokens " + std::to_string(n_tokens);
          std::vector<float> want(static_cast<size_t>(n_tokens * rows));
          std::vector<float> got(want.size()), got_gathered(want.size()),
              want_reversed(want.size());
          matmul_impl::matmul_rows_with(isa, path, w.view(), x.data(), n_tokens, want.data(), rows,
                                        0, rows);
          matmul_impl::matmul_rows_with(isa, path, w.view(), XRows(strided.data(), ld), n_tokens,
                                        got.data(), rows, 0, rows);
          EXPECT_EQ(got, want) << what << " strided";
          matmul_impl::matmul_rows_with(isa, path, w.view(), reversed.data(), n_tokens,
                                        want_reversed.data(), rows, 0, rows);
          matmul_impl::matmul_rows_with(isa, path, w.view(), XRows(gathered.data()), n_tokens,
                                        got_gathered.data(), rows, 0, rows);
          EXPECT_EQ(got_gathered, want_reversed) << what << " gathered";
        }
      }
    }
  }
}

// direct_x copies x only where the direct path would otherwise copy it in every task: several
// tokens, below the tiled path's threshold, rows not aligned. The copy holds the same rows.
TEST(MatmulTest, DirectXCopiesOnlyUnalignedRowsOfSeveralTokens) {
  const int64_t cols = 64, few = 1, many = matmul_impl::tiled_min_tokens(DType::kBF16);
  std::vector<float> storage(static_cast<size_t>((many + 1) * cols + 64));
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<float>(i);
  float* aligned = matmul_impl::aligned_floats(storage, (many + 1) * cols);
  const float* unaligned = aligned + 1;
  matmul_impl::XBuffer buf;

  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    EXPECT_EQ(matmul_impl::direct_x(isa, weights_of(DType::kBF16, cols), unaligned, few, buf).base,
              unaligned);
    EXPECT_EQ(matmul_impl::direct_x(isa, weights_of(DType::kBF16, cols), unaligned, many, buf).base,
              unaligned);
    EXPECT_EQ(matmul_impl::direct_x(isa, weights_of(DType::kBF16, cols), aligned, 8, buf).base,
              aligned);
  }

  for (const XRows x : {XRows(unaligned), XRows(aligned, cols + 1)}) {
    const XRows copy =
        matmul_impl::direct_x(Isa::kAvx512, weights_of(DType::kBF16, cols), x, 8, buf);
    ASSERT_NE(copy.base, x.base);
    EXPECT_TRUE(matmul_impl::aligned_rows(copy, cols));
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(std::vector<float>(copy.row(t, cols), copy.row(t, cols) + cols),
                std::vector<float>(x.row(t, cols), x.row(t, cols) + cols))
          << "row " << t;
    }
  }
  // Read from panels, x is broadcast where it is: never copied.
  Matrix packed = weights_of(DType::kBF16, cols);
  packed.panels = storage.data();
  EXPECT_EQ(
      matmul_impl::direct_x(Isa::kAvx512, packed, unaligned, matmul_impl::kPanelMinTokens, buf)
          .base,
      unaligned);
  const float* rows[2] = {aligned + 3 * cols, aligned};
  const XRows gathered =
      matmul_impl::direct_x(Isa::kAvx2, weights_of(DType::kF32, cols), XRows(rows), 2, buf);
  ASSERT_EQ(gathered.rows, nullptr);
  EXPECT_EQ(gathered.row(0, cols)[0], aligned[3 * cols]);
  EXPECT_EQ(gathered.row(1, cols)[cols - 1], aligned[cols - 1]);
}

// On an instruction set that multiplies bf16 pairs, direct_x rounds x for bf16 weights at every
// token count (both paths read it so), and leaves it alone for f32 weights.
TEST(MatmulTest, DirectXRoundsForBf16WeightsOnDpbf16) {
  if (!simd::isa_supported(Isa::kAvx512Bf16Emulated)) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(8);
  const int64_t cols = 37;
  matmul_impl::XBuffer buf;
  for (int64_t n_tokens : {int64_t{1}, int64_t{7}, matmul_impl::tiled_min_tokens(DType::kBF16)}) {
    const std::vector<float> x = random_values(rng, n_tokens * cols);
    const XRows r = matmul_impl::direct_x(Isa::kAvx512Bf16Emulated, weights_of(DType::kBF16, cols),
                                          x.data(), n_tokens, buf);
    ASSERT_NE(r.bf16, nullptr) << n_tokens << " tokens";
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t k = 0; k < cols; ++k) {
        ASSERT_EQ(r.bf16[t * r.ld + k], f32_to_bf16(x[t * cols + k])) << "token " << t;
      }
    }
    const XRows same = matmul_impl::direct_x(Isa::kAvx512Bf16Emulated,
                                             weights_of(DType::kF32, cols), x.data(), 1, buf);
    EXPECT_EQ(same.base, x.data());
    EXPECT_EQ(same.bf16, nullptr);
  }
}

// round_x rounds as f32_to_bf16 does (ties to even, NaN quiet, infinities, denormals, the largest
// finite values overflowing to infinity), from contiguous, strided and gathered rows, into
// 64-byte aligned rows whose tail is zero up to a whole vector of bf16 and beyond.
TEST(MatmulTest, RoundXMatchesF32ToBf16) {
  if (!simd::isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> special = {0.0f,
                                -0.0f,
                                1.0f,
                                from_bits(0x3f808000u),  // tie, even: down
                                from_bits(0x3f818000u),  // tie, odd: up
                                from_bits(0x3f808001u),
                                from_bits(0x3f807fffu),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::nanf(""),
                                from_bits(0xff800001u),  // signalling NaN
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::denorm_min(),
                                from_bits(0x00400000u),
                                -std::numeric_limits<float>::min(),
                                from_bits(0x7f7f8000u)};
  std::mt19937 rng(12);
  for (int64_t cols : {1, 15, 16, 17, 31, 33, 100}) {
    const int64_t n_tokens = 3, ld = cols + 5;
    std::vector<float> x = random_values(rng, n_tokens * ld);
    for (size_t i = 0; i < special.size() && i < x.size(); ++i) x[i * 3 % x.size()] = special[i];
    const float* gathered[3] = {x.data() + 2 * ld, x.data(), x.data() + ld};
    std::vector<uint16_t> buf;
    for (const XRows& in : {XRows(x.data(), ld), XRows(gathered)}) {
      const XRows r = matmul_impl::round_x(in, cols, n_tokens, buf);
      ASSERT_NE(r.bf16, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(r.bf16) % 64, 0u);
      EXPECT_EQ(r.ld % 32, 0);
      ASSERT_GE(r.ld, (cols + 31) / 32 * 32 + 1);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* row = in.row(t, cols);
        for (int64_t k = 0; k < r.ld; ++k) {
          const uint16_t want = k < cols ? f32_to_bf16(row[k]) : uint16_t{0};
          ASSERT_EQ(r.bf16[t * r.ld + k], want) << "cols " << cols << " token " << t << " column "
                                                << k << " of " << row[k < cols ? k : 0];
        }
      }
    }
  }
}

// The real vdpbf16ps path against its emulation, bit for bit, on both paths and shapes with
// every kind of edge. Test data has no denormals, where the two differ by design. (SIMDe reports,
// in simd-everywhere/simde#1095, hardware that disagrees with Intel's pseudocode on some inputs;
// if this fails where the tolerance tests pass, the emulation's order of the two FMAs is what to
// revisit.)
TEST(MatmulTest, Bf16PathMatchesEmulationBitForBit) {
  if (!simd::isa_supported(Isa::kAvx512Bf16)) {
    GTEST_SKIP() << "this CPU lacks AVX-512 BF16: the vdpbf16ps path is tested only through its "
                    "emulation here";
  }
  std::mt19937 rng(16);
  for (int64_t cols : {1, 7, 32, 63, 257, 513}) {
    for (int64_t rows : {5, 70}) {
      const TestMatrix w = random_matrix(rng, DType::kBF16, rows, cols);
      for (int64_t n_tokens : {1, 4, 7, 17, 50}) {
        const std::vector<float> x = random_values(rng, n_tokens * cols);
        for (Path path : {Path::kDirect, Path::kTiled}) {
          std::vector<float> real(static_cast<size_t>(n_tokens * rows));
          std::vector<float> emulated(real.size());
          matmul_impl::matmul_rows_with(Isa::kAvx512Bf16, path, w.view(), x.data(), n_tokens,
                                        real.data(), rows, 0, rows);
          matmul_impl::matmul_rows_with(Isa::kAvx512Bf16Emulated, path, w.view(), x.data(),
                                        n_tokens, emulated.data(), rows, 0, rows);
          for (size_t i = 0; i < real.size(); ++i) {
            uint32_t a, b;
            std::memcpy(&a, &real[i], 4);
            std::memcpy(&b, &emulated[i], 4);
            ASSERT_EQ(a, b) << path_name(path) << " cols " << cols << " rows " << rows
                            << " n_tokens " << n_tokens << " at " << i << ": " << real[i] << " vs "
                            << emulated[i];
          }
        }
      }
    }
  }
}

// Rows long enough that the few-token kernels of the pair instruction sets split them into
// rounds of columns (7-12 tokens: two pairs of rows in turn, continuing their sums round after
// round): the product of every token count is the reference's, and each token's row is the
// same bits as that token alone (the order of each sum does not depend on the rounds).
TEST(MatmulTest, WideRowsInRoundsEqualEachTokenAlone) {
  std::mt19937 rng(23);
  const int64_t rows = 11, ldy = 11;  // two whole blocks of 4 rows and a part
  for (int64_t cols : {1600, 3101}) {
    TestMatrix w = random_matrix(rng, DType::kBF16, rows, cols);
    for (int64_t n_tokens = 1; n_tokens <= 13; ++n_tokens) {
      std::vector<float> x = random_values(rng, n_tokens * cols);
      const Expectations want(w, x.data(), n_tokens);
      for (Isa isa : simd_isas()) {
        const std::string what = std::string(simd::isa_name(isa)) + " cols " +
                                 std::to_string(cols) + " n_tokens " + std::to_string(n_tokens);
        std::vector<float> got(static_cast<size_t>(n_tokens * ldy), kGuard);
        matmul_impl::matmul_rows_with(isa, Path::kDirect, w.view(), x.data(), n_tokens, got.data(),
                                      ldy, 0, rows);
        expect_row_range(got, want(isa).y, want(isa).scale, n_tokens, rows, ldy, 0, rows, what);
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::vector<float> alone(static_cast<size_t>(rows));
          matmul_impl::matmul_rows_with(isa, Path::kDirect, w.view(), x.data() + t * cols, 1,
                                        alone.data(), rows, 0, rows);
          EXPECT_EQ(std::memcmp(alone.data(), got.data() + t * ldy, alone.size() * sizeof(float)),
                    0)
              << what << " token " << t;
        }
      }
    }
  }
}

TEST(MatmulTest, RowSliceMultipliesOnlyThoseRows) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  TestMatrix w = random_matrix(rng, DType::kBF16, 40, 33);
  std::vector<float> x = random_values(rng, 3 * 33);
  std::vector<float> full(3 * 40), scale(3 * 40), part(3 * 7);
  matmul(pool, w.view(), x.data(), 3, full.data());
  matmul_scalar(w.abs().view(), abs_values(x).data(), 3, scale.data());
  matmul(pool, w.view().row_slice(11, 7), x.data(), 3, part.data());
  // Block boundaries differ from the full product's, so the summation order may too.
  for (int t = 0; t < 3; ++t) {
    for (int r = 0; r < 7; ++r) {
      EXPECT_NEAR(part[t * 7 + r], full[t * 40 + 11 + r], kRelTol * scale[t * 40 + 11 + r]);
    }
  }
}

TEST(MatmulTest, EmptyShapes) {
  ThreadPool pool(2);
  TestMatrix w{DType::kF32, 3, 0, {}, {}};
  std::vector<float> y(6, kGuard);
  float x = 0;
  matmul(pool, w.view(), &x, 2, y.data());  // cols 0: y is all zeros
  EXPECT_EQ(y, std::vector<float>(6, 0.0f));
  TestMatrix w2{DType::kF32, 0, 4, {}, {}};
  std::vector<float> x2(8, 1.0f);
  matmul(pool, w2.view(), x2.data(), 2, y.data());  // rows 0: nothing to write
  matmul_xw(pool, w.view(), x2.data(), 2, y.data());
}

TEST(MatmulTest, RejectsF16Weights) {
  ThreadPool pool(1);
  std::vector<uint16_t> data(4);
  Matrix w{DType::kF16, 2, 2, data.data()};
  std::vector<float> x(2), y(2);
  EXPECT_THROW(matmul(pool, w, x.data(), 1, y.data()), Error);
}

TEST(MatmulXwTest, SimdMatchesScalar) {
  ThreadPool pool(3);
  std::mt19937 rng(4321);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {1, 7, 16, 17, 33, 64, 100, 256, 520, 1003}) {
      for (int64_t rows : {1, 5, 37, 512}) {
        TestMatrix w = random_matrix(rng, dtype, rows, cols);
        TestMatrix w_abs = w.abs();
        for (int64_t n_tokens : {0, 1, 3, 8, 9, 31, 64, 70}) {
          if (rows * cols * n_tokens > 4'000'000) continue;
          std::vector<float> x_buf = random_values(rng, n_tokens * rows + 1);
          const float* x = x_buf.data() + 1;
          std::vector<float> x_abs = abs_values(x_buf);
          int64_t n_out = n_tokens * cols;
          std::vector<float> want(static_cast<size_t>(n_out + kPad), kGuard);
          std::vector<float> scale(static_cast<size_t>(n_out + kPad), kGuard);
          matmul_xw_scalar(w.view(), x, n_tokens, want.data());
          matmul_xw_scalar(w_abs.view(), x_abs.data() + 1, n_tokens, scale.data());
          std::vector<Isa> isas = simd_isas();
          isas.push_back(Isa::kScalar);
          for (Isa isa : isas) {
            std::string what = std::string("xw ") + simd::isa_name(isa) + " " + dtype_name(dtype) +
                               " rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                               " n_tokens " + std::to_string(n_tokens);
            std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
            std::fill(got.begin(), got.begin() + n_out, std::nanf(""));
            matmul_impl::matmul_xw_with(isa, pool, w.view(), x, n_tokens, got.data());
            expect_close(got, want, scale, n_out, what);
          }
          std::vector<float> got(static_cast<size_t>(n_out + kPad), kGuard);
          matmul_xw(pool, w.view(), x, n_tokens, got.data());
          expect_close(got, want, scale, n_out, "matmul_xw()");
        }
      }
    }
  }
}

// One token's y is bit for bit its row of a call with more tokens: the one-token pass over whole
// rows (256 columns at a time on AVX-512, 64 on AVX2) sums each column as the blocks of several
// tokens do, so MLA's decode and prefill agree. Columns past the last whole pass take the
// several-token blocks' path.
TEST(MatmulXwTest, OneTokenEqualsItsRowAmongMany) {
  ThreadPool pool(2);
  std::mt19937 rng(97);
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::kScalar);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t cols : {64, 256, 300, 512, 1003}) {
      const int64_t rows = 64, n_tokens = 3;
      TestMatrix w = random_matrix(rng, dtype, rows, cols);
      std::vector<float> x = random_values(rng, n_tokens * rows);
      for (Isa isa : isas) {
        std::vector<float> all(static_cast<size_t>(n_tokens * cols));
        matmul_impl::matmul_xw_with(isa, pool, w.view(), x.data(), n_tokens, all.data());
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::vector<float> one(static_cast<size_t>(cols));
          matmul_impl::matmul_xw_with(isa, pool, w.view(), x.data() + t * rows, 1, one.data());
          ASSERT_EQ(0, std::memcmp(one.data(), all.data() + t * cols, one.size() * sizeof(float)))
              << simd::isa_name(isa) << " " << dtype_name(dtype) << " cols " << cols << " token "
              << t;
        }
      }
    }
  }
}

// MLA's per-head q · W_UK as one job: each group's y is matmul_xw's bit for bit, on every
// instruction set, for heads of several shapes and dtypes in one call, with groups of no tokens,
// no rows or no columns among them, and below and above the size that goes to the pool.
TEST(MatmulXwTest, GroupedEqualsEachGroupAlone) {
  ThreadPool pool(3);
  std::mt19937 rng(2468);
  struct Shape {
    DType dtype;
    int64_t rows, cols, n_tokens;
  };
  const std::vector<std::vector<Shape>> calls = {
      {{DType::kBF16, 64, 256, 1}, {DType::kBF16, 64, 256, 1}, {DType::kF32, 64, 256, 1}},
      {{DType::kF32, 5, 7, 3},
       {DType::kBF16, 37, 100, 0},
       {DType::kF32, 0, 33, 2},
       {DType::kBF16, 3, 0, 2},
       {DType::kBF16, 128, 1003, 4}},
      {{DType::kBF16, 16, 64, 1}},  // below kMinParallelMacs: on the caller
      {{DType::kF32, 64, 130, 9}, {DType::kBF16, 64, 130, 9}, {DType::kF32, 64, 130, 9}},
  };
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::kScalar);
  for (size_t c = 0; c < calls.size(); ++c) {
    std::vector<TestMatrix> ws;
    std::vector<std::vector<float>> xs, wants;
    for (const Shape& sh : calls[c]) {
      ws.push_back(random_matrix(rng, sh.dtype, sh.rows, sh.cols));
      xs.push_back(random_values(rng, std::max<int64_t>(1, sh.n_tokens * sh.rows)));
    }
    for (Isa isa : isas) {
      std::vector<std::vector<float>> got(calls[c].size());
      std::vector<XwGroup> groups;
      for (size_t g = 0; g < calls[c].size(); ++g) {
        const Shape& sh = calls[c][g];
        got[g].assign(static_cast<size_t>(sh.n_tokens * sh.cols + kPad), kGuard);
        std::fill_n(got[g].begin(), sh.n_tokens * sh.cols, std::nanf(""));
        groups.push_back({ws[g].view(), xs[g].data(), sh.n_tokens, got[g].data()});
      }
      matmul_impl::matmul_xw_grouped_with(isa, pool, groups);
      for (size_t g = 0; g < calls[c].size(); ++g) {
        const Shape& sh = calls[c][g];
        std::vector<float> want(got[g].size(), kGuard);
        std::fill_n(want.begin(), sh.n_tokens * sh.cols, std::nanf(""));
        matmul_impl::matmul_xw_with(isa, pool, ws[g].view(), xs[g].data(), sh.n_tokens,
                                    want.data());
        ASSERT_EQ(0, std::memcmp(got[g].data(), want.data(), want.size() * sizeof(float)))
            << "call " << c << " group " << g << " on " << simd::isa_name(isa);
      }
    }
  }
  std::vector<XwGroup> none;
  matmul_xw_grouped(pool, none);  // nothing to do
}

}  // namespace
}  // namespace duet
