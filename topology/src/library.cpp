#include "trellis/topology/library.hpp"

#include <fmt/format.h>
#include <hwloc.h>

namespace trellis::topology {

std::string hwloc_version() {
  // HWLOC_VERSION is the library release; hwloc_get_api_version() only the API level.
  unsigned v = hwloc_get_api_version();
  return fmt::format("{} (API {}.{})", HWLOC_VERSION, v >> 16, (v >> 8) & 0xff);
}

}  // namespace trellis::topology
