// Decisive prompts of the tiny models, for tests that compare two numerics. Needs
// DUET_SOURCE_DIR (defined for duet_tests).
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace duet::test {

// Prompts on which the tiny model of `arch` with `dtype` weights decides firmly: under f32 or
// bf16 K/V rows and f32 or bf16-rounded product inputs, every token of each prompt and of its 8
// greedy tokens goes to the same experts with a top-k margin of at least 5e-3 (the roundings move
// margins by at most 4.3e-3), and every greedy step's top-2 logit gap is at least 2e-2 of the
// row's scale. Tests that expect the same greedy tokens from two numerics use them. Chosen and
// checked by the NumPy reference (tests/reference/decisive_prompts.py, the `decisive_prompts`
// test), stored in tests/engine/decisive_prompts.json: 3 prompts of 5, 9 and 13 tokens.
// With `quantization` "int4" or "int4_pure": prompts on which the model with the matrices that
// --quantization quantizes dequantized (int4's output head from int8, int4_pure's from int4)
// decides so firmly (the 4-bit model departs further from the original than those roundings move
// it, so the original's prompts need not be its).
inline std::vector<std::vector<int32_t>> decisive_prompts(const std::string& arch, DType dtype,
                                                          const std::string& quantization = "") {
  const std::string path = std::string(DUET_SOURCE_DIR) + "/tests/engine/decisive_prompts.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  const nlohmann::json all = nlohmann::json::parse(in);
  const std::string key = arch + (dtype == DType::kF32 ? "_f32" : "_bf16") +
                          (quantization.empty() ? "" : "_" + quantization);
  if (!all["prompts"].contains(key)) throw std::runtime_error(path + " has no prompts for " + key);
  return all["prompts"][key].get<std::vector<std::vector<int32_t>>>();
}

}  // namespace duet::test
