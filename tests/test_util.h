// Small file-system helpers for tests. Header-only, so every test file can use them without a
// build change. Failures throw std::runtime_error (a test bug, not an expected failure).
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace duet::test {

// The directories make_temp_dir made, removed when the test program exits (kept if the
// environment sets DUET_KEEP_TEST_DIRS, for debugging).
class TempDirs {
 public:
  ~TempDirs() {
    if (::getenv("DUET_KEEP_TEST_DIRS")) return;
    std::error_code ec;
    for (const std::string& d : dirs_) std::filesystem::remove_all(d, ec);
  }
  void add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(dir);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

inline TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

// Creates a fresh, empty directory /tmp/<prefix>XXXXXX and returns its path; it is removed
// when the program exits.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
  }
  temp_dirs().add(pattern);
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
