#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

using simd::Isa;

constexpr Isa kReal[] = {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2, Isa::kScalar};

// Without a request, the first of kReal (widest first) that the CPU runs; never the emulation.
TEST(SimdTest, ChoosesTheWidestSupportedIsa) {
  Isa widest = Isa::kScalar;
  for (Isa isa : kReal) {
    if (simd::isa_supported(isa)) {
      widest = isa;
      break;
    }
  }
  EXPECT_EQ(simd::choose_isa(nullptr), widest);
  EXPECT_EQ(simd::choose_isa(""), widest);
  EXPECT_TRUE(simd::isa_supported(simd::best_isa()));
  if (!std::getenv("DUET_MATMUL_ISA")) {
    EXPECT_EQ(simd::best_isa(), widest);
  }
}

// A requested instruction set by name if the CPU runs it (the emulation too, for tests); an error
// for one it lacks and for unknown names.
TEST(SimdTest, ChoosesARequestedIsaOnlyIfSupported) {
  for (Isa isa : kReal) {
    if (simd::isa_supported(isa)) {
      EXPECT_EQ(simd::choose_isa(simd::isa_name(isa)), isa);
    } else {
      EXPECT_THROW(simd::choose_isa(simd::isa_name(isa)), Error) << simd::isa_name(isa);
    }
  }
  if (simd::isa_supported(Isa::kAvx512)) {
    EXPECT_EQ(simd::choose_isa("avx512bf16-emulated"), Isa::kAvx512Bf16Emulated);
  } else {
    EXPECT_THROW(simd::choose_isa("avx512bf16-emulated"), Error);
  }
  EXPECT_THROW(simd::choose_isa("AVX512"), Error);
  EXPECT_THROW(simd::choose_isa("sse2"), Error);
}

constexpr int kLanes = simd::Avx512Pairs::kWidth;

// acc[i] + a · b over the bf16 pairs of lane i, as Intel's pseudocode of vdpbf16ps computes it:
// the odd elements' fused multiply-add first, then the even ones'.
std::vector<float> pseudocode_dpbf16(const std::vector<float>& acc, const std::vector<uint16_t>& a,
                                     const std::vector<uint16_t>& b) {
  std::vector<float> out(acc);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = std::fmaf(bf16_to_f32(a[2 * i + 1]), bf16_to_f32(b[2 * i + 1]), out[i]);
    out[i] = std::fmaf(bf16_to_f32(a[2 * i]), bf16_to_f32(b[2 * i]), out[i]);
  }
  return out;
}

DUET_TARGET_AVX512 void emulated_dpbf16(const float* acc, const uint16_t* a, const uint16_t* b,
                                        float* out) {
  using S = simd::Avx512Bf16Emulated;
  S::store(out, S::dpbf16(S::load(acc), S::load_pairs(a), S::load_pairs(b)));
}

DUET_TARGET_AVX512BF16 void real_dpbf16(const float* acc, const uint16_t* a, const uint16_t* b,
                                        float* out) {
  using S = simd::Avx512Bf16;
  S::store(out, S::dpbf16(S::load(acc), S::load_pairs(a), S::load_pairs(b)));
}

// One vector of accumulators and two of bf16 pairs.
struct Dpbf16Case {
  std::vector<float> acc;
  std::vector<uint16_t> a, b;
};

// Random vectors, normal values scaled by 2^-20 .. 2^20 (no denormals, where the instruction and
// its emulation differ by design).
std::vector<Dpbf16Case> dpbf16_cases() {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<Dpbf16Case> cases;
  for (int round = 0; round < 200; ++round) {
    Dpbf16Case c{std::vector<float>(kLanes), std::vector<uint16_t>(2 * kLanes),
                 std::vector<uint16_t>(2 * kLanes)};
    for (float& v : c.acc) v = std::ldexp(normal(rng), exponent(rng));
    for (uint16_t& v : c.a) v = f32_to_bf16(std::ldexp(normal(rng), exponent(rng)));
    for (uint16_t& v : c.b) v = f32_to_bf16(normal(rng));
    cases.push_back(c);
  }
  return cases;
}

TEST(SimdTest, EmulatedDpbf16FollowsIntelsPseudocode) {
  if (!simd::isa_supported(Isa::kAvx512Bf16Emulated)) GTEST_SKIP() << "no AVX-512 on this CPU";
  int order_matters = 0;
  for (const Dpbf16Case& c : dpbf16_cases()) {
    const std::vector<float> want = pseudocode_dpbf16(c.acc, c.a, c.b);
    std::vector<float> got(kLanes);
    emulated_dpbf16(c.acc.data(), c.a.data(), c.b.data(), got.data());
    for (int i = 0; i < kLanes; ++i) {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
          << "lane " << i << ": " << got[i] << " vs " << want[i];
      const float even_first =
          std::fmaf(bf16_to_f32(c.a[2 * i + 1]), bf16_to_f32(c.b[2 * i + 1]),
                    std::fmaf(bf16_to_f32(c.a[2 * i]), bf16_to_f32(c.b[2 * i]), c.acc[i]));
      order_matters += even_first != want[i];
    }
  }
  // The data tells the documented order from the other one.
  EXPECT_GT(order_matters, 100);
}

