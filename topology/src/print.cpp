// Text forms: a per-host summary, the nvidia-smi-topo-style matrix and the placement grid.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "trellis/core/strings.hpp"
#include "trellis/topology/placement.hpp"

namespace trellis::topology {
namespace {

// {0,1,2,3,8,9} -> "0-3,8-9"
std::string ranges(std::vector<int> v) {
  if (v.empty()) return "-";
  std::sort(v.begin(), v.end());
  std::string out;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + (i == j ? fmt::format("{}", v[i]) : fmt::format("{}-{}", v[i], v[j]));
    i = j + 1;
  }
  return out;
}

std::string gbs(double bytes_per_s) { return bytes_per_s > 0 ? fmt::format("{:.1f} GB/s", bytes_per_s / 1e9) : "?"; }
std::string gbit(double bytes_per_s) { return bytes_per_s > 0 ? fmt::format("{:.0f} Gb/s", bytes_per_s * 8 / 1e9) : "rate ?"; }

std::vector<int> numa_pus(const Host& h, int numa) {
  std::vector<int> pus;
  for (const auto& n : h.numa_nodes)
    if (numa < 0 || n.index == numa)
      for (const auto& c : n.cores) pus.insert(pus.end(), c.pus.begin(), c.pus.end());
  return pus;
}

std::string gpu_cell(const DeviceLink& l) {
  if (l.link_class != LinkClass::kNvlink) return std::string(to_string(l.pci_path));
  const std::string n = l.nvlinks > 0 ? fmt::format("{}", l.nvlinks) : "?";
  return (l.via_nvswitch ? "NVS" : "NV") + n;
}

void describe_host(std::string& out, const Host& h, int index) {
  int pus = 0;
  std::uint64_t mem = 0;
  for (const auto& n : h.numa_nodes) {
    mem += n.memory_bytes;
    for (const auto& c : n.cores) pus += static_cast<int>(c.pus.size());
  }
  out += fmt::format("host {} {} ({}): {} package(s), {} NUMA node(s), {} cores / {} PUs, {}{}\n", index, h.name,
                     h.source, h.packages, h.numa_nodes.size(), h.core_count(), pus, format_bytes(static_cast<double>(mem)),
                     h.cpu_model.empty() ? "" : ", " + h.cpu_model);
  for (const auto& n : h.numa_nodes) {
    std::vector<int> cores;
    for (const auto& c : n.cores) cores.push_back(c.index);
    out += fmt::format("  NUMA {}: package {}, cores {}, PUs {}, {}\n", n.index, n.package, ranges(cores),
                       ranges(numa_pus(h, n.index)), format_bytes(static_cast<double>(n.memory_bytes)));
  }
  for (const auto& d : h.devices)
    out += fmt::format("  GPU{} {:<8} {} {} bus {} NUMA {}{}\n", d.index, d.name, d.model.empty() ? "?" : d.model,
                       d.memory_bytes ? format_bytes(static_cast<double>(d.memory_bytes)) : "mem ?", d.pci_bus_id,
                       d.numa, d.host_link == LinkClass::kNvlink ? ", NVLink to CPU " + gbs(d.host_link_bandwidth) : "");
  for (const auto& n : h.nics)
    out += fmt::format("  NIC {:<10} {:<4} {} bus {} NUMA {}\n", n.name, to_string(n.kind), gbit(n.bandwidth),
                       n.pci_bus_id.empty() ? "-" : n.pci_bus_id, n.numa);
  if (!h.devices.empty()) {
    out += "  NVLink islands:";
    for (const auto& isl : nvlink_islands(h)) {
      std::string bw;
      if (isl.size() > 1) {
        const auto& l = h.link(isl[0], isl[1]);
        bw = fmt::format(" {}{}", gbs(l.bandwidth), l.via_nvswitch ? " via NVSwitch" : "");
      }
      out += fmt::format(" {{{}}}{}", ranges(isl), bw);
    }
    out += "\n";
  }
  for (const auto& note : h.notes) out += fmt::format("  note: {}\n", note);
}

}  // namespace

std::string describe(const Topology& topo) {
  std::string out = fmt::format("{} host(s), {} GPU(s); between hosts: {} ({}){}\n", topo.hosts.size(),
                                topo.device_count(), topo.fabric.description, to_string(topo.fabric.link_class),
                                topo.nvlink_disabled ? "; NVLink treated as absent" : "");
  for (std::size_t i = 0; i < topo.hosts.size(); ++i) describe_host(out, topo.hosts[i], static_cast<int>(i));
  if (!topo.ranks.empty()) {
    out += "ranks:";
    for (const auto& r : topo.ranks)
      out += fmt::format(" {}@{}", r.rank, topo.hosts[static_cast<std::size_t>(r.host)].name);
    out += "\n";
  }
  return out;
}

