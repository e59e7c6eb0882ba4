// The only place that reads environment variables (besides argv in cli.cpp).
#pragma once

#include "trellis/core/config.hpp"

namespace trellis::launchers {

// Applies every declared setting's environment variable that is set. Throws
// ErrorCode::kInvalidArgument naming the variable when its value does not parse.
void apply_environment(Config& config);

// True when this process was started by mpirun/mpiexec (Open MPI, MPICH/PMI or PMIx).
bool launched_by_mpirun();

}  // namespace trellis::launchers
