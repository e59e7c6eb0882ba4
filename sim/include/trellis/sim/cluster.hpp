// What the planner needs from a topology::Topology: one device type from the catalog, the
// link between any two devices of a host, and each host's share of the fabric. Built from
// the Topology value (synthetic spec, XML files or live discovery — the topology layer's
// three sources), then used to derive the links of any (replicas, p, t) layout with the
// same policy as topology::place(): ranks fill hosts in order, stage after stage, so a TP
// group stays inside a host when t divides the devices per host and stage boundaries cross
// hosts only where the grid wraps onto the next host.
//
// Hosts are assumed alike (host 0 stands for all; a different host adds a warning).
// Pure values; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "trellis/sim/calibration.hpp"
#include "trellis/sim/catalog.hpp"
#include "trellis/sim/cost_model.hpp"
#include "trellis/topology/topology.hpp"

namespace trellis::sim {

struct ClusterView {
  std::string description;      // "2 hosts x 8 H100-SXM, nvlink, rdma 8 x 50.0 GB/s"
  int hosts = 1;
  int devices_per_host = 1;     // ranks per host (GPUs, or NUMA nodes for CPU hosts)
  DeviceSpec device;            // per rank (a CPU host's figures divided among its ranks)
  // Link between ranks a and b of one host (indexed [a * devices_per_host + b]).
  std::vector<LinkCost> intra;
  LinkCost inter;               // one fabric port between hosts
  double host_fabric_bandwidth = 0;  // all of a host's fabric ports together, bytes/s
  double host_link_bandwidth = 0;    // device <-> host (PCIe) cap on a rank's fabric share
  std::vector<std::string> warnings;
  // Measured all-reduces from the calibration, by (link class, ranks).
  std::vector<std::pair<std::pair<LinkKind, int>, std::pair<double, double>>> allreduce_fits;  // alpha, bus bw
  std::vector<std::string> allreduce_algorithms;  // parallel to allreduce_fits
  // Parallel to allreduce_fits: the measured time by size (Calibration::allreduce_curve).
  std::vector<std::vector<std::pair<double, double>>> allreduce_curves;

  // An NVLink domain spanning hosts (GB200 NVL72: 18 trays of 4 GPUs, one domain of 72):
  // ranks per domain, 0 when every host is its own domain. Two ranks of one domain on
  // different hosts talk over `domain_link`; only ranks of different domains use the fabric.
  int nvlink_domain = 0;
  LinkCost domain_link;

  int ranks() const { return hosts * devices_per_host; }
  // Ranks that reach each other without the fabric: the NVLink domain, else the host.
  int domain_ranks() const { return nvlink_domain > devices_per_host ? nvlink_domain : devices_per_host; }
  // "host" or "NVLink domain": what a TP group spanning the fabric spans.
  const char* domain_word() const { return nvlink_domain > devices_per_host ? "NVLink domain" : "host"; }
};

// Makes every `ranks` consecutive ranks (whole hosts) one NVLink domain, as a GB200 NVL72
// rack (`ranks` = 72 over 18 trays of 4). `ranks` must be a multiple of the devices per host
// and divide the cluster's ranks; throws kInvalidArgument with the numbers otherwise. The
// domain link is the catalog's `nvl72` for NVLink-5 devices, else the device's own NVLink
// generation (a calibration's nvlink figures replace either).
void set_nvlink_domain(ClusterView& c, int ranks, const Calibration* calibration = nullptr);

// Builds the view. `device_override` (a catalog name) replaces the device model the
// topology reports; without it an unknown model throws kNotFound listing the catalog.
// `calibration` (may be null) replaces catalog alpha/bandwidth per link class.
// `cpu_ranks_per_host` (CPU hosts only; 0 = one rank per NUMA node, as placement does)
// splits each host's compute, bandwidth and memory among that many ranks.
ClusterView make_cluster_view(const topology::Topology& topo, const std::string& device_override = {},
                              const Calibration* calibration = nullptr, int cpu_ranks_per_host = 0);

// Links of one replica's p x t grid placed from rank `first_rank` on (replicas are packed
// one after another). The worst TP group and each stage boundary's slowest pair. With an
// NVLink domain, `tp.hosts` counts the domains a TP group spans and a boundary "crosses a
// host" when it crosses the fabric.
LayoutLinks layout_links(const ClusterView& c, int p, int t, int first_rank = 0);

// Links of the expert-parallel group of a layout whose replicas are p x t grids packed one
// after another (as layout_links places them): stage s of `ep / t` neighbouring replicas,
// the worst stage (fewest ranks of the group sharing a host or NVLink domain). ep must be a
// multiple of t; ep <= 1 gives a group of one rank.
EpLinks ep_links(const ClusterView& c, int p, int t, int ep);

// The catalog device a topology model string names ("NVIDIA H100 80GB HBM3" -> H100-SXM),
// or nullptr when none matches.
const DeviceSpec* match_device_model(const std::string& model);

}  // namespace trellis::sim
