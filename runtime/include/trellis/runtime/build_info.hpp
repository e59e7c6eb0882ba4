// The runtime's build facts: compiler, flags and which optional paths were compiled in.
#pragma once

#include <string>

namespace trellis::runtime {

struct BuildInfo {
  std::string version;
  std::string compiler;
  std::string build_type;
};

BuildInfo build_info();

}  // namespace trellis::runtime
