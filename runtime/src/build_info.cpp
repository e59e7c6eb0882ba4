#include "trellis/runtime/build_info.hpp"

namespace trellis::runtime {

BuildInfo build_info() {
  BuildInfo b;
  b.version = TRELLIS_VERSION;
#if defined(__clang__)
  b.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  b.compiler = "g++ " __VERSION__;
#endif
#ifdef NDEBUG
  b.build_type = "optimised";
#else
  b.build_type = "debug (assertions on)";
#endif
  return b;
}

}  // namespace trellis::runtime
