// JSON round trip of Topology and Placement. Field names follow the C++ members; enums
// are their to_string() names, so the JSON reads like `trellis topo` prints.
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "json_detail.hpp"
#include "trellis/core/error.hpp"
#include "trellis/topology/placement.hpp"

namespace trellis::topology {

// Enums as strings (ADL finds these for nlohmann).
void to_json(nlohmann::json& j, LinkClass c) { j = std::string(to_string(c)); }
void from_json(const nlohmann::json& j, LinkClass& c) { c = parse_link_class(j.get<std::string>()); }
void to_json(nlohmann::json& j, PciPath p) { j = std::string(to_string(p)); }
void from_json(const nlohmann::json& j, PciPath& p) { p = parse_pci_path(j.get<std::string>()); }
void to_json(nlohmann::json& j, NicKind k) { j = std::string(to_string(k)); }
void from_json(const nlohmann::json& j, NicKind& k) { k = parse_nic_kind(j.get<std::string>()); }
void to_json(nlohmann::json& j, RankKind k) { j = std::string(to_string(k)); }
void from_json(const nlohmann::json& j, RankKind& k) {
  const auto s = j.get<std::string>();
  if (s == "gpu") k = RankKind::kGpu;
  else if (s == "cpu") k = RankKind::kCpu;
  else if (s == "auto") k = RankKind::kAuto;
  else throw_error(ErrorCode::kCorruptInput, "rank kind '{}' is not gpu, cpu or auto", s);
}

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Core, index, pus)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NumaNode, index, package, memory_bytes, cores)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Device, index, name, model, pci_bus_id, numa, memory_bytes,
                                   host_link, host_link_bandwidth, pci_bandwidth)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Nic, name, kind, bandwidth, pci_bus_id, numa, gpu_paths)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DeviceLink, a, b, link_class, pci_path, nvlinks, via_nvswitch,
                                   bandwidth, pci_bandwidth)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Host, name, boot_id, source, cpu_model, packages, numa_nodes,
                                   devices, nics, links, notes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Fabric, link_class, bandwidth, description)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankInfo, rank, host, pid, bound_pus)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Topology, hosts, fabric, ranks, nvlink_disabled)
// Older placement files have no head_cost or split: read as 0 and empty (an even split).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ModelShape, layers, heads, kv_heads, head_cost, split)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankPlacement, rank, stage, tp, host, device, numa, cores, nic)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GroupLink, link_class, bandwidth)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Placement, pp, tp, model, kind, nvlink_disabled, ranks,
                                   tp_groups, boundaries, notes)

namespace {

// Why a number of `j` cannot be read, or "" when all can. nlohmann reads a float into an
// integer member by a plain cast, which is undefined beyond the integer's range (a topology
// JSON holding 5.5e118 as a NUMA node's memory_bytes; found by fuzz/topology_fuzz.cpp). No
// figure of a topology or placement comes near 2^53 (8 PiB, or 8 PB/s), so larger floats,
// and infinities, are refused whatever member they land in.
// Iterative, with a depth limit: the text is untrusted, and no topology nests 64 deep.
std::string out_of_range(const nlohmann::json& root) {
  struct At {
    const nlohmann::json* j;
    std::string path;
    int depth;
  };
  std::vector<At> todo{{&root, "", 0}};
  while (!todo.empty()) {
    At at = std::move(todo.back());
    todo.pop_back();
    const nlohmann::json& j = *at.j;
    if (at.depth > 64) return fmt::format("{} is nested deeper than 64 levels", at.path);
    if (j.is_number_float()) {
      const double v = j.get<double>();
      if (!std::isfinite(v) || std::fabs(v) >= 9007199254740992.0)
        return fmt::format("the number {} at {} is out of range", v, at.path.empty() ? "/" : at.path);
    } else if (j.is_array()) {
      for (std::size_t i = 0; i < j.size(); ++i) todo.push_back({&j[i], at.path + "/" + std::to_string(i), at.depth + 1});
    } else if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) todo.push_back({&it.value(), at.path + "/" + it.key(), at.depth + 1});
    }
  }
  return "";
}

template <typename T>
T parse_as(std::string_view text, std::string_view what) {
  try {
    const auto j = nlohmann::json::parse(text);
    if (auto why = out_of_range(j); !why.empty()) throw_error(ErrorCode::kCorruptInput, "{}", why);
    return j.get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kCorruptInput, "{}: {}", what, e.what());
  } catch (const Error& e) {
    throw_error(ErrorCode::kCorruptInput, "{}: {}", what, e.what());
  }
}

}  // namespace

namespace detail {
nlohmann::json host_to_json(const Host& host) { return host; }
Host host_from_json(const nlohmann::json& j) { return j.get<Host>(); }
nlohmann::json topology_to_json(const Topology& topo) { return topo; }
nlohmann::json placement_to_json(const Placement& p) { return p; }
}  // namespace detail

std::string to_json_text(const Topology& topo, int indent) { return nlohmann::json(topo).dump(indent); }

Topology topology_from_json_text(std::string_view text, std::string_view what) {
  return parse_as<Topology>(text, what);
}

std::string placement_to_json_text(const Placement& placement, int indent) {
  return nlohmann::json(placement).dump(indent);
}

Placement placement_from_json_text(std::string_view text, std::string_view what) {
  return parse_as<Placement>(text, what);
}

}  // namespace trellis::topology
