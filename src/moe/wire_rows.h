// The rows the expert all-to-all carries (--all2all-dtype): n_embd values per row, as f32 words,
// as bf16 values packed two to an f32 word (half the bytes), or as fp8 (E4M3) values packed four
// to a word after one f32 scale per group of kFp8Group values (kernels/fp8_rows.h, as DeepEP's
// fp8 dispatch; a little over a quarter of the bytes). The dispatcher's buffers are f32 words
// whatever the rows, so the headers and counts that travel beside the rows keep their layout.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/fp8_rows.h"
#include "kernels/ops.h"

namespace duet {

enum class RowDtype { kF32, kBF16, kFp8 };

// "f32" | "bf16" | "fp8"; throws duet::Error otherwise.
inline RowDtype parse_all2all_dtype(const std::string& name) {
  if (name == "f32") return RowDtype::kF32;
  if (name == "bf16") return RowDtype::kBF16;
  if (name == "fp8") return RowDtype::kFp8;
  DUET_ERROR("--all2all-dtype: '" << name << "' is not f32, bf16 or fp8");
}

inline const char* all2all_dtype_name(RowDtype t) {
  return t == RowDtype::kBF16 ? "bf16" : t == RowDtype::kFp8 ? "fp8" : "f32";
}

class WireRows {
 public:
  WireRows(RowDtype dtype, int64_t n_embd) : dtype_(dtype), n_embd_(n_embd) {
    DUET_CHECK(dtype_ != RowDtype::kBF16 || n_embd % 2 == 0,
               "bf16 all-to-all rows need an even n_embd, not " << n_embd);
  }
  // Whether rows change on the way (bf16 or fp8): then they are converted when packed and
  // unpacked, and a rank's own rows are rounded as the others' arrive.
  bool converted() const { return dtype_ != RowDtype::kF32; }
  // f32 words one row takes on the wire.
  int64_t words() const {
    switch (dtype_) {
      case RowDtype::kBF16:
        return n_embd_ / 2;
      case RowDtype::kFp8:
        return fp8_groups(n_embd_) + (n_embd_ + 3) / 4;
      case RowDtype::kF32:
        break;
    }
    return n_embd_;
  }

  // dst[words()] = src[n_embd] f32, rounded to the rows' type.
  void put(float* dst, const float* src) const {
    switch (dtype_) {
      case RowDtype::kBF16:
        return f32_to_bf16_row(src, n_embd_, reinterpret_cast<uint16_t*>(dst));
      case RowDtype::kFp8:
        return f32_to_fp8_row(src, n_embd_, dst, codes(dst));
      case RowDtype::kF32:
        break;
    }
    std::memcpy(dst, src, static_cast<size_t>(n_embd_) * 4);
  }
  // dst[n_embd] f32 = the row at src[words()].
  void get(const float* src, float* dst) const {
    switch (dtype_) {
      case RowDtype::kBF16:
        return bf16_to_f32_row(reinterpret_cast<const uint16_t*>(src), n_embd_, dst);
      case RowDtype::kFp8:
        return fp8_to_f32_row(src, codes(src), n_embd_, dst);
      case RowDtype::kF32:
        break;
    }
    std::memcpy(dst, src, static_cast<size_t>(n_embd_) * 4);
  }
  // out[n_embd] += w · the row at src[words()].
  void add(const float* src, float w, float* out) const {
    switch (dtype_) {
      case RowDtype::kBF16:
        return axpy_bf16(w, reinterpret_cast<const uint16_t*>(src), n_embd_, out);
      case RowDtype::kFp8:
        return axpy_fp8(w, src, codes(src), n_embd_, out);
      case RowDtype::kF32:
        break;
    }
    axpy(w, src, n_embd_, out);
  }
  // dst[n_embd] = src[n_embd] as it would arrive. dst may be src.
  void round(const float* src, float* dst) const {
    switch (dtype_) {
      case RowDtype::kBF16:
        for (int64_t i = 0; i < n_embd_; ++i) dst[i] = bf16_to_f32(f32_to_bf16(src[i]));
        return;
      case RowDtype::kFp8: {
        thread_local std::vector<float> wire;
        wire.resize(static_cast<size_t>(words()));
        put(wire.data(), src);
        return get(wire.data(), dst);
      }
      case RowDtype::kF32:
        break;
    }
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n_embd_) * 4);
  }

 private:
  // An fp8 row's codes, after its scales.
  uint8_t* codes(float* row) const { return reinterpret_cast<uint8_t*>(row + fp8_groups(n_embd_)); }
  const uint8_t* codes(const float* row) const {
    return reinterpret_cast<const uint8_t*>(row + fp8_groups(n_embd_));
  }

  RowDtype dtype_;
  int64_t n_embd_;
};

}  // namespace duet
