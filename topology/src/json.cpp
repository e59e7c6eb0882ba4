// JSON round trip of Topology and Placement. Field names follow the C++ members; enums
// are their to_string() names, so the JSON reads like `trellis topo` prints.
#include <nlohmann/json.hpp>

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
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelShape, layers, heads, kv_heads)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankPlacement, rank, stage, tp, host, device, numa, cores, nic)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GroupLink, link_class, bandwidth)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Placement, pp, tp, model, kind, nvlink_disabled, ranks,
                                   tp_groups, boundaries, notes)

namespace {

template <typename T>
T parse_as(std::string_view text, std::string_view what) {
  try {
    return nlohmann::json::parse(text).get<T>();
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
