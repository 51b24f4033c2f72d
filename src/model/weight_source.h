// Where an architecture's weights come from. The architecture asks for each tensor by its
// Hugging Face name and expected shape; a CheckpointSource reads and validates it from
// safetensors, a RecordingSource only writes down the request (make-model generates random
// weights for exactly that list). So one piece of code per architecture says what a checkpoint
// holds.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/huge_pages.h"
#include "core/tensor.h"
#include "kernels/quantize.h"
#include "model/config.h"
#include "model/mla_heads.h"
#include "model/quantization.h"
#include "model/safetensors.h"

namespace duet {

// How a matrix is laid out for the products that read it.
enum class Layout {
  kAsStored,  // rows as the file has them: routed experts (a few tokens each), embeddings
  // Also re-laid as panels (Matrix::panels) where matmul reads them: the matrices every token
  // of every step multiplies (attention, dense and shared MLPs, the output head).
  kPanels,
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // A matrix W[rows, cols] (bf16 or f32 view; valid as long as the source lives). Asking for the
  // same name twice gives the same weights (a tied output head asks for the embedding table).
  virtual Matrix matrix(const std::string& name, int64_t rows, int64_t cols,
                        Layout layout = Layout::kAsStored) = 0;
  // A vector [n] (norm weights), always converted to f32; valid as long as the source lives.
  virtual const float* vector(const std::string& name, int64_t n) = 0;
  // MLA's kv_b_proj `name` [n_head · (nope + v_dim), rank] as absorbed attention multiplies it:
  // here as matrix() gives it (MlaKvB::kv_b).
  virtual MlaKvB mla_kv_b(const std::string& name, const MlaHeads& heads);
};

// How a CheckpointSource hands out its matrices.
struct SourceOptions {
  // Honour Layout::kPanels (LoadOptions::repack).
  bool repack = true;
  // The checkpoint's quantization_config (ModelConfig::fp8); F8_E4M3 tensors are refused unless
  // it is enabled.
  Fp8Quant fp8;
  // The checkpoint's compressed-tensors int4 config (ModelConfig::packed_int4): a matrix stored
  // as `<name>_packed` is read into an int4 matrix of the same values, refused unless enabled.
  PackedInt4Quant packed_int4;
  // The matrices quantized_at_load names are quantized when first asked for.
  Quantization quantization = Quantization::kNone;
  // Hand out the matrices in place in the file's mapping (4 KiB pages, shared with the page cache
  // and with other processes mapping the file) instead of copies in huge pages.
  bool mmap = false;
};

// Reads a model directory's safetensors. Errors name the file, the tensor and the problem.
// Each matrix (bf16, f32 or fp8 as stored) is copied once, when first asked for, into huge pages
// and the mapped pages it came from are given back: decode streams every matrix once per step,
// and in the mapping's 4 KiB pages it did so 1.25-1.3x slower (bf16 `small`, batch 1, Zen 4).
// SourceOptions::mmap keeps them in the mapping (but for MLA's kv_b_proj, split by head into
// copies: mla_kv_b). Layout::kPanels is honoured when `repack` is set and matmul reads panels on
// this CPU (matmul_reads_panels). With a quantization, the matrices quantized_at_load names are
// quantized instead (and have no panels), and kv_b's parts likewise; fp8 ones only under the
// 4-bit quantizations (quantizes_stored). The copies are owned here.
class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(const std::string& dir, const SourceOptions& opt = {});
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols,
                Layout layout = Layout::kAsStored) override;
  const float* vector(const std::string& name, int64_t n) override;
  // Split by head (MlaKvB::k_b, v_b), in huge pages; `name`'s bytes those of the two. With a
  // quantization (and kv_b bf16, f16 or f32): quantized as the attention projections are
  // (quantized_dtype of `name`), counted as one quantized matrix. Without one: in kv_b's dtype
  // (f16 widened to f32), with panels as Layout::kPanels gives them. An fp8 kv_b under int4 or
  // int4_pure is quantized as a bf16 one is (quantizes_stored); otherwise kept in fp8, the same
  // weights (mla_split_kv_b_fp8), or as matrix() gives it where its blocks do not allow the split.
  MlaKvB mla_kv_b(const std::string& name, const MlaHeads& heads) override;
  // Bytes of weights this source handed out (views, conversions and packed copies), for memory
  // reports.
  uint64_t bytes_used() const;
  // Bytes of each tensor handed out, by name (as stored or converted; packed copies apart).
  const std::map<std::string, uint64_t>& bytes_by_name() const { return bytes_by_name_; }
  // Bytes of the packed copies (Layout::kPanels).
  uint64_t packed_bytes() const { return packed_bytes_; }
  // What was quantized so far.
  const QuantizationReport& quantization_report() const { return quantized_; }

 private:
  const TensorView& expect(const std::string& name, const std::vector<int64_t>& shape);
  Matrix view(const std::string& name, int64_t rows, int64_t cols);
  // An F8_E4M3 tensor with its block scales (weight_source_fp8.cpp).
  Matrix fp8_view(const std::string& name, const TensorView& t, int64_t rows, int64_t cols);
  // A compressed-tensors int4 weight (`name` stored as name_packed, name_scale, name_shape) as
  // an int4 matrix of its values, once per name (weight_source_int4.cpp).
  Matrix packed_int4(const std::string& name, int64_t rows, int64_t cols);
  // `bytes` of arena_ for the tensor `name`; running out is an error naming it and what was
  // `doing` ("copying it").
  void* allocate(const std::string& name, const char* doing, size_t bytes);
  // m with its weights in arena_: copied from the mapping once per name.
  Matrix resident(const std::string& name, Matrix m);
  // m with panels: packed once per name, into arena_.
  Matrix with_panels(const std::string& name, Matrix m);
  // m quantized (kQ8 or kQ4, as the quantization), once per name.
  Matrix quantized(const std::string& name, const Matrix& m);
  // mla_kv_b of an fp8 kv_b: split once per name, or as stored.
  MlaKvB fp8_kv_b(const std::string& name, const MlaHeads& m);
  // mla_kv_b of a bf16 or f32 kv_b without a quantization: split once per name, in its dtype.
  MlaKvB split_kv_b(const std::string& name, const MlaHeads& m);

  SafetensorsSet set_;
  SourceOptions opt_;
  std::deque<std::vector<float>> owned_;     // f32 conversions of f16 matrices and of vectors
  std::map<std::string, Matrix> converted_;  // f16 matrices, by name, once converted
  // The copies (as stored, packed, quantized), in huge pages: decode streams through them every
  // step.
  HugePageArena arena_;
  std::map<std::string, void*> copies_;  // matrices copied from the mapping (in arena_), by name
  std::map<std::string, void*> panels_;  // packed copies (in arena_), by name
  uint64_t packed_bytes_ = 0;
  std::map<std::string, uint64_t> bytes_by_name_;
  std::map<std::string, QuantizedMatrix> quantized_copies_;  // by name
  std::map<std::string, MlaKvB>
      split_kv_b_;  // kv_b split by head in its dtype (in arena_), by name
  QuantizationReport quantized_;
};

// Records what was asked for; hands out null views (a recorded model is listed, never run).
class RecordingSource final : public WeightSource {
 public:
  struct Request {
    std::string name;
    std::vector<int64_t> shape;
  };
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols,
                Layout layout = Layout::kAsStored) override;
  const float* vector(const std::string& name, int64_t n) override;
  const std::vector<Request>& requests() const { return requests_; }

 private:
  std::vector<Request> requests_;
};

}  // namespace duet
