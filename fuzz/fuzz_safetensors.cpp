// A .safetensors file (header length, JSON header, data): opened through the same mmap path the
// loader uses, from a file in /dev/shm, then every tensor's view read end to end.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/dev/shm/duet-fuzz-" + std::to_string(getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = duet::SafetensorsFile::open(path);
    uint64_t sum = 0;
    for (const auto& [name, view] : file->tensors()) {
      const auto* p = static_cast<const uint8_t*>(view.data);
      for (size_t i = 0; i < view.nbytes(); ++i) sum += p[i];
    }
    (void)sum;
  } catch (const duet::Error&) {
  }
  return 0;
}
