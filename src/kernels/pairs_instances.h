// Private to src/kernels: a kernel written once against a vector interface that multiplies bf16
// pairs, instantiated for each such interface. A kernel file defines DUET_PAIRS_IMPL as the
// quoted name of its implementation header and includes this file where the instances belong:
//   namespace avx512bf16           S = simd::Avx512Bf16 (vdpbf16ps)
//   namespace avx512bf16_emulated  S = simd::Avx512Bf16Emulated (its emulation, for tests)
// each with DUET_SIMD_TARGET set to the matching target attribute. No include guard: once per
// implementation.

namespace avx512bf16 {
using S = simd::Avx512Bf16;
#define DUET_SIMD_TARGET DUET_TARGET_AVX512BF16
#include DUET_PAIRS_IMPL
#undef DUET_SIMD_TARGET
}  // namespace avx512bf16

namespace avx512bf16_emulated {
using S = simd::Avx512Bf16Emulated;
#define DUET_SIMD_TARGET DUET_TARGET_AVX512
#include DUET_PAIRS_IMPL
#undef DUET_SIMD_TARGET
}  // namespace avx512bf16_emulated
