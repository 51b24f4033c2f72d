// The MPI backend (OpenMPI): ranks are processes started by mpirun, on one host or several.
// Coordinator and communicator each use their own duplicate of MPI_COMM_WORLD, so control
// messages on the caller's thread and data collectives on the communication thread never
// interleave. Every wait is a non-blocking MPI collective polled with MPI_Test and a short,
// growing sleep (the thread sleeps rather than spins). Past the watchdog time the wait asks the
// process's heartbeat (mpi_heartbeat.h) whether to give up: once a peer has sent no heartbeat
// for the watchdog time (it died or was stopped), or every rank is stuck (their collectives are
// out of step); a peer that is alive and computing is waited for however long it takes.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "dist/coordinator.h"
#include "dist/dist_context.h"

namespace duet {

// Whether duet was built with MPI.
bool mpi_available();

// Whether this process was started by mpirun (it sees OpenMPI's or PMIx's rank variables).
bool launched_by_mpirun();

// An Open MPI parameter as the environment variable that sets it.
struct MpiParam {
  const char* name;   // e.g. "OMPI_MCA_btl_tcp_eager_limit"
  const char* value;
};

// The parameters duet sets for Open MPI's TCP transport before MPI starts: messages up to 4 MiB
// are sent eagerly, without a rendezvous round trip (the reason and the measurement are in
// mpi_backend.cpp).
const std::vector<MpiParam>& mpi_tcp_defaults();

// Sets each of mpi_tcp_defaults() in the environment unless it is set already (by the user, or by
// mpirun's --mca), so that MPI_Init in this process reads it. make_mpi_context calls it.
void apply_mpi_tcp_defaults();

// Initialises MPI on first use (MPI_THREAD_MULTIPLE; MPI_Finalize runs at process exit) and
// returns this rank's context. Collective: every rank calls it. Throws duet::Error if duet was
// built without MPI or the library lacks MPI_THREAD_MULTIPLE.
DistContext make_mpi_context(std::chrono::milliseconds watchdog = kMpiWatchdog);

// Ends the whole job after a fatal error on this rank: prints "error: rank R: why" on stderr and
// calls MPI_Abort, which makes mpirun stop every rank. Without MPI initialised it only prints
// and exits with status 1.
[[noreturn]] void mpi_abort(const std::string& why);

}  // namespace duet
