// The MPI world of an MPI test binary (run by tests/harness/mpi_main.cpp under mpirun), made
// once on first use and shared by every test in the binary, and the deadline tests give a
// blocking transport call: long enough for a loaded 2-core machine, short enough that a
// hang fails the test instead of the CTest timeout.
#pragma once

#include <numeric>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::testing_support {

inline transport::Bootstrap& world() {
  static auto w = transport::make_mpi_bootstrap();
  return *w;
}

inline Deadline soon() { return Deadline::after_ms(30000); }

// Every world rank, in order: the members of a group over the whole world.
inline std::vector<int> everyone() {
  std::vector<int> m(static_cast<std::size_t>(world().size()));
  std::iota(m.begin(), m.end(), 0);
  return m;
}

}  // namespace trellis::testing_support
