// A tiny model whose embedding row of one token is NaN: every sequence holding that token gets NaN
// hidden states and logits, the others are untouched (nothing mixes sequences). For the tests of
// non-finite logits ending one request and not the batch.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "engine/tiny_models.h"
#include "test_util.h"

namespace duet::test {

// A copy of the tiny f32 qwen3_moe model with token `token`'s embedding row set to NaN.
inline std::string poisoned_model_dir(int32_t token) {
  const std::string src = tiny_model_dir("qwen3_moe");
  const std::string dir = make_temp_dir("duet-poisoned-");
  std::filesystem::copy(src, dir,
                        std::filesystem::copy_options::recursive |
                            std::filesystem::copy_options::overwrite_existing);
  const std::string path = dir + "/model.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  const nlohmann::json& t = h.at("model.embed_tokens.weight");
  if (t.at("dtype") != "F32") throw std::runtime_error("poisoned_model_dir: not an f32 model");
  const int64_t n_embd = t.at("shape")[1].get<int64_t>();
  const uint64_t begin = t.at("data_offsets")[0].get<uint64_t>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  f.seekp(static_cast<std::streamoff>(8 + header_len + begin + token * n_embd * 4));
  for (int64_t i = 0; i < n_embd; ++i) f.write(reinterpret_cast<const char*>(&nan), 4);
  if (!f) throw std::runtime_error("poisoned_model_dir: cannot write " + path);
  return dir;
}

}  // namespace duet::test
