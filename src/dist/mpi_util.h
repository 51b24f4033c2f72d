// What the MPI backend's files share (internal to src/dist/mpi_*): MPI's C header and the check
// that turns an MPI error code into duet::Error. Empty in a build without MPI (DUET_HAVE_MPI
// unset), like the rest of the backend.
#pragma once

#if DUET_HAVE_MPI
// Only MPI's C API: its deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstddef>
#include <string>

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

}  // namespace duet

#endif  // DUET_HAVE_MPI
