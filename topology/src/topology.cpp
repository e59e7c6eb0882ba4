// The Topology value's pure functions: names of enums, NVLink islands, the --no-nvlink
// transform, the fabric between hosts and the link class of a pair of ranks.
#include "trellis/topology/topology.hpp"

#include <algorithm>
#include <numeric>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::topology {

std::string_view to_string(LinkClass c) {
  switch (c) {
    case LinkClass::kSameProcess: return "same-process";
    case LinkClass::kSharedMemory: return "shm";
    case LinkClass::kNvlink: return "nvlink";
    case LinkClass::kPcie: return "pcie";
    case LinkClass::kRdma: return "rdma";
    case LinkClass::kTcp: return "tcp";
  }
  return "?";
}

LinkClass parse_link_class(std::string_view text) {
  const std::string t = to_lower(trim(text));
  for (LinkClass c : kAllLinkClasses)
    if (t == to_string(c)) return c;
  if (t == "sameprocess" || t == "self") return LinkClass::kSameProcess;
  if (t == "shared-memory" || t == "sm" || t == "sharedmemory") return LinkClass::kSharedMemory;
  if (t == "nvl") return LinkClass::kNvlink;
  if (t == "pci") return LinkClass::kPcie;
  if (t == "ib" || t == "roce" || t == "infiniband") return LinkClass::kRdma;
  throw_error(ErrorCode::kInvalidArgument,
              "link class '{}' is unknown (use same-process, shm, nvlink, pcie, rdma or tcp)", text);
}

std::string_view to_string(PciPath p) {
  switch (p) {
    case PciPath::kSame: return "X";
    case PciPath::kPix: return "PIX";
    case PciPath::kPxb: return "PXB";
    case PciPath::kPhb: return "PHB";
    case PciPath::kNode: return "NODE";
    case PciPath::kSys: return "SYS";
  }
  return "?";
}

PciPath parse_pci_path(std::string_view text) {
  const std::string t = to_lower(trim(text));
  for (PciPath p : {PciPath::kSame, PciPath::kPix, PciPath::kPxb, PciPath::kPhb, PciPath::kNode,
                    PciPath::kSys})
    if (t == to_lower(to_string(p))) return p;
  throw_error(ErrorCode::kInvalidArgument, "PCIe path '{}' is unknown (use X, PIX, PXB, PHB, NODE or SYS)",
              text);
}

std::string_view to_string(NicKind k) {
  switch (k) {
    case NicKind::kInfiniband: return "ib";
    case NicKind::kRoce: return "roce";
    case NicKind::kEthernet: return "eth";
    case NicKind::kUnknown: return "unknown";
  }
  return "?";
}

NicKind parse_nic_kind(std::string_view text) {
  const std::string t = to_lower(trim(text));
  if (t == "ib" || t == "infiniband") return NicKind::kInfiniband;
  if (t == "roce") return NicKind::kRoce;
  if (t == "eth" || t == "ethernet" || t == "tcp") return NicKind::kEthernet;
  if (t == "unknown") return NicKind::kUnknown;
  throw_error(ErrorCode::kInvalidArgument, "NIC kind '{}' is unknown (use ib, roce, eth)", text);
}

int Host::core_count() const {
  int n = 0;
  for (const auto& numa : numa_nodes) n += static_cast<int>(numa.cores.size());
  return n;
}

const DeviceLink& Host::link(int a, int b) const {
  const int lo = std::min(a, b), hi = std::max(a, b);
  for (const auto& l : links)
    if (l.a == lo && l.b == hi) return l;
  throw_error(ErrorCode::kInvalidArgument, "host {}: no link between GPU {} and GPU {}", name, a, b);
}

int Topology::device_count() const {
  int n = 0;
  for (const auto& h : hosts) n += static_cast<int>(h.devices.size());
  return n;
}

