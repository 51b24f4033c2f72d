// Safetensors files, single and sharded (model.safetensors.index.json), memory-mapped read-only.
// Format: 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets are relative to the end of the header.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace duet {

// One memory-mapped .safetensors file. Opening validates the whole header: every tensor's dtype
// is known, its byte range matches dtype × shape, lies inside the file and overlaps no other.
// Errors (duet::Error) name the file and the tensor: "model.safetensors: tensor 'x': ...".
// Views point straight into the mapping and live as long as this object. Their `data` may be at
// any byte offset: consumers must not assume it is aligned for the dtype.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws if missing.
  const TensorView& get(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// All weights of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json ("weight_map": {tensor: file}), or else every *.safetensors file.
class SafetensorsSet {
 public:
  static SafetensorsSet open_dir(const std::string& dir);

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // Throws "<dir>: missing tensor 'name'" if absent.
  const TensorView& get(const std::string& name) const;
  // The file a tensor lives in (for error messages).
  const std::string& file_of(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// A tensor to write: raw little-endian bytes of dtype × shape.
struct TensorData {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes one .safetensors file (tensors in the given order, 8-byte aligned header).
void write_safetensors(const std::string& path, const std::vector<const TensorData*>& tensors);

// Writes `tensors` into `dir` as model.safetensors, or, when the total exceeds max_shard_bytes,
// as model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json
// ({"metadata": {"total_size": N}, "weight_map": {...}}), as Hugging Face's save_pretrained does.
void write_safetensors_dir(const std::string& dir, const std::vector<TensorData>& tensors,
                           uint64_t max_shard_bytes);

}  // namespace duet
