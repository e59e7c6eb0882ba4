// From a Topology to link costs. Bandwidths the topology knows (NVLink lanes, NIC port
// speed) win over catalog defaults; alpha always comes from the catalog or the calibration,
// since no topology source measures it.
#include "trellis/sim/cluster.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "catalog_lookup.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/calibration.hpp"

namespace trellis::sim {
namespace {

bool starts_with_nvlink(const std::string& s) { return s.rfind("nvlink", 0) == 0; }

LinkKind kind_of(topology::LinkClass c) { return static_cast<LinkKind>(static_cast<int>(c)); }

// Catalog entry standing for a link class on this device type.
const LinkSpec& default_link(LinkKind k, const DeviceSpec& d) {
  switch (k) {
    case LinkKind::kSameProcess: return find_link("same-process");
    case LinkKind::kSharedMemory: return find_link("shm");
    case LinkKind::kNvlink: return find_link(starts_with_nvlink(d.intra_link) ? d.intra_link : "nvlink4");
    case LinkKind::kPcie: return find_link(d.host_link == "shm" ? "pcie4" : d.host_link);
    case LinkKind::kRdma: return find_link("ib-ndr");
    case LinkKind::kTcp: return find_link("tcp-10g");
  }
  return find_link("tcp-10g");
}

// `roce`: the fabric's NICs are RoCE (Ethernet RDMA), so an RDMA link is named and costed
// as the RoCE entry of its speed rather than the InfiniBand one.
LinkCost make_cost(LinkKind k, double topo_bandwidth, const DeviceSpec& d, const Calibration* cal,
                   bool roce = false) {
  LinkCost c;
  c.kind = k;
  if (const CalibratedLink* m = cal ? cal->link(k) : nullptr) {
    c.name = fmt::format("calibrated:{}", to_string(k));
    c.alpha_s = m->alpha_s;
    c.bandwidth = m->bandwidth > 0 ? m->bandwidth : (topo_bandwidth > 0 ? topo_bandwidth : default_link(k, d).bandwidth);
    c.calibrated = true;
    c.max_calibrated_bytes = m->max_bytes;
    return c;
  }
  const LinkSpec* spec = &default_link(k, d);
  if (k == LinkKind::kRdma && roce) spec = &find_link("roce-400");
  auto family = [&](const LinkSpec& l) { return k != LinkKind::kRdma || (l.name.rfind("roce", 0) == 0) == roce; };
  if ((k == LinkKind::kRdma || k == LinkKind::kTcp) && topo_bandwidth > 0)
    for (const auto& l : link_catalog())  // name the fabric after the port speed it has
      if (l.kind == k && family(l) && std::abs(l.bandwidth - topo_bandwidth) < std::abs(spec->bandwidth - topo_bandwidth))
        spec = &l;
  c.name = spec->name;
  c.alpha_s = spec->alpha_s;
  c.bandwidth = topo_bandwidth > 0 ? topo_bandwidth : spec->bandwidth;
  return c;
}

// A CPU host's catalog figures shared among the ranks placed on it.
DeviceSpec share_cpu(DeviceSpec d, int ranks, double numa_memory) {
  d.dense_flops_bf16 /= ranks;
  d.dense_flops_fp32 /= ranks;
  d.memory_bandwidth /= ranks;
  d.memory_bytes = numa_memory > 0 ? numa_memory : d.memory_bytes / ranks;
  return d;
}

}  // namespace

const DeviceSpec* match_device_model(const std::string& model) {
  const std::string m = detail::catalog_key(model);
  auto has = [&](const char* s) { return m.find(s) != std::string::npos; };
  const char* key = nullptr;
  if (has("h200")) key = "H200";
  else if (has("gb200")) key = "GB200";
  else if (has("b200")) key = "B200";
  else if (has("h20")) key = "H20";
  else if (has("l40s")) key = "L40S";
  else if (has("h100")) key = has("pcie") ? "H100-PCIe" : "H100-SXM";
  else if (has("a100")) key = has("pcie") ? "A100-PCIe" : "A100-SXM";
  else if (has("v100")) key = has("sxm3") ? "V100-SXM3" : "V100-SXM2";
  else if (has("p100")) key = "P100-SXM2";
  else if (has("k40")) key = "K40m";
  else if (m == "cpu") key = "cpu";
  return key ? &find_device(key) : nullptr;
}

ClusterView make_cluster_view(const topology::Topology& topo, const std::string& device_override,
                              const Calibration* cal, int cpu_ranks_per_host) {
  if (topo.hosts.empty()) throw_error(ErrorCode::kInvalidArgument, "the cluster has no hosts");
  const topology::Host& h0 = topo.hosts.front();
  ClusterView c;
  c.hosts = static_cast<int>(topo.hosts.size());
  const bool gpus = !h0.devices.empty();
  if (!device_override.empty()) {
    c.device = find_device(device_override);
  } else if (gpus) {
    const DeviceSpec* d = match_device_model(h0.devices.front().model);
    if (!d)
      throw_error(ErrorCode::kNotFound, "GPU model '{}' of host {} is not in the catalog; pass --gpu with one of: {}",
                  h0.devices.front().model, h0.name, device_names());
    c.device = *d;
  } else {
    c.device = find_device("cpu");
  }
  const int numa = std::max<int>(1, static_cast<int>(h0.numa_nodes.size()));
  const int n = gpus ? static_cast<int>(h0.devices.size()) : (cpu_ranks_per_host > 0 ? cpu_ranks_per_host : numa);
  c.devices_per_host = n;
  if (!gpus) {
    double host_memory = 0;
    for (const auto& nn : h0.numa_nodes) host_memory += static_cast<double>(nn.memory_bytes);
    c.device = share_cpu(c.device, n, host_memory / n);
  }
  else if (h0.devices.front().memory_bytes > 0 && device_override.empty())
    c.device.memory_bytes = static_cast<double>(h0.devices.front().memory_bytes);
  // In-host matrix: GPU pairs from the host's links; CPU ranks talk over shared memory.
  c.intra.assign(static_cast<std::size_t>(n * n), make_cost(LinkKind::kSameProcess, 0, c.device, cal));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) c.intra[static_cast<std::size_t>(a * n + b)] = make_cost(
          gpus ? LinkKind::kPcie : LinkKind::kSharedMemory, 0, c.device, cal);
  for (const auto& l : h0.links) {
    if (l.a < 0 || l.b < 0 || l.a >= n || l.b >= n) continue;
    const LinkCost cost = make_cost(kind_of(l.link_class), l.bandwidth, c.device, cal);
    c.intra[static_cast<std::size_t>(l.a * n + l.b)] = cost;
    c.intra[static_cast<std::size_t>(l.b * n + l.a)] = cost;
  }
  // Fabric: one port's figures, and the host's ports together.
  double ports = 0, port_bw = 0;
  int roce_ports = 0;
  for (const auto& nic : h0.nics)
    if (nic.bandwidth > 0 && (topo.fabric.link_class == topology::LinkClass::kTcp ||
                              nic.kind != topology::NicKind::kEthernet)) {
      ports += 1;
      port_bw = std::max(port_bw, nic.bandwidth);
      roce_ports += nic.kind == topology::NicKind::kRoce;
    }
  if (topo.fabric.bandwidth > 0) port_bw = std::min(port_bw > 0 ? port_bw : topo.fabric.bandwidth, topo.fabric.bandwidth);
  c.inter = make_cost(kind_of(topo.fabric.link_class), port_bw, c.device, cal, roce_ports > 0 && roce_ports == ports);
  c.host_fabric_bandwidth = c.inter.calibrated ? c.inter.bandwidth : c.inter.bandwidth * std::max(1.0, ports);
  c.host_link_bandwidth = gpus && h0.devices.front().host_link_bandwidth > 0 ? h0.devices.front().host_link_bandwidth
                                                                            : default_link(LinkKind::kPcie, c.device).bandwidth;
  for (const auto& h : topo.hosts)
    if (h.devices.size() != h0.devices.size() || h.nics.size() != h0.nics.size()) {
      c.warnings.push_back(fmt::format("hosts differ ({} vs {}); every host is modelled as {}", h.name, h0.name, h0.name));
      break;
    }
  if (cal)
    for (const auto& [key, fit] : cal->allreduce_fits()) {
      c.allreduce_fits.push_back({key, {fit.alpha_s, fit.bus_bandwidth}});
      c.allreduce_algorithms.push_back(fit.algorithm);
      c.allreduce_curves.push_back(cal->allreduce_curve(key.first, key.second));
    }
  std::set<std::string> classes;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) classes.insert(c.intra[static_cast<std::size_t>(a * n + b)].name);
  if (classes.empty()) classes.insert("-");
  c.description = fmt::format("{} host(s) x {} {}, in-host {}, fabric {} ({} port(s) x {:.1f} GB/s)", c.hosts, n,
                              c.device.name, fmt::join(classes, "/"), c.inter.name, ports, c.inter.bandwidth / 1e9);
  return c;
}

