// Small file-system helpers for tests. Header-only, so every test file can use them without a
// build change. Failures throw std::runtime_error (a test bug, not an expected failure).
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace duet::test {

// Creates a fresh, empty directory /tmp/<prefix>XXXXXX and returns its path. The caller removes it.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  }
  return pattern;
}

// Writes `bytes` to `path`, replacing any existing file.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// The whole content of `path`.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace duet::test
