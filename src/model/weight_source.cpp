#include "model/weight_source.h"

#include <cstring>

#include "core/error.h"

namespace duet {

CheckpointSource::CheckpointSource(const std::string& dir) : set_(SafetensorsSet::open_dir(dir)) {}

const TensorView& CheckpointSource::expect(const std::string& name,
                                           const std::vector<int64_t>& shape) {
  const TensorView& t = set_.get(name);  // throws "<dir>: missing tensor 'name'"
  if (t.shape != shape) {
    throw Error(set_.file_of(name) + ": tensor '" + name + "': expected shape " +
                shape_str(shape) + ", found " + shape_str(t.shape));
  }
  return t;
}

Matrix CheckpointSource::matrix(const std::string& name, int64_t rows, int64_t cols) {
  const TensorView& t = expect(name, {rows, cols});
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  switch (t.dtype) {
    case DType::kBF16:
    case DType::kF32:
      m.dtype = t.dtype;
      m.data = t.data;
      bytes_used_ += t.nbytes();
      bytes_by_name_[name] = t.nbytes();
      return m;
    case DType::kF16: {
      // No f16 kernels: widen once to f32 (f16 checkpoints of these models are rare).
      std::vector<float>& buf = owned_.emplace_back(static_cast<size_t>(t.numel()));
      const auto* src = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint16_t h;
        std::memcpy(&h, src + i, 2);
        buf[i] = f16_to_f32(h);
      }
      m.dtype = DType::kF32;
      m.data = buf.data();
      bytes_used_ += buf.size() * 4;
      bytes_by_name_[name] = buf.size() * 4;
      return m;
    }
  }
  throw Error(set_.file_of(name) + ": tensor '" + name + "': unsupported dtype");
}

const float* CheckpointSource::vector(const std::string& name, int64_t n) {
  const TensorView& t = expect(name, {n});
  std::vector<float>& buf = owned_.emplace_back(static_cast<size_t>(n));
  const char* src = static_cast<const char*>(t.data);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    switch (t.dtype) {
      case DType::kF32: std::memcpy(&buf[i], src + 4 * i, 4); break;
      case DType::kBF16: std::memcpy(&h, src + 2 * i, 2); buf[i] = bf16_to_f32(h); break;
      case DType::kF16: std::memcpy(&h, src + 2 * i, 2); buf[i] = f16_to_f32(h); break;
    }
  }
  bytes_used_ += static_cast<uint64_t>(n) * 4;
  bytes_by_name_[name] = static_cast<uint64_t>(n) * 4;
  return buf.data();
}

Matrix RecordingSource::matrix(const std::string& name, int64_t rows, int64_t cols) {
  requests_.push_back({name, {rows, cols}});
  Matrix m;
  m.dtype = DType::kF32;
  m.rows = rows;
  m.cols = cols;
  m.data = nullptr;  // never multiplied: a recorded model is only listed, not run
  return m;
}

const float* RecordingSource::vector(const std::string& name, int64_t n) {
  requests_.push_back({name, {n}});
  return nullptr;
}

}  // namespace duet
