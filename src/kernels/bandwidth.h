// Measures this machine's memory read bandwidth, so benchmarks can report achieved GB/s as a
// ratio to a limit measured in the same run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/huge_pages.h"
#include "core/thread_pool.h"

namespace duet {

// The OR of the 32-bit words p[0, n), n a multiple of 64: a read of memory with nothing else in
// its way, on AVX-512, AVX2 or plain words, whichever the CPU has. The reads below and the
// kernels benchmark's ceiling (BM_ReadBandwidth) are made of it.
uint32_t or_words(const uint32_t* p, int64_t n);

// Best of `repeats` passes reading a `bytes`-sized buffer (rounded down to whole 256 bytes) with
// every thread of the pool, nothing but ORs of its words in the way. Returns bytes per second. The
// buffers here are in huge pages, as the weights are (core/huge_pages.h): the limit is the best
// pace a read reaches.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 3);

// The size of this CPU's last-level cache (one instance: the largest `level` among the data and
// unified caches under cache_dir, Linux's sysfs layout index*/{level,type,size}), in bytes; 0
// where it cannot be read. Benchmarks that set decode against memory's bandwidth use it: a step
// whose weights mostly fit in it reads them partly from the cache (a 300 MB L3 holds an int4 step
// of the small presets), and a read meant to leave the caches cold must be larger than it.
size_t last_level_cache_bytes(const std::string& cache_dir = "/sys/devices/system/cpu/cpu0/cache");
// sysfs's size text ("48K", "2048K", "32M") in bytes; 0 for anything else.
size_t parse_cache_size(const std::string& text);

// Reads of a fixed size from memory, timed, to interleave with a benchmark's steps: each read()
// reads (as measure_read_bandwidth does) the next `bytes_per_read` bytes (rounded down to whole
// 256 bytes) of a buffer at least 4 times larger (and at least 1 GiB),
// wrapping around, with every thread of the pool, so that no read finds its bytes in a cache
// (reads of twice the last-level cache, as bench latency makes them where steps are smaller,
// leave at most half a read cached, never the next one).
// Reads taken between steps see the memory as the steps beside them do, minute by minute.
class StepReads {
 public:
  StepReads(ThreadPool& pool, size_t bytes_per_read);
  void read();
  // Bytes read and seconds spent since construction or the last reset().
  double bytes() const { return bytes_; }
  double seconds() const { return seconds_; }
  double bytes_per_read() const { return static_cast<double>(per_read_) * sizeof(float); }
  void reset() { bytes_ = seconds_ = 0; }

 private:
  ThreadPool& pool_;
  HugePtr buf_;
  int64_t buf_n_;  // floats in buf_
  std::vector<uint32_t> sums_;
  int64_t per_read_;  // floats
  int64_t next_ = 0;  // float offset of the next read
  double bytes_ = 0, seconds_ = 0;
};

}  // namespace duet
