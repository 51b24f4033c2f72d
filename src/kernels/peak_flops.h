// Measures this machine's f32 FMA throughput, so benchmarks can report achieved GFLOP/s as a
// ratio to a limit measured in the same run (as bandwidth.h does for decode).
#pragma once

#include "core/thread_pool.h"

namespace duet {

// Best of `repeats` passes in which every thread of the pool runs independent FMA chains on
// registers only, on the widest instruction set matmul uses. Returns FLOP per second (an FMA
// counts 2).
double measure_peak_flops(ThreadPool& pool, int repeats = 3);

}  // namespace duet
