#include "model/weight_source.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul.h"

namespace duet {

CheckpointSource::CheckpointSource(const std::string& dir, const SourceOptions& opt)
    : set_(SafetensorsSet::open_dir(dir)), opt_(opt) {
  quantized_.quantization = opt.quantization;
}

uint64_t CheckpointSource::bytes_used() const {
  uint64_t n = packed_bytes_;
  for (const auto& [name, bytes] : bytes_by_name_) n += bytes;
  return n;
}

const TensorView& CheckpointSource::expect(const std::string& name,
                                           const std::vector<int64_t>& shape) {
  const TensorView& t = set_.get(name);  // throws "<dir>: missing tensor 'name'"
  if (t.shape != shape) {
    throw Error(set_.file_of(name) + ": tensor '" + name + "': expected shape " +
                shape_str(shape) + ", found " + shape_str(t.shape));
  }
  return t;
}

Matrix CheckpointSource::view(const std::string& name, int64_t rows, int64_t cols) {
  const TensorView& t = expect(name, {rows, cols});
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  switch (t.dtype) {
    case DType::kBF16:
    case DType::kF32:
      m.dtype = t.dtype;
      m.data = t.data;
      bytes_by_name_[name] = t.nbytes();
      return m;
    case DType::kF16: {
      if (auto it = converted_.find(name); it != converted_.end()) return it->second;
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
      bytes_by_name_[name] = buf.size() * 4;
      converted_[name] = m;
      return m;
    }
    case DType::kF8E4M3:
      return fp8_view(name, t, rows, cols);
    case DType::kI32:
    case DType::kI64:
      throw Error(set_.file_of(name) + ": tensor '" + name + "': is " + dtype_name(t.dtype) +
                  ", which no weight matrix is (compressed-tensors' int4 weights are "
                  "'<name>_packed' beside their scales)");
    case DType::kQ8:
    case DType::kQ4:
      break;  // never a file's dtype
  }
  throw Error(set_.file_of(name) + ": tensor '" + name + "': unsupported dtype");
}

namespace {

// Gives back the whole pages of a mapped range the process will not read again (a matrix it
// quantized or copied), so they leave its resident set; the file's pages stay in the page cache.
void release_pages(const void* data, size_t bytes) {
  const size_t page = 4096;
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

void* CheckpointSource::allocate(const std::string& name, const char* doing, size_t bytes) {
  try {
    return arena_.allocate(bytes);
  } catch (const Error& e) {
    throw Error(set_.file_of(name) + ": tensor '" + name + "': " + doing + ": " + e.what());
  }
}

Matrix CheckpointSource::resident(const std::string& name, Matrix m) {
  auto it = copies_.find(name);
  if (it == copies_.end()) {
    const size_t bytes = m.nbytes();
    void* p = allocate(name, "copying it", bytes);
    std::memcpy(p, m.data, bytes);
    release_pages(m.data, bytes);
    it = copies_.emplace(name, p).first;
  }
  m.data = it->second;
  return m;
}

Matrix CheckpointSource::with_panels(const std::string& name, Matrix m) {
  auto it = panels_.find(name);
  if (it == panels_.end()) {
    const size_t bytes = static_cast<size_t>(panel_elems(m)) * dtype_size(m.dtype);
    void* p = allocate(name, "packing it", bytes);
    pack_panels(m, p);
    it = panels_.emplace(name, p).first;
    packed_bytes_ += bytes;
  }
  m.panels = it->second;
  return m;
}

Matrix CheckpointSource::quantized(const std::string& name, const Matrix& m) {
  auto it = quantized_copies_.find(name);
  if (it == quantized_copies_.end()) {
    it = quantized_copies_
             .try_emplace(name, m, quantized_dtype(quantized_.quantization, name), &arena_)
             .first;
    const uint64_t before = bytes_by_name_[name], after = it->second.view().nbytes();
    if (converted_.count(name) == 0) release_pages(m.data, before);
    quantized_.n_matrices += 1;
    quantized_.bytes_before += before;
    quantized_.bytes_after += after;
    bytes_by_name_[name] = after;
  }
  return it->second.view();
}

Matrix CheckpointSource::matrix(const std::string& name, int64_t rows, int64_t cols,
                                Layout layout) {
  if (!set_.has(name) && set_.has(name + "_packed")) return packed_int4(name, rows, cols);
  Matrix m = view(name, rows, cols);
  // An fp8 checkpoint's fp8 weights are a byte each already: quantized to 4 bits only.
  if (quantized_at_load(name) && quantizes_stored(quantized_.quantization, m.dtype)) {
    if (m.dtype == DType::kF8E4M3) bytes_by_name_.erase(name + "_scale_inv");
    return quantized(name, m);
  }
  // f16 matrices were widened into memory of their own already.
  if (!opt_.mmap && converted_.count(name) == 0 && rows > 0 && cols > 0) m = resident(name, m);
  if (layout == Layout::kPanels && opt_.repack && rows > 0 && cols > 0 &&
      matmul_reads_panels(m.dtype)) {
    m = with_panels(name, m);
  }
  return m;
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
      case DType::kF8E4M3:
      case DType::kI32:
      case DType::kI64:
        throw Error(set_.file_of(name) + ": tensor '" + name + "': is " + dtype_name(t.dtype) +
                    "; vectors (norms, biases) must be bf16, f16 or f32");
      case DType::kQ8:
      case DType::kQ4:
        break;  // never a file's dtype
    }
  }
  bytes_by_name_[name] = static_cast<uint64_t>(n) * 4;
  return buf.data();
}

MlaKvB WeightSource::mla_kv_b(const std::string& name, const MlaHeads& m) {
  return {.kv_b = matrix(name, m.n_head * (m.nope + m.v_dim), m.rank, Layout::kPanels)};
}

MlaKvB CheckpointSource::mla_kv_b(const std::string& name, const MlaHeads& m) {
  const DType stored_dtype = set_.get(name).dtype;
  if (stored_dtype == DType::kF8E4M3 && !quantizes_stored(quantized_.quantization, stored_dtype))
    return fp8_kv_b(name, m);
  const std::string k_name = name + " (W_UK of each head, transposed)";
  const std::string v_name = name + " (W_UV of each head)";
  // Split at row blocks of the quantized layout: every head's rows start one.
  if (quantized_.quantization == Quantization::kNone || m.rank % kQ8BlockRows != 0 ||
      m.v_dim % kQ8BlockRows != 0) {
    return stored_dtype == DType::kF8E4M3 ? fp8_kv_b(name, m) : split_kv_b(name, m);
  }
  if (auto k = quantized_copies_.find(k_name); k != quantized_copies_.end())
    return {.k_b = k->second.view(), .v_b = quantized_copies_.at(v_name).view()};
  const Matrix stored = view(name, m.n_head * (m.nope + m.v_dim), m.rank);
  std::vector<float> k_b, v_b;
  mla_split_kv_b(stored, m, k_b, v_b);
  if (stored.dtype == DType::kF8E4M3) bytes_by_name_.erase(name + "_scale_inv");
  const DType to = quantized_dtype(quantized_.quantization, name);
  const QuantizedMatrix& k =
      quantized_copies_
          .try_emplace(k_name, Matrix{DType::kF32, m.n_head * m.rank, m.nope, k_b.data()}, to,
                       &arena_)
          .first->second;
  const QuantizedMatrix& v =
      quantized_copies_
          .try_emplace(v_name, Matrix{DType::kF32, m.n_head * m.v_dim, m.rank, v_b.data()}, to,
                       &arena_)
          .first->second;
  const uint64_t before = bytes_by_name_[name], after = k.view().nbytes() + v.view().nbytes();
  if (converted_.count(name) == 0) release_pages(stored.data, before);
  quantized_.n_matrices += 1;
  quantized_.bytes_before += before;
  quantized_.bytes_after += after;
  bytes_by_name_[name] = after;
  return {.k_b = k.view(), .v_b = v.view()};
}

MlaKvB CheckpointSource::split_kv_b(const std::string& name, const MlaHeads& m) {
  if (auto it = split_kv_b_.find(name); it != split_kv_b_.end()) return it->second;
  const Matrix stored = view(name, m.n_head * (m.nope + m.v_dim), m.rank);
  DUET_CHECK(stored.dtype == DType::kBF16 || stored.dtype == DType::kF32,
             name << ": split in its dtype " << dtype_name(stored.dtype));
  // Both parts in huge pages in kv_b's dtype, with panels where matmul reads them, as every
  // attention projection.
  const size_t el = dtype_size(stored.dtype);
  void* k_b = allocate(name, "splitting it", m.n_head * m.rank * m.nope * el);
  void* v_b = allocate(name, "splitting it", m.n_head * m.v_dim * m.rank * el);
  mla_split_kv_b_elements(stored, m, k_b, v_b);
  const auto with_layout = [&](Matrix w, const std::string& part) {
    return opt_.repack && matmul_reads_panels(w.dtype) ? with_panels(part, w) : w;
  };
  const MlaKvB split{
      .k_b =
          with_layout({stored.dtype, m.n_head * m.rank, m.nope, k_b}, name + " (W_UK, transposed)"),
      .v_b = with_layout({stored.dtype, m.n_head * m.v_dim, m.rank, v_b}, name + " (W_UV)")};
  if (converted_.count(name) == 0) release_pages(stored.data, stored.nbytes());
  return split_kv_b_.emplace(name, split).first->second;
}

MlaKvB CheckpointSource::fp8_kv_b(const std::string& name, const MlaHeads& m) {
  if (auto it = split_kv_b_.find(name); it != split_kv_b_.end()) return it->second;
  const Matrix stored = view(name, m.n_head * (m.nope + m.v_dim), m.rank);
  Fp8Part k, v;
  if (!mla_split_kv_b_fp8(stored, m, k, v)) return WeightSource::mla_kv_b(name, m);
  bytes_by_name_[name] = k.codes.size() + v.codes.size();
  bytes_by_name_[name + "_scale_inv"] = (k.scales.size() + v.scales.size()) * sizeof(float);
  // The codes into huge pages as every matrix's copy; the scales beside the other f32 copies.
  const auto place = [&](Fp8Part& part) {
    Matrix w = part.view();
    void* codes = allocate(name, "splitting it", part.codes.size());
    std::memcpy(codes, part.codes.data(), part.codes.size());
    w.data = codes;
    w.f8.scale_inv = owned_.emplace_back(std::move(part.scales)).data();
    return w;
  };
  const MlaKvB split{.k_b = place(k), .v_b = place(v)};
  release_pages(stored.data, stored.nbytes());
  return split_kv_b_.emplace(name, split).first->second;
}

Matrix RecordingSource::matrix(const std::string& name, int64_t rows, int64_t cols,
                               Layout /*layout*/) {
  const bool seen = std::any_of(requests_.begin(), requests_.end(),
                                [&](const Request& r) { return r.name == name; });
  if (!seen) requests_.push_back({name, {rows, cols}});
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
