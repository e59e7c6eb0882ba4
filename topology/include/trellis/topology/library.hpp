// Versions of the libraries the topology layer uses (hwloc; NVML is loaded at run time).
#pragma once

#include <string>

namespace trellis::topology {

// hwloc's API version at run time, e.g. "2.9.0".
std::string hwloc_version();

}  // namespace trellis::topology
