// The element type of the KV rows, as `--kv-cache-dtype` chooses it for every KV store (the
// contiguous KvCache and the paged pool alike).
#pragma once

#include <string>

#include "core/dtype.h"
#include "model/model.h"

namespace duet {

// What --kv-cache-dtype asks for. kAuto follows the model's weights, as vLLM's "auto" follows
// the model dtype: bf16 rows for bf16 weights, f32 rows otherwise (f32 weights, and f16 ones,
// which duet widens to f32 at load; there is no f16 KV cache).
enum class KvCacheDtype { kAuto, kBf16, kF32 };

// "auto" | "bf16" | "f32"; throws duet::Error naming the flag and the value otherwise.
KvCacheDtype parse_kv_cache_dtype(const std::string& name);

// The rows' element type for `model`: DType::kBF16 or DType::kF32.
DType resolve_kv_dtype(KvCacheDtype choice, const Model& model);

// "bf16" or "f32", as the flag spells them (for reports).
const char* kv_dtype_name(DType dtype);

}  // namespace duet
