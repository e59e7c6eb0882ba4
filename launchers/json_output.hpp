// Every --json a command prints says which trellis wrote it ("trellis_version"), so results
// kept from different builds can be told apart.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace trellis::launchers {

// `j` (an object) with "trellis_version" added, indented by `indent` (-1: one line, as
// `eval ppl --json` prints it); invalid UTF-8 is replaced.
inline std::string versioned_json(nlohmann::json j, int indent = 2) {
  j["trellis_version"] = TRELLIS_VERSION;
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trellis::launchers
