// The Topology value: the machines a job runs on — hosts, NUMA nodes and cores, GPUs, NICs,
// the links between GPUs on a host (NVLink, PCIe path classes) and the fabric between hosts.
//
// It is a plain value: copyable, comparable with ==, printable (describe(), format_matrix())
// and serialisable to JSON and back (to_json_text / topology_from_json_text). Three sources
// produce the same value (hwloc's "set the source, then load"):
//   * live discovery on every rank, gathered over any allgather (discovery.hpp);
//   * hwloc XML files captured on real machines (load_xml_hosts, discovery.hpp);
//   * a synthetic spec for clusters nobody here has (parse_synthetic, discovery.hpp).
// Nothing here needs MPI or a GPU; all functions are pure and thread-compatible.
//
// Units: bandwidths are bytes per second (double), memory sizes bytes. Indexes into
// vectors are plain ints; -1 means "unknown" or "none".
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace trellis::topology {

// How two ranks reach each other, fastest first. The enumerator order IS the speed order:
// a < b means a is faster, so the class of a group is the max over its pairs.
enum class LinkClass {
  kSameProcess,   // both ends in one process
  kSharedMemory,  // same host, CPU memory (shared-memory segment)
  kNvlink,        // GPU to GPU over NVLink (direct or through NVSwitch)
  kPcie,          // GPU to GPU peer-to-peer over PCIe (or through host memory)
  kRdma,          // across hosts over InfiniBand or RoCE
  kTcp,           // across hosts over TCP/IP
};
inline constexpr LinkClass kAllLinkClasses[] = {LinkClass::kSameProcess, LinkClass::kSharedMemory,
                                                LinkClass::kNvlink,      LinkClass::kPcie,
                                                LinkClass::kRdma,        LinkClass::kTcp};
// "same-process", "shm", "nvlink", "pcie", "rdma", "tcp".
std::string_view to_string(LinkClass c);
// Accepts the names above (case-insensitive) plus aliases "sameprocess", "self",
// "shared-memory", "sm", "nvl", "pci", "ib", "roce". Throws Error{kInvalidArgument} naming
// the text and the accepted names.
LinkClass parse_link_class(std::string_view text);

// PCIe path between two PCI devices on one host, as NCCL and `nvidia-smi topo -m` name them.
enum class PciPath {
  kSame,  // the same device (matrix diagonal)
  kPix,   // through at most one PCIe bridge (one switch)
  kPxb,   // through several PCIe bridges, without the host bridge
  kPhb,   // through a PCIe host bridge (the CPU's root complex)
  kNode,  // across PCIe host bridges within one NUMA node
  kSys,   // across NUMA nodes (the SMP interconnect)
};
std::string_view to_string(PciPath p);  // "X", "PIX", "PXB", "PHB", "NODE", "SYS"
PciPath parse_pci_path(std::string_view text);

enum class NicKind { kInfiniband, kRoce, kEthernet, kUnknown };
std::string_view to_string(NicKind k);  // "ib", "roce", "eth", "unknown"
NicKind parse_nic_kind(std::string_view text);

struct Core {
  int index = -1;          // OS index of the core
  std::vector<int> pus;    // OS indexes of its hardware threads (what a cpuset binds)
  bool operator==(const Core&) const = default;
};

struct NumaNode {
  int index = -1;          // OS index of the NUMA node
  int package = -1;        // logical index of its package (socket); -1 unknown
  std::uint64_t memory_bytes = 0;
  std::vector<Core> cores;
  bool operator==(const NumaNode&) const = default;
};

// A GPU (or other accelerator) on a host.
struct Device {
  int index = -1;          // position within the host's device list (0..n-1, PCI order)
  std::string name;        // hwloc OS device name ("nvml3", "cuda0", "opencl0d1") or "gpu<i>"
  std::string model;       // "Tesla V100-SXM3-32GB", "A100", "H100-SXM"; "" unknown
  std::string pci_bus_id;  // "0000:34:00.0"; "" unknown
  int numa = -1;           // OS index of the closest NUMA node
  std::uint64_t memory_bytes = 0;
  // The GPU's link to its CPU: kPcie normally; kNvlink on POWER8/9 where GPUs have NVLinks
  // to the CPU package.
  LinkClass host_link = LinkClass::kPcie;
  double host_link_bandwidth = 0;  // bytes/s; 0 unknown
  double pci_bandwidth = 0;        // bytes/s of the GPU's own PCIe link; 0 unknown
  bool operator==(const Device&) const = default;
};

// A network port usable between hosts.
struct Nic {
  std::string name;        // "mlx5_0", "eth0", "ib0"
  NicKind kind = NicKind::kUnknown;
  double bandwidth = 0;    // port speed, bytes/s; 0 unknown
  std::string pci_bus_id;  // "" unknown (or not a PCI device, e.g. a veth)
  int numa = -1;           // OS index of the closest NUMA node; -1 unknown
  // PCIe path from this NIC to each GPU of the host, indexed like Host::devices.
  std::vector<PciPath> gpu_paths;
  bool operator==(const Nic&) const = default;
};

// A pair of GPUs on one host. Every unordered pair appears exactly once, a < b.
struct DeviceLink {
  int a = -1, b = -1;                    // Device::index
  LinkClass link_class = LinkClass::kPcie;  // kNvlink or kPcie
  PciPath pci_path = PciPath::kSys;      // the PCIe route (also known for NVLink pairs)
  int nvlinks = 0;                       // NVLink lanes between them; 0 when unknown/none
  bool via_nvswitch = false;             // NVLink through NVSwitch (all-to-all)
  double bandwidth = 0;                  // bytes/s one direction; 0 unknown
  // Bytes/s of the PCIe route alone (the slower endpoint's PCIe link); 0 unknown. Equals
  // `bandwidth` for PCIe pairs; what an NVLink pair falls back to under without_nvlink().
  double pci_bandwidth = 0;
  bool operator==(const DeviceLink&) const = default;
};

struct Host {
  std::string name;        // hostname
  std::string boot_id;     // /proc/sys/kernel/random/boot_id, or a synthetic stand-in
  std::string source;      // "hwloc", "xml:<path>", "synthetic:<spec>", "json"
  std::string cpu_model;   // "" unknown
  int packages = 0;
  std::vector<NumaNode> numa_nodes;
  std::vector<Device> devices;
  std::vector<Nic> nics;
  std::vector<DeviceLink> links;   // GPU pairs, see DeviceLink
  std::vector<std::string> notes;  // what discovery could not learn ("no NVML: ...")

  int core_count() const;
  // The link between GPUs a and b (a != b, either order); throws kInvalidArgument if absent.
  const DeviceLink& link(int a, int b) const;
  bool operator==(const Host&) const = default;
};

// How hosts reach each other.
struct Fabric {
  LinkClass link_class = LinkClass::kTcp;  // kRdma or kTcp
  double bandwidth = 0;                    // bytes/s per host pair (slowest NIC); 0 unknown
  std::string description;                 // "InfiniBand 100 Gb/s", "TCP over eth0"
  bool operator==(const Fabric&) const = default;
};

// A process of the job (only for discovered topologies; empty for files/synthetic).
struct RankInfo {
  int rank = -1;
  int host = -1;                // index into Topology::hosts
  int pid = 0;
  std::vector<int> bound_pus;   // where the OS lets it run (empty unknown)
  bool operator==(const RankInfo&) const = default;
};

struct Topology {
  std::vector<Host> hosts;
  Fabric fabric;
  std::vector<RankInfo> ranks;   // by MPI rank; empty unless discovered under a launcher
  bool nvlink_disabled = false;  // set by without_nvlink()

  int device_count() const;      // GPUs over all hosts
  bool operator==(const Topology&) const = default;
};

// Connected components of the NVLink graph of a host (each sorted, ordered by first GPU).
// A GPU with no NVLink forms its own island.
std::vector<std::vector<int>> nvlink_islands(const Host& host);

// The same topology with NVLink treated as absent (the interconnect-study setting): every
// NVLink GPU pair becomes its PCIe path (bandwidth = pci_bandwidth), NVLinks to the CPU
// become PCIe (bandwidth = the device's pci_bandwidth), and
// nvlink_disabled is set. Idempotent.
Topology without_nvlink(Topology topology);

// Derives the fabric from the hosts' NICs: kRdma when every host has an InfiniBand or
// RoCE port (bandwidth = the slowest host's fastest such port), else kTcp.
Fabric derive_fabric(const std::vector<Host>& hosts);

// Where a rank runs, as far as link classes are concerned.
struct Endpoint {
  int host = -1;
  int device = -1;  // GPU index on the host, -1 for a CPU rank
  int numa = -1;
  int rank = -1;    // distinct ranks in one process are not modelled; -1 = unknown
  bool operator==(const Endpoint&) const = default;
};
// The class of the link between two endpoints of a topology: kSameProcess for the same
// rank; across hosts the fabric's class; GPU pairs by their DeviceLink; other pairs on one
// host kSharedMemory. `bandwidth` (if not null) receives the link's bytes/s (0 unknown).
LinkClass link_between(const Topology& topo, const Endpoint& a, const Endpoint& b,
                       double* bandwidth = nullptr);

// A one-paragraph-per-host summary (hosts, NUMA, GPUs, NICs, fabric, notes).
std::string describe(const Topology& topo);
// The `nvidia-smi topo -m` style matrix of one host: GPUs and NICs in rows and columns,
// cells NV<n>/NVS (NVSwitch)/PIX/PXB/PHB/NODE/SYS, then CPU and NUMA affinity columns.
std::string format_matrix(const Host& host);
std::ostream& operator<<(std::ostream& os, const Topology& topo);

// JSON text (nlohmann_json inside). from_json throws Error{kCorruptInput} naming `what`
// and the field on malformed input. Round trip: from_json(to_json(t)) == t.
std::string to_json_text(const Topology& topo, int indent = 2);
Topology topology_from_json_text(std::string_view text, std::string_view what = "topology JSON");

}  // namespace trellis::topology
