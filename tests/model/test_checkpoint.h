// Helpers of the tests that compare a checkpoint with an edited or converted copy of it.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/generator.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace duet::test {

// Every tensor of dir's safetensors, in the set's order, with its bytes copied.
inline std::vector<TensorData> read_tensors(const std::string& dir) {
  std::vector<TensorData> ts;
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  for (const std::string& name : set.names()) {
    const TensorView& v = set.get(name);
    const auto* p = static_cast<const uint8_t*>(v.data);
    ts.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(p, p + v.nbytes())});
  }
  return ts;
}

// One greedy request (9 prompt tokens, 6 generated) on `a` and on `b`: the same tokens and every
// prompt logit the same, bit for bit.
inline void expect_same_generation(Model& a, Model& b, const std::string& what) {
  ThreadPool pool(2);
  GenerateRequest r;
  r.prompt = {7, 300, 11, 42, 8, 9, 100, 3, 55};
  r.max_tokens = 6;
  r.prompt_logits = true;
  const GenerateResult got = Generator(a, pool).generate({r})[0];
  const GenerateResult want = Generator(b, pool).generate({r})[0];
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.prompt_logits, want.prompt_logits) << what;
}

}  // namespace duet::test
