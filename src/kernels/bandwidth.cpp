#include "kernels/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/ops.h"

namespace duet {

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeats) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  std::vector<float> buf(static_cast<size_t>(n));
  pool.parallel_for(n, [&](int64_t b, int64_t e) { std::fill(buf.data() + b, buf.data() + e, 1.0f); });
  const int64_t chunk = 1 << 16;  // floats per task: 256 KiB
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  double best = 0.0;
  std::vector<float> sums(static_cast<size_t>(n_chunks));
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n_chunks, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const int64_t len = std::min(chunk, n - c * chunk);
        const float* p = buf.data() + c * chunk;
        sums[c] = dot(p, p, len);  // one stream: both operands are the same cache lines
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n) * sizeof(float) / s);
  }
  volatile float sink = sums[0];
  (void)sink;
  return best;
}

namespace {
constexpr int64_t kReadChunk = 1 << 16;  // floats per task: 256 KiB
}  // namespace

StepReads::StepReads(ThreadPool& pool, size_t bytes_per_read)
    : pool_(pool), per_read_(std::max<int64_t>(1, static_cast<int64_t>(bytes_per_read / 4))) {
  const int64_t n = std::max<int64_t>(int64_t{1} << 28, 8 * per_read_);
  buf_.resize(static_cast<size_t>(n));
  pool.parallel_for(
      n, [&](int64_t b, int64_t e) { std::fill(buf_.data() + b, buf_.data() + e, 1.0f); });
  sums_.resize(static_cast<size_t>((per_read_ + kReadChunk - 1) / kReadChunk + 1));
}

void StepReads::read() {
  const int64_t n = static_cast<int64_t>(buf_.size());
  if (next_ + per_read_ > n) next_ = 0;
  const float* base = buf_.data() + next_;
  const int64_t len = per_read_;
  const auto t0 = std::chrono::steady_clock::now();
  pool_.parallel_for((len + kReadChunk - 1) / kReadChunk, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t m = std::min(kReadChunk, len - c * kReadChunk);
      sums_[c] = dot(base + c * kReadChunk, base + c * kReadChunk, m);
    }
  });
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bytes_ += static_cast<double>(len) * sizeof(float);
  next_ += len;
}

}  // namespace duet