void set_nvlink_domain(ClusterView& c, int ranks, const Calibration* cal) {
  if (ranks <= 0 || ranks % c.devices_per_host != 0 || c.ranks() % ranks != 0)
    throw_error(ErrorCode::kInvalidArgument,
                "nvlink-domain={}: must be a multiple of the {} devices per host and divide the cluster's {} "
                "devices (e.g. 72 for GB200 NVL72 racks of 18 trays x 4)",
                ranks, c.devices_per_host, c.ranks());
  c.nvlink_domain = ranks;
  const LinkSpec& spec = find_link(c.device.intra_link == "nvlink5" ? "nvl72"
                                   : starts_with_nvlink(c.device.intra_link) ? c.device.intra_link
                                                                             : "nvlink4");
  c.domain_link = make_cost(LinkKind::kNvlink, 0, c.device, cal);
  if (!c.domain_link.calibrated) {
    c.domain_link.name = spec.name;
    c.domain_link.alpha_s = spec.alpha_s;
    c.domain_link.bandwidth = spec.bandwidth;
  }
  c.description += fmt::format(", NVLink domains of {} GPUs ({} hosts each) over {}", ranks,
                               ranks / c.devices_per_host, c.domain_link.name);
}

LayoutLinks layout_links(const ClusterView& c, int p, int t, int first_rank) {
  const int dph = c.devices_per_host;
  const int unit = c.domain_ranks();  // ranks that reach each other without the fabric
  auto host_of = [&](int r) { return (first_rank + r) / unit; };
  auto local_of = [&](int r) { return (first_rank + r) % dph; };
  auto same_host = [&](int a, int b) { return (first_rank + a) / dph == (first_rank + b) / dph; };
  // In one domain: the host's own link matrix, or the domain's switch between hosts.
  auto near_link = [&](int a, int b) -> const LinkCost& {
    return same_host(a, b) ? c.intra[static_cast<std::size_t>(local_of(a) * dph + local_of(b))] : c.domain_link;
  };
  auto slower = [](const LinkCost& a, const LinkCost& b) {
    if (a.kind != b.kind) return a.kind > b.kind ? a : b;
    return a.bandwidth < b.bandwidth ? a : b;
  };
  // Every concurrently active rank of a host shares its fabric ports.
  auto fabric_share = [&](int concurrent) {
    LinkCost l = c.inter;
    l.bandwidth = std::min({c.inter.bandwidth, c.host_fabric_bandwidth / std::max(1, concurrent),
                            c.host_link_bandwidth});
    return l;
  };
  LayoutLinks out;
  out.tp.ranks = t;
  out.tp.intra = c.intra.empty() ? LinkCost{} : c.intra[0];
  bool first = true;
  for (int s = 0; s < p; ++s) {
    std::set<int> hosts;
    for (int j = 0; j < t; ++j) hosts.insert(host_of(s * t + j));
    out.tp.hosts = std::max(out.tp.hosts, static_cast<int>(hosts.size()));
    // The slowest in-host pair of this group (pairs on different hosts go over the fabric).
    for (int a = 0; a < t && t > 1; ++a) {
      const int ra = s * t + a, rb = s * t + (a + 1) % t;
      if (host_of(ra) != host_of(rb)) continue;
      const LinkCost& l = near_link(ra, rb);
      out.tp.intra = first ? l : slower(out.tp.intra, l);
      first = false;
    }
  }
  out.tp.inter = fabric_share(dph);
  const LinkKind group_kind = out.tp.hosts > 1 ? c.inter.kind : out.tp.intra.kind;
  for (std::size_t i = 0; i < c.allreduce_fits.size(); ++i)
    if (c.allreduce_fits[i].first == std::make_pair(group_kind, t)) {
      out.tp.measured_alpha_s = c.allreduce_fits[i].second.first;
      out.tp.measured_bus_bandwidth = c.allreduce_fits[i].second.second;
      out.tp.measured_algorithm = c.allreduce_algorithms[i];
      if (i < c.allreduce_curves.size()) out.tp.measured_curve = c.allreduce_curves[i];
    }
  for (int s = 0; s + 1 < p; ++s) {
    LinkCost worst;
    bool crosses = false, have = false;
    int crossing = 0;
    for (int j = 0; j < t; ++j) crossing += host_of(s * t + j) != host_of((s + 1) * t + j);
    for (int j = 0; j < t; ++j) {
      const int a = s * t + j, b = (s + 1) * t + j;
      LinkCost l = host_of(a) != host_of(b) ? fabric_share(std::min(crossing, dph)) : near_link(a, b);
      crosses = crosses || host_of(a) != host_of(b);
      worst = have ? slower(worst, l) : l;
      have = true;
    }
    out.boundaries.push_back(worst);
    out.boundary_crosses_host.push_back(crosses);
  }
  return out;
}

