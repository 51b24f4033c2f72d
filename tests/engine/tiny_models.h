// Tiny f32 models of each architecture, made once per test binary run in a temp directory.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "model/make_model.h"
#include "test_util.h"

namespace duet::test {

// The directory of a tiny model (f32, seed 1234) of `arch`, created on first use.
inline const std::string& tiny_model_dir(const std::string& arch, DType dtype = DType::kF32) {
  static std::map<std::string, std::string> dirs;
  const std::string key = arch + (dtype == DType::kF32 ? "-f32" : "-bf16");
  auto it = dirs.find(key);
  if (it != dirs.end()) return it->second;
  MakeModelOptions opt;
  opt.dir = make_temp_dir("duet-" + key + "-");
  opt.arch = arch;
  opt.preset = "tiny";
  opt.seed = 1234;
  opt.dtype = dtype;
  make_model(opt);
  return dirs[key] = opt.dir;
}

}  // namespace duet::test
