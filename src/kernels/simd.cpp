#include <cerrno>
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

namespace {

// A count of bytes from 0 to 65536 in `requested` (the text of the environment variable `var`),
// or `fallback` where it is null or empty.
int64_t prefetch_bytes(const char* var, const char* requested, int64_t fallback) {
  if (!requested || !*requested) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long bytes = std::strtoll(requested, &end, 10);
  const bool digits = *requested >= '0' && *requested <= '9';
  if (!digits || errno != 0 || *end != '\0' || bytes > 65536) {
    DUET_ERROR(var << "=" << requested << " is not a count of bytes from 0 to 65536");
  }
  return bytes;
}

}  // namespace

int64_t choose_one_token_prefetch(const char* requested, bool intel) {
  return prefetch_bytes("DUET_ONE_TOKEN_PREFETCH", requested, intel ? kOneTokenPrefetchIntel : 0);
}

int64_t one_token_prefetch_bytes() {
  static const int64_t bytes =
      choose_one_token_prefetch(std::getenv("DUET_ONE_TOKEN_PREFETCH"), __builtin_cpu_is("intel"));
  return bytes;
}

int64_t choose_one_token_prefetch_l2(const char* requested, bool intel) {
  return prefetch_bytes("DUET_ONE_TOKEN_PREFETCH_L2", requested,
                        intel ? kOneTokenPrefetchL2Intel : 0);
}

int64_t one_token_prefetch_l2_bytes() {
  static const int64_t bytes = choose_one_token_prefetch_l2(
      std::getenv("DUET_ONE_TOKEN_PREFETCH_L2"), __builtin_cpu_is("intel"));
  return bytes;
}

Isa best_isa() {
  static const Isa isa = choose_isa(std::getenv("DUET_MATMUL_ISA"));
  return isa;
}

Isa choose_bf16_isa(Isa best, bool requested, bool intel) {
  return best == Isa::kAvx512Bf16 && !requested && intel ? Isa::kAvx512 : best;
}

Isa bf16_isa() {
  static const Isa isa = [] {
    const char* requested = std::getenv("DUET_MATMUL_ISA");
    return choose_bf16_isa(best_isa(), requested && *requested, __builtin_cpu_is("intel"));
  }();
  return isa;
}

}  // namespace duet::simd
