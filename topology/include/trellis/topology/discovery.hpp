// The three sources of a Topology: live discovery (hwloc + NVML via dlopen), hwloc XML
// files, and synthetic specs. Each returns hosts or a whole Topology; none needs MPI.
// Gathering across ranks goes through an AllgatherFn supplied by the caller (the launcher
// adapts its MPI bootstrap), so topology/ never depends on transport/.
//
// Errors: trellis::Error naming the input — the XML file and what hwloc said
// (kNotFound / kCorruptInput), the synthetic token that does not parse (kInvalidArgument).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/topology/topology.hpp"

namespace trellis::topology {

struct DiscoverOptions {
  bool use_nvml = true;   // try libnvidia-ml.so.1 with dlopen for NVLink; absence is a note
  bool use_ucx = false;   // add the network devices UCX lists that hwloc did not show
};

// This host, discovered live with hwloc (I/O filter keeps PCI and OS devices). Fills
// hostname and boot id from the OS. Never throws for missing NVML; throws
// Error{kInternal} only when hwloc itself cannot load the machine.
Host discover_local_host(const DiscoverOptions& options = {});

// The NVLink step of discover_local_host(), on its own: adds the NVLink pairs (direct or
// through NVSwitch, and to the CPU) that NVML, loaded with dlopen("libnvidia-ml.so.1"),
// reports between `host`'s devices, matched by PCI bus id. Without a loadable NVML it adds a
// note to host.notes and changes nothing else.
void add_nvml_links(Host& host);

// Every rank contributes a string and gets all of them, indexed by rank. The launcher
// adapts its bootstrap (MPI) to this; tests pass a lambda.
using AllgatherFn = std::function<std::vector<std::string>(const std::string& mine)>;

// Builds the whole cluster from per-rank discoveries: every rank serialises its Host and
// pid/binding, all are gathered, ranks are grouped by (hostname, boot id) into hosts in
// order of their lowest rank. Every rank returns the same Topology.
Topology gather_topology(const Host& mine, int my_rank, int pid, std::vector<int> bound_pus,
                         const AllgatherFn& allgather);

// Loads one hwloc XML file (hwloc 2.x format) into a Host. Throws Error naming `path` and
// what hwloc said when it is missing, unreadable or corrupt.
Host load_xml_host(const std::string& path);

// `specs` as given to --topo-file: "F" for one host, "NxF" / "N×F" for N identical hosts.
// Hosts are named after the file ("dgx2-0", ...) unless the file names its host.
Topology load_xml_hosts(const std::vector<std::string>& specs);

// A synthetic cluster from a spec like "hosts=2,gpus=8,gpu=H100-SXM,nvlink=all,nics=8x400g-ib".
// The grammar is synthetic_grammar(); an unknown key or bad value throws
// Error{kInvalidArgument} that quotes the token and its position.
Topology parse_synthetic(std::string_view spec);
// Human-readable grammar (used by `trellis topo --help` and docs/topology.md).
std::string_view synthetic_grammar();

}  // namespace trellis::topology
