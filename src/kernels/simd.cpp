#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/simd_impl.h"

namespace duet::simd {

Isa choose_isa(const char* requested) {
  if (!requested || !*requested) {
    for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2}) {
      if (isa_supported(isa)) return isa;
    }
    return Isa::kScalar;
  }
  for (Isa isa :
       {Isa::kAvx512Bf16, Isa::kAvx512Bf16Emulated, Isa::kAvx512, Isa::kAvx2, Isa::kScalar}) {
    if (std::strcmp(requested, isa_name(isa)) != 0) continue;
    if (!isa_supported(isa)) DUET_ERROR("DUET_MATMUL_ISA=" << requested << ": this CPU lacks it");
    return isa;
  }
  DUET_ERROR("DUET_MATMUL_ISA=" << requested
                                << " is not one of avx512bf16, avx512bf16-emulated, avx512, avx2, "
                                   "scalar");
}

Isa best_isa() {
  static const Isa isa = choose_isa(std::getenv("DUET_MATMUL_ISA"));
  return isa;
}

}  // namespace duet::simd
