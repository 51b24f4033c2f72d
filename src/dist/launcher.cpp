#include "dist/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace duet {

namespace {
std::vector<std::string>& saved_command() {
  static std::vector<std::string> cmd;
  return cmd;
}
}  // namespace

void set_command_line(int argc, char** argv) {
  saved_command().assign(argv, argv + argc);
}

const std::vector<std::string>& command_line() {
  return saved_command();
}

std::vector<std::string> mpirun_argv(int n_ranks, const std::string& exe,
                                     const std::vector<std::string>& command, bool recovery) {
  // --enable-recovery: when a rank dies, mpirun leaves the others running instead of tearing the
  // job down at once, so their watchdogs name the dead rank and rank 0's HTTP server answers 503
  // rather than vanishing mid-request.
  std::vector<std::string> argv = {"mpirun"};
  if (recovery) argv.push_back("--enable-recovery");
  argv.insert(argv.end(), {"-np", std::to_string(n_ranks)});
  if (n_ranks > available_cores()) argv.push_back("--oversubscribe");
  argv.push_back(exe);
  if (!command.empty()) argv.insert(argv.end(), command.begin() + 1, command.end());
  return argv;
}

[[noreturn]] void relaunch_under_mpirun(int n_ranks, bool recovery) {
  if (command_line().empty()) DUET_ERROR("relaunch_under_mpirun: no command line recorded");
  // The ranks run this very binary, wherever it was started from.
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) DUET_ERROR("cannot read /proc/self/exe: " << std::strerror(errno));
  exe[n] = '\0';
  std::vector<std::string> args = mpirun_argv(n_ranks, exe, command_line(), recovery);
  if (::geteuid() == 0) {
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // mpirun must get the signals this process may have blocked or ignored for itself (serve
  // waits for SIGINT/SIGTERM on a thread): a blocked mask and SIG_IGN survive exec.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  ::execvp("mpirun", argv.data());
  DUET_ERROR("--distributed-backend mpi: cannot run mpirun ("
             << std::strerror(errno) << "); install openmpi-bin and libopenmpi-dev");
}

}  // namespace duet
