// Runs the duet binary (DUET_BINARY, set by the test build) as a child process, for the tests of
// its command line.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace duet::test {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out;     // stdout and stderr together
};

// Runs `duet args`; `env` (e.g. "PATH=/x") is put before the command.
inline RunResult run_duet(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " " + std::string(DUET_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  RunResult r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

}  // namespace duet::test
