// UCX's view of the network devices (uct resources of type "net"), added to hwloc's list:
// UCX sees what its transports would use, including RDMA ports and interfaces hwloc does
// not show as PCI functions. Only names, kinds and presence are taken; rates stay hwloc's
// and sysfs's.
#include <uct/api/uct.h>

#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "hwloc_reader.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::topology::detail {
namespace {

// dev name -> kind, for every uct "net" resource of one memory domain.
void collect(uct_component_h component, const char* md_name, std::map<std::string, NicKind>& out) {
  uct_md_config_t* config = nullptr;
  if (uct_md_config_read(component, nullptr, nullptr, &config) != UCS_OK) return;
  uct_md_h md = nullptr;
  const ucs_status_t st = uct_md_open(component, md_name, config, &md);
  uct_config_release(config);
  if (st != UCS_OK) return;
  uct_tl_resource_desc_t* tls = nullptr;
  unsigned n = 0;
  if (uct_md_query_tl_resources(md, &tls, &n) == UCS_OK) {
    for (unsigned i = 0; i < n; ++i) {
      if (tls[i].dev_type != UCT_DEVICE_TYPE_NET) continue;
      std::string dev = tls[i].dev_name;  // "mlx5_0:1" for verbs ports, "eth0" for tcp
      const std::string tl = tls[i].tl_name;
      const bool verbs = starts_with(tl, "rc") || starts_with(tl, "ud") || starts_with(tl, "dc");
      if (auto colon = dev.find(':'); colon != std::string::npos) dev.resize(colon);
      if (dev == "lo") continue;
      auto& kind = out.try_emplace(dev, verbs ? NicKind::kInfiniband : NicKind::kEthernet).first->second;
      if (verbs) kind = NicKind::kInfiniband;
    }
    uct_release_tl_resource_list(tls);
  }
  uct_md_close(md);
}

}  // namespace

void add_ucx_devices(Host& host) {
  uct_component_h* components = nullptr;
  unsigned count = 0;
  if (uct_query_components(&components, &count) != UCS_OK) {
    host.notes.push_back("UCX: uct_query_components failed; its device list was not consulted");
    return;
  }
  std::map<std::string, NicKind> devices;
  for (unsigned c = 0; c < count; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK || attr.md_resource_count == 0) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const auto& md : mds) collect(components[c], md.md_name, devices);
  }
  uct_release_component_list(components);
  int added = 0;
  for (const auto& [name, kind] : devices) {
    bool known = false;
    for (const auto& nic : host.nics) known = known || nic.name == name;
    if (known) continue;
    Nic nic;
    nic.name = name;
    nic.kind = kind;
    nic.gpu_paths.assign(host.devices.size(), PciPath::kSys);
    host.nics.push_back(std::move(nic));
    ++added;
  }
  host.notes.push_back(fmt::format("UCX: {} network device(s) listed, {} not known to hwloc added", devices.size(), added));
}

}  // namespace trellis::topology::detail
