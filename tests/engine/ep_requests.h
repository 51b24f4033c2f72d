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

// The requests of `rank` when request i goes to rank i % world (data-parallel attention); *idx
// gets their indices in reqs.
inline std::vector<GenerateRequest> rank_share(const std::vector<GenerateRequest>& reqs, int rank,
                                               int world, std::vector<size_t>* idx) {
  std::vector<GenerateRequest> mine;
  idx->clear();
  for (size_t i = static_cast<size_t>(rank); i < reqs.size(); i += static_cast<size_t>(world)) {
    mine.push_back(reqs[i]);
    idx->push_back(i);
  }
  return mine;
}

}  // namespace duet::test
