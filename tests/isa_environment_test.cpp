// DUET_TEST_ISA=NAME runs this test binary with the kernels on instruction set NAME (as
// DUET_MATMUL_ISA names them, avx512bf16-emulated included), so that CTest can run the numerics
// tests once per instruction set (tests/cmake/isa.cmake). A CPU without NAME skips the whole run:
// the binary prints why and exits with kSkipExitCode, which CTest reports as skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

constexpr int kSkipExitCode = 77;

class IsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* name = std::getenv("DUET_TEST_ISA");
    if (!name || !*name) return;
    for (simd::Isa isa : {simd::Isa::kAvx512Bf16, simd::Isa::kAvx512Bf16Emulated,
                          simd::Isa::kAvx512, simd::Isa::kAvx2, simd::Isa::kScalar}) {
      if (std::strcmp(name, simd::isa_name(isa)) != 0) continue;
      if (!simd::isa_supported(isa)) {
        std::printf("DUET_TEST_ISA=%s: this CPU lacks it; skipping the run\n", name);
        std::fflush(stdout);
        std::_Exit(kSkipExitCode);
      }
      // Before anything asks for the instruction set (simd::best_isa() decides once).
      ::setenv("DUET_MATMUL_ISA", name, 1);
      std::printf("kernels on %s\n", matmul_isa());
      return;
    }
    ADD_FAILURE() << "DUET_TEST_ISA=" << name << " names no instruction set";
  }
};

[[maybe_unused]] ::testing::Environment* const kIsaEnvironment =
    ::testing::AddGlobalTestEnvironment(new IsaEnvironment);

}  // namespace
}  // namespace duet