std::string format_matrix(const Host& h) {
  std::vector<std::string> names;
  for (const auto& d : h.devices) names.push_back(fmt::format("GPU{}", d.index));
  for (std::size_t k = 0; k < h.nics.size(); ++k) names.push_back(fmt::format("NIC{}", k));
  const std::size_t g = h.devices.size(), n = names.size();
  bool cpu_nvlink = false;
  for (const auto& d : h.devices) cpu_nvlink = cpu_nvlink || d.host_link == LinkClass::kNvlink;
  std::size_t aff_width = 14;
  for (const auto& d : h.devices) aff_width = std::max(aff_width, ranges(numa_pus(h, d.numa)).size() + 2);
  for (const auto& nic : h.nics) aff_width = std::max(aff_width, ranges(numa_pus(h, nic.numa)).size() + 2);
  std::string out = fmt::format("{:<7}", "");
  for (const auto& name : names) out += fmt::format("{:<6}", name);
  out += fmt::format("{:<{}}{:<6}{}\n", "CPU Affinity", aff_width, "NUMA", cpu_nvlink ? "CPU link" : "");
  for (std::size_t i = 0; i < n; ++i) {
    out += fmt::format("{:<7}", names[i]);
    for (std::size_t j = 0; j < n; ++j) {
      std::string cell;
      if (i == j) cell = "X";
      else if (i < g && j < g) cell = gpu_cell(h.link(static_cast<int>(i), static_cast<int>(j)));
      else if (i >= g && j < g) cell = std::string(to_string(h.nics[i - g].gpu_paths.at(j)));
      else if (i < g && j >= g) cell = std::string(to_string(h.nics[j - g].gpu_paths.at(i)));
      else {
        const int a = h.nics[i - g].numa, b = h.nics[j - g].numa;
        cell = a < 0 || b < 0 ? "?" : (a == b ? "NODE" : "SYS");
      }
      out += fmt::format("{:<6}", cell);
    }
    const int numa = i < g ? h.devices[i].numa : h.nics[i - g].numa;
    std::string link;
    if (cpu_nvlink && i < g)
      link = h.devices[i].host_link == LinkClass::kNvlink ? "NVLink " + gbs(h.devices[i].host_link_bandwidth) : "PCIe";
    out += fmt::format("{:<{}}{:<6}{}\n", numa < 0 ? "-" : ranges(numa_pus(h, numa)), aff_width,
                       numa < 0 ? "-" : fmt::format("{}", numa), link);
  }
  if (!h.nics.empty()) {
    out += "\nNIC legend:\n";
    for (std::size_t k = 0; k < h.nics.size(); ++k)
      out += fmt::format("  NIC{}: {} ({}, {})\n", k, h.nics[k].name, to_string(h.nics[k].kind), gbit(h.nics[k].bandwidth));
  }
  out += "\nLegend: X = self, NV# = # NVLinks direct, NVS# = # NVLinks through NVSwitch, PIX = one PCIe switch,\n"
         "  PXB = several PCIe switches, PHB = PCIe host bridge, NODE = host bridges of one NUMA node,\n"
         "  SYS = across NUMA nodes (NIC-NIC cells: from NUMA affinity only)\n";
  return out;
}

namespace {
// Why the stages hold the layers they do (nothing to say for one stage or an even split).
std::string split_reason(const Placement& pl) {
  if (pl.pp < 2) return "";
  if (!pl.model.split.empty()) return " (as given)";
  if (pl.model.head_cost > 0)
    return fmt::format(" (balanced: the last stage's LM head costs as much as {:.1f} layers)", pl.model.head_cost);
  return "";
}
}  // namespace

std::string format_placement(const Placement& pl, const Topology& topo) {
  std::string out = fmt::format(
      "placement: p={} x t={} = {} {} ranks; model {} layers, {} heads, {} KV heads; layers per stage {}{}{}\n",
      pl.pp, pl.tp, pl.ranks.size(), to_string(pl.kind), pl.model.layers, pl.model.heads, pl.model.kv_heads,
      fmt::join(pl.layers_per_stage(), "/"), split_reason(pl), pl.nvlink_disabled ? "; NVLink treated as absent" : "");
  out += fmt::format("{:>5} {:>5} {:>3}  {:<16} {:<8} {:>4}  {:<24} {}\n", "rank", "stage", "tp", "host", "device",
                     "numa", "cores (PUs)", "nic");
  for (int s = 0; s < pl.pp; ++s)
    for (int i = 0; i < pl.tp; ++i) {
      const auto& r = pl.ranks[static_cast<std::size_t>(pl.rank_at(s, i))];
      const Host& h = topo.hosts[static_cast<std::size_t>(r.host)];
      std::string dev = r.device >= 0 ? fmt::format("GPU{}", r.device) : "cpu";
      out += fmt::format("{:>5} {:>5} {:>3}  {:<16} {:<8} {:>4}  {:<24} {}\n", r.rank, r.stage, r.tp, h.name, dev,
                         r.numa, ranges(r.cores), r.nic.empty() ? "-" : r.nic);
    }
  out += "TP groups (slowest link inside the group):\n";
  for (int s = 0; s < pl.pp; ++s) {
    std::vector<int> ranks;
    std::set<std::string> hosts;
    for (int i = 0; i < pl.tp; ++i) {
      ranks.push_back(pl.rank_at(s, i));
      hosts.insert(topo.hosts[static_cast<std::size_t>(pl.ranks[static_cast<std::size_t>(ranks.back())].host)].name);
    }
    const auto& g = pl.tp_groups[static_cast<std::size_t>(s)];
    out += fmt::format("  stage {}: ranks {:<16} on {:<20} {} {}\n", s, ranges(ranks), fmt::format("{}", fmt::join(hosts, ",")),
                       to_string(g.link_class), gbs(g.bandwidth));
  }
  if (pl.pp > 1) {
    out += "stage boundaries (slowest of the t links stage s -> s+1):\n";
    for (int s = 0; s + 1 < pl.pp; ++s) {
      const auto& g = pl.boundaries[static_cast<std::size_t>(s)];
      out += fmt::format("  {} -> {}: {} {}\n", s, s + 1, to_string(g.link_class), gbs(g.bandwidth));
    }
  }
  for (const auto& note : pl.notes) out += fmt::format("note: {}\n", note);
  return out;
}

}  // namespace trellis::topology
