// The requests the expert-parallel equality tests share (in-process and MPI).
#pragma once

#include <random>
#include <vector>

#include "engine/generator.h"

namespace duet::test {

// n requests of different prompt lengths (3, 5, 7, ...) and max_tokens (5, 7, 9, 5, ...), the
// same on every rank and every run (fixed seed).
inline std::vector<GenerateRequest> ep_requests(int n) {
  std::mt19937 rng(77);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    for (int j = 0; j < 3 + 2 * i; ++j) r.prompt.push_back(1 + static_cast<int32_t>(rng() % 500));
    r.max_tokens = 5 + 2 * (i % 3);
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace duet::test