TEST(SimdTest, RealDpbf16MatchesPseudocode) {
  if (!simd::isa_supported(Isa::kAvx512Bf16)) {
    GTEST_SKIP() << "this CPU lacks AVX-512 BF16: vdpbf16ps is tested only through its emulation";
  }
  for (const Dpbf16Case& c : dpbf16_cases()) {
    const std::vector<float> want = pseudocode_dpbf16(c.acc, c.a, c.b);
    std::vector<float> got(kLanes);
    real_dpbf16(c.acc.data(), c.a.data(), c.b.data(), got.data());
    for (int i = 0; i < kLanes; ++i) {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
          << "lane " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

// The one-token prefetch: Intel's default, none elsewhere, and any count of bytes up to 64 KiB
// when DUET_ONE_TOKEN_PREFETCH sets one; anything else is refused by name.
TEST(SimdTest, OneTokenPrefetchByVendorOrAsSet) {
  EXPECT_EQ(simd::choose_one_token_prefetch(nullptr, true), simd::kOneTokenPrefetchIntel);
  EXPECT_EQ(simd::choose_one_token_prefetch("", true), simd::kOneTokenPrefetchIntel);
  EXPECT_EQ(simd::choose_one_token_prefetch(nullptr, false), 0);
  EXPECT_EQ(simd::choose_one_token_prefetch("0", true), 0);
  EXPECT_EQ(simd::choose_one_token_prefetch("8192", false), 8192);
  EXPECT_EQ(simd::choose_one_token_prefetch("65536", false), 65536);
  for (const char* bad : {"x", "-1", "65537", "4k", " 4096", "99999999999999999999"}) {
    try {
      simd::choose_one_token_prefetch(bad, true);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DUET_ONE_TOKEN_PREFETCH="), std::string::npos) << bad;
    }
  }
}

// The one-token prefetch into L2 likewise, with its own default and its own variable's name in
// the error.
TEST(SimdTest, OneTokenPrefetchIntoL2ByVendorOrAsSet) {
  EXPECT_EQ(simd::choose_one_token_prefetch_l2(nullptr, true), simd::kOneTokenPrefetchL2Intel);
  EXPECT_EQ(simd::choose_one_token_prefetch_l2("", true), simd::kOneTokenPrefetchL2Intel);
  EXPECT_GT(simd::kOneTokenPrefetchL2Intel, simd::kOneTokenPrefetchIntel);
  EXPECT_EQ(simd::choose_one_token_prefetch_l2(nullptr, false), 0);
  EXPECT_EQ(simd::choose_one_token_prefetch_l2("0", true), 0);
  EXPECT_EQ(simd::choose_one_token_prefetch_l2("32768", false), 32768);
  for (const char* bad : {"x", "-1", "65537", "16k"}) {
    try {
      simd::choose_one_token_prefetch_l2(bad, true);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DUET_ONE_TOKEN_PREFETCH_L2="), std::string::npos)
          << bad;
    }
  }
}

// Products with bf16 weights (and attention) leave the bf16 pairs for f32 FMAs only where the
// pairs were chosen by default on an Intel CPU; a requested set, another vendor's CPU and every
// other set keep what best_isa chose.
TEST(SimdTest, Bf16ProductsLeaveThePairsOnlyByDefaultOnIntel) {
  using simd::Isa;
  EXPECT_EQ(simd::choose_bf16_isa(Isa::kAvx512Bf16, false, true), Isa::kAvx512);
  EXPECT_EQ(simd::choose_bf16_isa(Isa::kAvx512Bf16, true, true), Isa::kAvx512Bf16);
  EXPECT_EQ(simd::choose_bf16_isa(Isa::kAvx512Bf16, false, false), Isa::kAvx512Bf16);
  for (Isa other : {Isa::kAvx512Bf16Emulated, Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    for (bool requested : {false, true}) {
      EXPECT_EQ(simd::choose_bf16_isa(other, requested, true), other) << simd::isa_name(other);
    }
  }
  const char* requested = std::getenv("DUET_MATMUL_ISA");
  EXPECT_EQ(simd::bf16_isa(), simd::choose_bf16_isa(simd::best_isa(), requested && *requested,
                                                    __builtin_cpu_is("intel")));
  EXPECT_STREQ(matmul_bf16_isa(), simd::isa_name(simd::bf16_isa()));
}

}  // namespace
}  // namespace duet
