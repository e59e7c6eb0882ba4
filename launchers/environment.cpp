#include "environment.hpp"

#include <cstdlib>
#include <string>

namespace trellis::launchers {

void apply_environment(Config& config) {
  for (const auto& spec : all_settings()) {
    if (spec.env.empty()) continue;
    std::string var(spec.env);
    if (const char* v = std::getenv(var.c_str()); v != nullptr && *v != '\0') {
      config.set(spec.name, v, SettingSource::kEnvironment, var);
    }
  }
}

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

}  // namespace trellis::launchers
