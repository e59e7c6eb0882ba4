// MPI return codes as trellis errors, for the code that calls MPI (the bootstrap, the MPI
// group, the mpi link). The communicators use MPI_ERRORS_RETURN, so every call's code is
// checked here.
#pragma once

#include <mpi.h>

#include <string>

namespace trellis::transport::detail {

// MPI's text for `rc` (MPI_Error_string).
std::string mpi_error_text(int rc);

// Throws kPeerFailed "MPI <what> failed: <text>".
[[noreturn]] void throw_mpi_failed(int rc, const char* what);

inline void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw_mpi_failed(rc, what);
}

}  // namespace trellis::transport::detail
