// What the MPI backend's files share (internal to src/dist/mpi_*): MPI's C header and the check
// that turns an MPI error code into duet::Error. Empty in a build without MPI (DUET_HAVE_MPI
// unset), like the rest of the backend.
#pragma once

#if DUET_HAVE_MPI
// Only MPI's C API: its deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

#include "core/error.h"

namespace duet {

// Throws duet::Error "what: MPI error: <MPI's message>" unless rc is MPI_SUCCESS. For calls on a
// communicator whose errors return (MPI_ERRORS_RETURN) rather than abort.
inline void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DUET_ERROR(what << ": MPI error: " << std::string(msg, static_cast<size_t>(len)));
}

// How long the start-up collectives (the duplicates of MPI_COMM_WORLD for the heartbeat and the
// two channels) may take, in watchdog times: the ranks reach them together, right after MPI
// starts, before any has a heartbeat to show it alive.
inline constexpr int kStartupWatchdogs = 5;

// Waits for `req`, a start-up collective just posted, polling it with short naps; after
// `deadline` throws duet::Error naming `what` and sets *abandoned (the request stays pending:
// MPI_Finalize must not run).
inline void wait_within(MPI_Request* req, const char* what, std::chrono::milliseconds deadline,
                        bool* abandoned) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto nap = std::chrono::microseconds(10);; nap = std::min(2 * nap, decltype(nap)(5000))) {
    int done = 0;
    check_mpi(MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (waited >= deadline) {
      *abandoned = true;
      int rank = 0, size = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      DUET_ERROR(
          "start-up: " << what << ": rank " << rank << " of " << size << " waited "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                       << " ms for the other ranks to join; one died or never started");
    }
    std::this_thread::sleep_for(nap);
  }
}

// MPI_Comm_dup(MPI_COMM_WORLD) that gives up after `deadline` instead of blocking forever when a
// rank died before joining it (wait_within). The duplicate's errors return (MPI_ERRORS_RETURN).
inline MPI_Comm dup_world(const char* what, std::chrono::milliseconds deadline, bool* abandoned) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req), what);
  wait_within(&req, what, deadline, abandoned);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return comm;
}

}  // namespace duet

#endif  // DUET_HAVE_MPI
