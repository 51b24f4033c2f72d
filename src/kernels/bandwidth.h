// Measures this machine's memory read bandwidth, so benchmarks can report achieved GB/s as a
// ratio to a limit measured in the same run.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace duet {

// Best of `repeats` passes summing a `bytes`-sized f32 buffer with every thread of the pool.
// Returns bytes per second.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 3);

}  // namespace duet
