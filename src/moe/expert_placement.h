// Which rank holds which routed experts under expert parallelism: contiguous ranges of equal
// size, rank r holding experts [r * n_local, (r + 1) * n_local).
#pragma once

#include <cstdint>
#include <string>

namespace duet {

struct ExpertPlacement {
  int64_t n_expert = 0;
  int world_size = 1;

  int64_t n_local() const { return n_expert / world_size; }
  int64_t begin(int rank) const { return rank * n_local(); }
  int64_t end(int rank) const { return begin(rank) + n_local(); }
  int owner(int64_t expert) const { return static_cast<int>(expert / n_local()); }
  // "experts [8, 16) of 32" — for the start-up report.
  std::string describe(int rank) const;
};

// Places n_expert experts on world_size ranks. Throws duet::Error if world_size is below 1,
// larger than n_expert, or does not divide it (every rank must hold as many experts: the
// low_latency buffers are per expert and the same size everywhere).
ExpertPlacement place_experts(int64_t n_expert, int world_size);

}  // namespace duet
