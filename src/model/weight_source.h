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

#include "core/tensor.h"
#include "model/safetensors.h"

namespace duet {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // A matrix W[rows, cols] (bf16 or f32 view; valid as long as the source lives).
  virtual Matrix matrix(const std::string& name, int64_t rows, int64_t cols) = 0;
  // A vector [n] (norm weights), always converted to f32; valid as long as the source lives.
  virtual const float* vector(const std::string& name, int64_t n) = 0;
};

// Reads a model directory's safetensors. Errors name the file, the tensor and the problem.
class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(const std::string& dir);
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) override;
  const float* vector(const std::string& name, int64_t n) override;
  // Bytes of weights this source handed out (views and conversions), for memory reports.
  uint64_t bytes_used() const { return bytes_used_; }
  // Bytes of each tensor handed out, by name.
  const std::map<std::string, uint64_t>& bytes_by_name() const { return bytes_by_name_; }

 private:
  const TensorView& expect(const std::string& name, const std::vector<int64_t>& shape);

  SafetensorsSet set_;
  std::deque<std::vector<float>> owned_;  // f32 conversions of f16 matrices and of vectors
  uint64_t bytes_used_ = 0;
  std::map<std::string, uint64_t> bytes_by_name_;
};

// Records what was asked for; hands out null views (a recorded model is listed, never run).
class RecordingSource final : public WeightSource {
 public:
  struct Request {
    std::string name;
    std::vector<int64_t> shape;
  };
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) override;
  const float* vector(const std::string& name, int64_t n) override;
  const std::vector<Request>& requests() const { return requests_; }

 private:
  std::vector<Request> requests_;
};

}  // namespace duet