EpLinks ep_links(const ClusterView& c, int p, int t, int ep) {
  EpLinks out;
  if (ep <= 1 || t < 1 || ep % t != 0) return out;
  const int dph = c.devices_per_host, unit = c.domain_ranks(), a = ep / t;
  out.ranks = ep;
  out.per_domain = ep;
  out.intra = c.intra.empty() ? LinkCost{} : c.intra[0];
  // Every rank of a host takes part in the all-to-all at once: each gets its share of the NICs.
  out.inter = c.inter;
  out.inter.bandwidth = std::min({c.inter.bandwidth, c.host_fabric_bandwidth / std::max(1, dph), c.host_link_bandwidth});
  bool first = true;
  for (int s = 0; s < p; ++s) {
    std::map<int, int> per_domain;  // domain -> ranks of the group in it
    std::vector<int> ranks;
    for (int q = 0; q < a; ++q)
      for (int j = 0; j < t; ++j) ranks.push_back(q * p * t + s * t + j);
    for (int r : ranks) ++per_domain[r / unit];
    out.hosts = std::max(out.hosts, static_cast<int>(per_domain.size()));
    for (const auto& [domain, n] : per_domain) out.per_domain = std::min(out.per_domain, n);
    // The slowest link between consecutive members of the group that share a domain.
    for (std::size_t i = 0; i + 1 < ranks.size(); ++i) {
      const int x = ranks[i], y = ranks[i + 1];
      if (x / unit != y / unit || c.intra.empty()) continue;
      const LinkCost& l = x / dph == y / dph ? c.intra[static_cast<std::size_t>((x % dph) * dph + y % dph)]
                                             : c.domain_link;
      if (first || l.kind > out.intra.kind || (l.kind == out.intra.kind && l.bandwidth < out.intra.bandwidth))
        out.intra = l;
      first = false;
    }
  }
  return out;
}

}  // namespace trellis::sim
