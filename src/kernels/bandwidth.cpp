#include "kernels/bandwidth.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <vector>

#include "kernels/ops.h"

namespace duet {

namespace {

constexpr int64_t kReadChunk = 1 << 16;  // floats per task: 256 KiB

int64_t n_read_chunks(int64_t n) { return (n + kReadChunk - 1) / kReadChunk; }

// Reads buf[0, n) with every thread of the pool, a chunk's sum into sums[chunk]; its seconds.
double read_chunks(ThreadPool& pool, const float* buf, int64_t n, std::vector<float>& sums) {
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(n_read_chunks(n), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t len = std::min(kReadChunk, n - c * kReadChunk);
      const float* p = buf + c * kReadChunk;
      sums[c] = dot(p, p, len);  // one stream: both operands are the same cache lines
    }
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// n floats of 1, in huge pages.
HugePtr filled(ThreadPool& pool, int64_t n) {
  HugePtr buf = allocate_huge(static_cast<size_t>(n) * sizeof(float));
  auto* p = static_cast<float*>(buf.get());
  pool.parallel_for(n, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, 1.0f); });
  return buf;
}

}  // namespace

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeats) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  const HugePtr buf = filled(pool, n);
  std::vector<float> sums(static_cast<size_t>(n_read_chunks(n)));
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const double s = read_chunks(pool, static_cast<const float*>(buf.get()), n, sums);
    best = std::max(best, static_cast<double>(n) * sizeof(float) / s);
  }
  volatile float sink = sums[0];
  (void)sink;
  return best;
}

size_t parse_cache_size(const std::string& text) {
  size_t i = 0, n = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    n = n * 10 + static_cast<size_t>(text[i] - '0');
  }
  if (i == 0) return 0;
  std::string unit = text.substr(i);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  if (unit.empty()) return n;
  if (unit == "K") return n << 10;
  if (unit == "M") return n << 20;
  if (unit == "G") return n << 30;
  return 0;
}

size_t last_level_cache_bytes(const std::string& cache_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int best_level = 0;
  size_t best = 0;
  for (fs::directory_iterator it(cache_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    if (e.path().filename().string().rfind("index", 0) != 0) continue;
    std::ifstream level_f(e.path() / "level"), type_f(e.path() / "type"), size_f(e.path() / "size");
    int level = 0;
    std::string type, size;
    if (!(level_f >> level) || !(type_f >> type) || !(size_f >> size)) continue;
    if (type != "Data" && type != "Unified") continue;
    if (level > best_level) {
      best_level = level;
      best = parse_cache_size(size);
    }
  }
  return best;
}

StepReads::StepReads(ThreadPool& pool, size_t bytes_per_read)
    : pool_(pool), per_read_(std::max<int64_t>(1, static_cast<int64_t>(bytes_per_read / 4))) {
  buf_n_ = std::max<int64_t>(int64_t{1} << 28, 4 * per_read_);
  buf_ = filled(pool, buf_n_);
  sums_.resize(static_cast<size_t>(n_read_chunks(per_read_)));
}

void StepReads::read() {
  if (next_ + per_read_ > buf_n_) next_ = 0;
  seconds_ += read_chunks(pool_, static_cast<const float*>(buf_.get()) + next_, per_read_, sums_);
  bytes_ += static_cast<double>(per_read_) * sizeof(float);
  next_ += per_read_;
}

}  // namespace duet
