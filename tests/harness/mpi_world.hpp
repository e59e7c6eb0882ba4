// The MPI world of an MPI test binary (run by tests/harness/mpi_main.cpp under mpirun), made
// once on first use and shared by every test in the binary, and the deadline tests give a
// blocking transport call: long enough for a loaded 2-core machine, short enough that a
// hang fails the test instead of the CTest timeout.
#pragma once

#include "trellis/core/clock.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::testing_support {

inline transport::Bootstrap& world() {
  static auto w = transport::make_mpi_bootstrap();
  return *w;
}

inline Deadline soon() { return Deadline::after_ms(30000); }

}  // namespace trellis::testing_support
