// Starting the ranks of a distributed run on one host. With the in-process backend the ranks are
// threads (run_ranks in inproc_backend.h); with MPI, a command that is not already under mpirun
// re-executes itself as `mpirun -np N <same command>`. Several hosts are the user's mpirun
// (`mpirun --hostfile HOSTS -np N duet ...`), which the same code then simply joins.
#pragma once

#include <string>
#include <vector>

namespace duet {

// Records the process's command line (main calls it first) so it can be re-executed.
void set_command_line(int argc, char** argv);
const std::vector<std::string>& command_line();

// The argv of `mpirun` running `exe` with command's arguments (command[0] is dropped) on n ranks
// of this host: --oversubscribe when n exceeds the cores, and with `recovery` --enable-recovery,
// so that one rank's death is reported by the others while they go on (a server's rank 0 answers
// 503). OpenMPI 4.1's mpirun then exits with status 0 whatever its ranks did, so a command whose
// exit status matters (generate, the benchmarks) runs without it: a rank that fails or dies ends
// the job, and mpirun's status is non-zero. Exposed for tests.
std::vector<std::string> mpirun_argv(int n_ranks, const std::string& exe,
                                     const std::vector<std::string>& command, bool recovery);

// Replaces this process by `mpirun -np n_ranks <this command>` (mpirun_argv) and never returns on
// success. As root it sets OpenMPI's two OMPI_ALLOW_RUN_AS_ROOT variables. Throws duet::Error if
// mpirun cannot be executed (OpenMPI missing) or set_command_line was not called.
[[noreturn]] void relaunch_under_mpirun(int n_ranks, bool recovery = false);

}  // namespace duet
