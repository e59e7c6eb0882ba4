// Private: turning a loaded hwloc topology (live or from XML) into a Host, and the NVML
// probe used by live discovery. Not part of the public API.
#pragma once

#include <hwloc.h>

#include <chrono>
#include <string>

#include "trellis/topology/topology.hpp"

namespace trellis::topology::detail {

// Reads hosts, NUMA nodes, cores, GPUs, NICs, PCIe paths and the "NVLinkBandwidth"
// distances (when hwloc has them) from `topo`. `source` is stored as Host::source.
Host host_from_hwloc(hwloc_topology_t topo, const std::string& source);

// An hwloc XML document to read, from a file or from memory, and how to name it.
struct XmlSource {
  std::string path;    // the file; empty: `buffer` holds the XML
  std::string buffer;  // the XML text when path is empty
  std::string what;    // for messages: "topology file 'F'"
  std::string hint;    // appended when hwloc refuses the document (why it may have)
  std::string source;  // Host::source of the result
  std::chrono::milliseconds deadline{30000};
};

// Reads `src` with hwloc and host_from_hwloc in a forked child (hwloc_xml.cpp): hwloc 2.9
// crashes on some malformed XML. kCorruptInput naming src.what when hwloc refuses, crashes or
// takes longer than the deadline; kInternal when trellis's own reader crashes; otherwise the
// error the reader threw, with its code.
Host host_from_xml_isolated(const XmlSource& src);

// Opens a topology with the I/O filter that keeps PCI devices, bridges and OS devices.
// Throws Error{kInternal} if hwloc cannot even initialise.
hwloc_topology_t open_hwloc_topology();

// Adds NVLink pairs (and NVLinks to the CPU) found through NVML loaded with dlopen. When
// libnvidia-ml cannot be loaded or fails, adds a note to host.notes and changes nothing
// else. Devices are matched by PCI bus id.
void add_nvml_links(Host& host);

// Fills the bandwidth of RDMA NICs from /sys/class/infiniband/<name>/ports/*/rate and of
// Ethernet NICs from /sys/class/net/<name>/speed (live discovery only); adds a note when
// nothing can be read.
void add_sysfs_rates(Host& host);

// Adds the network devices UCX lists (uct resources of type net) that hwloc did not
// report, and a note with the counts. Never throws.
void add_ucx_devices(Host& host);

// Nominal port rate (bytes/s) of a NIC model by PCI vendor:device id; 0 when unknown.
double nominal_nic_rate(unsigned vendor, unsigned device);

}  // namespace trellis::topology::detail
