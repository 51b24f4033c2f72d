// Small file-system helpers for tests. Header-only, so every test file can use them without a
// build change. Failures throw std::runtime_error (a test bug, not an expected failure).
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace duet::test {

// Whether process pid exists and has not exited (a zombie, ended but not yet reaped, has).
inline bool process_runs(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: kill's answer
  const size_t paren = line.rfind(')');        // "pid (comm) state ...": comm may hold spaces
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

// Removes the directories <root>/duet-test-<pid> whose process no longer runs: what test
// programs killed by a signal (a timeout, ^C) left, as they never ran their exit handlers. Returns
// how many it removed.
inline int remove_dead_test_dirs(const std::string& root) {
  constexpr std::string_view kPrefix = "duet-test-";
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix) || !entry.is_directory(ec)) continue;
    const std::string digits = name.substr(kPrefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::strtol(digits.c_str(), nullptr, 10);
    if (pid <= 0 || !process_runs(static_cast<pid_t>(pid))) {
      std::error_code rm;
      if (std::filesystem::remove_all(entry.path(), rm) > 0 && !rm) ++removed;
    }
  }
  return removed;
}

// The directories make_temp_dir made, all inside /tmp/duet-test-<pid> of this process, removed
// when the program exits (kept if the environment sets DUET_KEEP_TEST_DIRS, for debugging). The
// first one made also removes what dead test programs left (remove_dead_test_dirs).
class TempDirs {
 public:
  ~TempDirs() {
    if (::getenv("DUET_KEEP_TEST_DIRS") || parent_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(parent_, ec);
  }
  // This process's parent directory, made (and the dead ones swept) on the first call.
  std::string parent() {
    std::lock_guard<std::mutex> lock(mu_);
    if (parent_.empty()) {
      remove_dead_test_dirs("/tmp");
      const std::string dir = "/tmp/duet-test-" + std::to_string(::getpid());
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) throw std::runtime_error("cannot make " + dir + ": " + ec.message());
      parent_ = dir;
    }
    return parent_;
  }

 private:
  std::mutex mu_;
  std::string parent_;  // GUARDED_BY(mu_)
};

inline TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

// Creates a fresh, empty directory /tmp/duet-test-<pid>/<prefix>XXXXXX and returns its path; it
// is removed when the program exits, or by the next test program if this one is killed.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string pattern = temp_dirs().parent() + "/" + prefix + "XXXXXX";
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
