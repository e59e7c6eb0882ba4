// Where scripts/setup-models recorded SmolLM2's GGUF: $TRELLIS_SMOLLM2_GGUF, else the
// TRELLIS_SMOLLM2_GGUF= line of ~/.cache/trellis/models.env; empty when absent.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace trellis::test {

inline std::string smollm2_gguf_path() {
  const char* env = std::getenv("TRELLIS_SMOLLM2_GGUF");
  std::string p = env ? env : "";
  if (p.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::filesystem::path dir = xdg ? xdg : (home ? std::string(home) + "/.cache" : "");
    std::ifstream in(dir / "trellis" / "models.env");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("TRELLIS_SMOLLM2_GGUF=", 0) == 0) p = line.substr(21);
  }
  return !p.empty() && std::filesystem::is_regular_file(p) ? p : "";
}

inline constexpr const char* kNoSmollm2 = "SmolLM2 GGUF not installed: run scripts/setup-models";

}  // namespace trellis::test