std::vector<std::vector<int>> nvlink_islands(const Host& host) {
  const int n = static_cast<int>(host.devices.size());
  std::vector<int> parent(static_cast<std::size_t>(n));
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (const auto& l : host.links)
    if (l.link_class == LinkClass::kNvlink && l.a >= 0 && l.b >= 0 && l.a < n && l.b < n)
      parent[find(l.a)] = find(l.b);
  std::vector<std::vector<int>> islands;
  std::vector<int> island_of(static_cast<std::size_t>(n), -1);
  for (int d = 0; d < n; ++d) {
    int root = find(d);
    if (island_of[root] < 0) {
      island_of[root] = static_cast<int>(islands.size());
      islands.emplace_back();
    }
    islands[island_of[root]].push_back(d);
  }
  return islands;
}

Topology without_nvlink(Topology topology) {
  for (auto& host : topology.hosts) {
    for (auto& l : host.links) {
      if (l.link_class != LinkClass::kNvlink) continue;
      l.link_class = LinkClass::kPcie;
      l.nvlinks = 0;
      l.via_nvswitch = false;
      l.bandwidth = l.pci_bandwidth;
    }
    for (auto& d : host.devices) {
      if (d.host_link != LinkClass::kNvlink) continue;
      d.host_link = LinkClass::kPcie;
      d.host_link_bandwidth = d.pci_bandwidth;
    }
  }
  topology.nvlink_disabled = true;
  return topology;
}

Fabric derive_fabric(const std::vector<Host>& hosts) {
  Fabric f;
  if (hosts.size() <= 1) {
    f.link_class = LinkClass::kTcp;
    f.description = hosts.empty() ? "no hosts" : "single host";
  }
  double slowest_rdma = -1;
  bool all_rdma = !hosts.empty();
  double slowest_eth = -1;
  for (const auto& h : hosts) {
    double best_rdma = -1, best_eth = -1;
    for (const auto& nic : h.nics) {
      if (nic.kind == NicKind::kInfiniband || nic.kind == NicKind::kRoce)
        best_rdma = std::max(best_rdma, nic.bandwidth);
      else
        best_eth = std::max(best_eth, nic.bandwidth);
    }
    if (best_rdma < 0) all_rdma = false;
    else slowest_rdma = slowest_rdma < 0 ? best_rdma : std::min(slowest_rdma, best_rdma);
    if (best_eth >= 0) slowest_eth = slowest_eth < 0 ? best_eth : std::min(slowest_eth, best_eth);
  }
  if (all_rdma) {
    f.link_class = LinkClass::kRdma;
    f.bandwidth = std::max(0.0, slowest_rdma);
    f.description = f.bandwidth > 0 ? fmt::format("RDMA {:.0f} Gb/s", f.bandwidth * 8 / 1e9)
                                    : std::string("RDMA (rate unknown)");
  } else {
    f.link_class = LinkClass::kTcp;
    f.bandwidth = std::max(0.0, slowest_eth);
    if (f.description.empty())
      f.description = f.bandwidth > 0 ? fmt::format("TCP {:.0f} Gb/s", f.bandwidth * 8 / 1e9)
                                      : std::string("TCP (rate unknown)");
  }
  return f;
}

LinkClass link_between(const Topology& topo, const Endpoint& a, const Endpoint& b,
                       double* bandwidth) {
  auto out = [&](LinkClass c, double bw) {
    if (bandwidth) *bandwidth = bw;
    return c;
  };
  if (a.rank >= 0 && a.rank == b.rank) return out(LinkClass::kSameProcess, 0);
  if (a.host != b.host) return out(topo.fabric.link_class, topo.fabric.bandwidth);
  if (a.host < 0 || a.host >= static_cast<int>(topo.hosts.size()))
    throw_error(ErrorCode::kInvalidArgument, "endpoint names host {} but the topology has {} host(s)",
                a.host, topo.hosts.size());
  const Host& h = topo.hosts[static_cast<std::size_t>(a.host)];
  if (a.device >= 0 && b.device >= 0 && a.device != b.device) {
    const DeviceLink& l = h.link(a.device, b.device);
    return out(l.link_class, l.bandwidth);
  }
  return out(LinkClass::kSharedMemory, 0);
}

std::ostream& operator<<(std::ostream& os, const Topology& topo) { return os << describe(topo); }

}  // namespace trellis::topology
