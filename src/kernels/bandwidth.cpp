#include "kernels/bandwidth.h"

#include <immintrin.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <vector>

namespace duet {

namespace {

constexpr int64_t kReadChunk = 1 << 16;  // floats per task: 256 KiB
constexpr int64_t kLineWords = 64;       // reads cover whole multiples of 4 cache lines

int64_t n_read_chunks(int64_t n) {
  return (n + kReadChunk - 1) / kReadChunk;
}

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where inlined (see simd_impl.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// or_words (bandwidth.h): 4 independent chains of 1-cycle ORs over whole cache lines. A sum of
// products (ops.h's dot, 4 chains of FMAs) read 0.78-0.84 as fast from memory (2 threads, Emerald
// Rapids), and the limit is the best pace a read reaches.
__attribute__((target("avx512f"))) uint32_t or_words_avx512(const uint32_t* p, int64_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (int64_t i = 0; i < n; i += 64) {
    a = _mm512_or_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_or_si512(b, _mm512_loadu_si512(p + i + 16));
    c = _mm512_or_si512(c, _mm512_loadu_si512(p + i + 32));
    d = _mm512_or_si512(d, _mm512_loadu_si512(p + i + 48));
  }
  return static_cast<uint32_t>(
      _mm512_reduce_or_epi32(_mm512_or_si512(_mm512_or_si512(a, b), _mm512_or_si512(c, d))));
}

__attribute__((target("avx2"))) uint32_t or_words_avx2(const uint32_t* p, int64_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (int64_t i = 0; i < n; i += 32) {
    a = _mm256_or_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_or_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    c = _mm256_or_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16)));
    d = _mm256_or_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 24)));
  }
  alignas(32) uint32_t w[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w),
                     _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d)));
  uint32_t r = 0;
  for (uint32_t v : w) r |= v;
  return r;
}

#pragma GCC diagnostic pop

// Reads buf[0, n) (n a multiple of 64) with every thread of the pool, a chunk's OR into
// sums[chunk]; its seconds.
double read_chunks(ThreadPool& pool, const float* buf, int64_t n, std::vector<uint32_t>& sums) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto* words = reinterpret_cast<const uint32_t*>(buf);
  pool.parallel_for(n_read_chunks(n), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t len = std::min(kReadChunk, n - c * kReadChunk);
      sums[c] = or_words(words + c * kReadChunk, len);
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

uint32_t or_words(const uint32_t* p, int64_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512) return or_words_avx512(p, n);
  if (avx2) return or_words_avx2(p, n);
  uint32_t r = 0;
  for (int64_t i = 0; i < n; ++i) r |= p[i];
  return r;
}

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeats) {
  const int64_t n = std::max<int64_t>(
      kLineWords, static_cast<int64_t>(bytes / sizeof(float)) / kLineWords * kLineWords);
  const HugePtr buf = filled(pool, n);
  std::vector<uint32_t> sums(static_cast<size_t>(n_read_chunks(n)));
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const double s = read_chunks(pool, static_cast<const float*>(buf.get()), n, sums);
    best = std::max(best, static_cast<double>(n) * sizeof(float) / s);
  }
  volatile uint32_t sink = sums[0];
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
    : pool_(pool),
      per_read_(std::max<int64_t>(
          kLineWords, static_cast<int64_t>(bytes_per_read / 4) / kLineWords * kLineWords)) {
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
