// The rows the expert all-to-all carries (--all2all-dtype): n_embd values per row, as f32 words,
// or as bf16 values packed two to an f32 word (half the bytes). The dispatcher's buffers are f32
// words either way, so the headers and counts that travel beside the rows keep their layout.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace duet {

// "f32" | "bf16"; throws duet::Error otherwise.
inline DType parse_all2all_dtype(const std::string& name) {
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  DUET_ERROR("--all2all-dtype: '" << name << "' is not f32 or bf16");
}

inline const char* all2all_dtype_name(DType t) {
  return t == DType::kBF16 ? "bf16" : "f32";
}

class WireRows {
 public:
  WireRows(DType dtype, int64_t n_embd) : bf16_(dtype == DType::kBF16), n_embd_(n_embd) {
    DUET_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
               "all-to-all rows of " << dtype_name(dtype));
    DUET_CHECK(!bf16_ || n_embd % 2 == 0,
               "bf16 all-to-all rows need an even n_embd, not " << n_embd);
  }
  bool bf16() const { return bf16_; }
  // f32 words one row takes on the wire.
  int64_t words() const { return bf16_ ? n_embd_ / 2 : n_embd_; }

  // dst[words()] = src[n_embd] f32, rounded to bf16 (nearest even) if the rows are bf16.
  void put(float* dst, const float* src) const {
    if (bf16_) return f32_to_bf16_row(src, n_embd_, reinterpret_cast<uint16_t*>(dst));
    std::memcpy(dst, src, static_cast<size_t>(n_embd_) * 4);
  }
  // dst[n_embd] f32 = the row at src[words()].
  void get(const float* src, float* dst) const {
    if (bf16_) return bf16_to_f32_row(reinterpret_cast<const uint16_t*>(src), n_embd_, dst);
    std::memcpy(dst, src, static_cast<size_t>(n_embd_) * 4);
  }
  // out[n_embd] += w · the row at src[words()].
  void add(const float* src, float w, float* out) const {
    if (bf16_) return axpy_bf16(w, reinterpret_cast<const uint16_t*>(src), n_embd_, out);
    axpy(w, src, n_embd_, out);
  }
  // dst[n_embd] = src[n_embd] as it would arrive: rounded to bf16 if the rows are bf16.
  void round(const float* src, float* dst) const {
    for (int64_t i = 0; i < n_embd_; ++i)
      dst[i] = bf16_ ? bf16_to_f32(f32_to_bf16(src[i])) : src[i];
  }

 private:
  bool bf16_;
  int64_t n_embd_;
};

}  // namespace duet
