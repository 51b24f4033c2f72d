// attend over bf16 K/V rows on AVX-512 BF16: products of bf16 pairs with vdpbf16ps
// (attend_pairs_impl.h), and the same kernel on an emulation of the instruction so that tests run
// it on CPUs without it.

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/attend_impl.h"
#include "kernels/matmul_impl.h"
#include "kernels/ops_impl.h"
#include "kernels/simd_impl.h"

namespace duet {

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where inlined (see simd_impl.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

#define DUET_PAIRS_IMPL "kernels/attend_pairs_impl.h"
#include "kernels/pairs_instances.h"
#undef DUET_PAIRS_IMPL

}  // namespace

#pragma GCC diagnostic pop

namespace attend_impl {

void attend_pairs(simd::Isa isa, const AttendShape& shape, const float* q,
                  const std::vector<KvSpan>& spans, float* out, std::vector<float>& scores,
                  float* lse) {
  DUET_CHECK(simd::has_dpbf16(isa) && simd::isa_supported(isa),
             "attend_pairs: instruction set " << simd::isa_name(isa));
  for (const KvSpan& sp : spans) {
    DUET_CHECK(sp.dtype == DType::kBF16, "attend_pairs: KV rows of dtype " << dtype_name(sp.dtype));
  }
  if (isa == simd::Isa::kAvx512Bf16) {
    avx512bf16::attend(shape, q, spans, out, scores, lse);
  } else {
    avx512bf16_emulated::attend(shape, q, spans, out, scores, lse);
  }
}

}  // namespace attend_impl
}  // namespace duet
