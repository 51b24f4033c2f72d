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
};

// Reads a model directory's safetensors. Errors name the file, the tensor and the problem.
// Layout::kPanels is honoured when `repack` is set and matmul reads panels on this CPU
// (matmul_reads_panels); the packed copies are owned here. With a quantization, the matrices
// quantized_at_load names are quantized when first asked for (and have no panels); the copies
// are owned here and the mapped pages they came from are given back.
class CheckpointSource final : public WeightSource {
 public:
  // fp8: the checkpoint's quantization_config (ModelConfig::fp8); F8_E4M3 tensors are refused
  // unless it is enabled.
  explicit CheckpointSource(const std::string& dir, bool repack = true, const Fp8Quant& fp8 = {},
                            Quantization quantization = Quantization::kNone);
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols,
                Layout layout = Layout::kAsStored) override;
  const float* vector(const std::string& name, int64_t n) override;
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
  // m with panels: packed once per name, into arena_.
  Matrix with_panels(const std::string& name, Matrix m);
  // m quantized (kQ8 or kQ4, as the quantization), once per name.
  Matrix quantized(const std::string& name, const Matrix& m);

  SafetensorsSet set_;
  bool repack_;
  Fp8Quant fp8_;
  std::deque<std::vector<float>> owned_;     // f32 conversions of f16 matrices and of vectors
  std::map<std::string, Matrix> converted_;  // f16 matrices, by name, once converted
  // The packed and quantized copies, in huge pages: decode streams through them every step.
  HugePageArena arena_;
  std::map<std::string, void*> panels_;  // packed copies (in arena_), by name
  uint64_t packed_bytes_ = 0;
  std::map<std::string, uint64_t> bytes_by_name_;
  std::map<std::string, QuantizedMatrix> quantized_copies_;  // by name
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
