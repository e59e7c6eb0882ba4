// Where scripts/setup-models recorded SmolLM2's GGUF: $TRELLIS_SMOLLM2_GGUF, else the
// TRELLIS_SMOLLM2_GGUF= line of ~/.cache/trellis/models.env; empty when absent.
// TRELLIS_SKIP_WITHOUT_SMOLLM2(path) skips a test without it, or fails the test when
// TRELLIS_REQUIRE_PEERS=1 (CI: a skipped peer test is a failure there).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace trellis::test {

// The path, or "" with `why` saying exactly what was looked at and found missing.
inline std::string smollm2_gguf_path(std::string* why) {
  const char* env = std::getenv("TRELLIS_SMOLLM2_GGUF");
  std::string p = env ? env : "";
  std::string source = "TRELLIS_SMOLLM2_GGUF=" + p;
  if (p.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::filesystem::path dir = xdg && *xdg ? xdg : (home ? std::string(home) + "/.cache" : "");
    const std::filesystem::path file = dir / "trellis" / "models.env";
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("TRELLIS_SMOLLM2_GGUF=", 0) == 0) p = line.substr(21);
    if (p.empty()) {
      if (why)
        *why = "SmolLM2 GGUF not installed: TRELLIS_SMOLLM2_GGUF is unset and " + file.string() +
               (in.is_open() ? " has no TRELLIS_SMOLLM2_GGUF= line" : " does not exist") +
               " (run scripts/setup-models)";
      return "";
    }
    source = file.string() + " records TRELLIS_SMOLLM2_GGUF=" + p;
  }
  if (std::filesystem::is_regular_file(p)) return p;
  if (why) *why = "SmolLM2 GGUF missing: " + source + ", which is not a file (run scripts/setup-models)";
  return "";
}

inline std::string smollm2_gguf_path() { return smollm2_gguf_path(nullptr); }

inline std::string smollm2_missing() {
  std::string why;
  return smollm2_gguf_path(&why).empty() ? why : std::string();
}

// TRELLIS_REQUIRE_PEERS=1: a missing model or peer fails a test instead of skipping it.
inline bool peers_required() {
  const char* v = std::getenv("TRELLIS_REQUIRE_PEERS");
  return v && std::string(v) == "1";
}

inline constexpr const char* kNoSmollm2 = "SmolLM2 GGUF not installed: run scripts/setup-models";

}  // namespace trellis::test

#define TRELLIS_SKIP_WITHOUT_SMOLLM2(path)                                                          \
  do {                                                                                              \
    if ((path).empty()) {                                                                           \
      if (::trellis::test::peers_required())                                                        \
        FAIL() << ::trellis::test::smollm2_missing() << " [TRELLIS_REQUIRE_PEERS=1: not skipped]"; \
      GTEST_SKIP() << ::trellis::test::smollm2_missing();                                           \
    }                                                                                               \
  } while (0)
