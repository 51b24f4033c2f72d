#include "engine/kv_dtype.h"

#include "core/error.h"

namespace duet {

KvCacheDtype parse_kv_cache_dtype(const std::string& name) {
  if (name == "auto") return KvCacheDtype::kAuto;
  if (name == "bf16") return KvCacheDtype::kBf16;
  if (name == "f32") return KvCacheDtype::kF32;
  DUET_ERROR("--kv-cache-dtype must be auto, bf16 or f32, got '" << name << "'");
}

DType resolve_kv_dtype(KvCacheDtype choice, const Model& model) {
  switch (choice) {
    case KvCacheDtype::kBf16:
      return DType::kBF16;
    case KvCacheDtype::kF32:
      return DType::kF32;
    case KvCacheDtype::kAuto:
      break;
  }
  return model.weight_dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

const char* kv_dtype_name(DType dtype) {
  return dtype == DType::kBF16 ? "bf16" : "f32";
}

}  // namespace duet
