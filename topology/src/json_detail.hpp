// Private: nlohmann::json forms of the topology values, for code inside topology/ that
// embeds them in larger documents (gathering over ranks).
#pragma once

#include <nlohmann/json.hpp>

#include "trellis/topology/placement.hpp"
#include "trellis/topology/topology.hpp"

namespace trellis::topology::detail {

nlohmann::json host_to_json(const Host& host);
// Throws nlohmann::json::exception or trellis::Error on malformed input.
Host host_from_json(const nlohmann::json& j);
nlohmann::json topology_to_json(const Topology& topo);
nlohmann::json placement_to_json(const Placement& p);

}  // namespace trellis::topology::detail
