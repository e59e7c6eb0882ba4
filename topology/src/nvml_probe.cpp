// NVML loaded at run time with dlopen, so the same binary runs where there is no NVIDIA
// driver (absence becomes a note, not an error); and NIC rates read from sysfs.
#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "hwloc_reader.hpp"
#include "trellis/core/strings.hpp"

namespace trellis::topology::detail {
namespace {

// The few NVML declarations we need (ABI-stable since NVML 7; copied as types only).
using NvmlDevice = void*;
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_sub_system_id;
  char bus_id[32];
};
constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS in recent drivers

struct Nvml {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, NvmlDevice*) = nullptr;
  int (*pci)(NvmlDevice, NvmlPciInfo*) = nullptr;
  int (*state)(NvmlDevice, unsigned, int*) = nullptr;
  int (*remote)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  int (*version)(NvmlDevice, unsigned, unsigned*) = nullptr;
  ~Nvml() {
    if (lib) {
      if (shutdown) shutdown();
      dlclose(lib);
    }
  }
};

template <typename F>
bool bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

std::string normalise_bus_id(const char* id) {
  // NVML writes "00000000:34:00.0"; hwloc "0000:34:00.0".
  std::string s = to_lower(id);
  auto colon = s.find(':');
  if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
  return s;
}

double nvlink_lane_bandwidth(unsigned version) { return version <= 1 ? 20e9 : 25e9; }

}  // namespace

void add_nvml_links(Host& host) {
  Nvml n;
  n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n.lib) {
    host.notes.push_back("NVML (libnvidia-ml.so.1) not found: no NVLink information");
    return;
  }
  bool ok = bind(n.lib, "nvmlInit_v2", n.init) && bind(n.lib, "nvmlShutdown", n.shutdown) &&
            bind(n.lib, "nvmlDeviceGetCount_v2", n.count) &&
            bind(n.lib, "nvmlDeviceGetHandleByIndex_v2", n.handle) &&
            bind(n.lib, "nvmlDeviceGetPciInfo_v3", n.pci) && bind(n.lib, "nvmlDeviceGetNvLinkState", n.state) &&
            bind(n.lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", n.remote);
  bind(n.lib, "nvmlDeviceGetNvLinkVersion", n.version);
  if (!ok) {
    n.shutdown = nullptr;
    host.notes.push_back("NVML lacks the NVLink functions needed: no NVLink information");
    return;
  }
  if (n.init() != 0) {
    n.shutdown = nullptr;
    host.notes.push_back("nvmlInit failed (no driver or no GPU): no NVLink information");
    return;
  }
  std::map<std::string, int> by_bus;
  for (const auto& d : host.devices) by_bus[d.pci_bus_id] = d.index;
  unsigned count = 0;
  n.count(&count);
  // Links per (gpu, remote) and per GPU to non-GPU remotes (NVSwitch or CPU).
  std::map<std::pair<int, int>, int> direct;
  std::map<int, int> to_switch;
  std::map<int, double> lane;
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice dev = nullptr;
    NvmlPciInfo info{};
    if (n.handle(i, &dev) != 0 || n.pci(dev, &info) != 0) continue;
    auto me = by_bus.find(normalise_bus_id(info.bus_id));
    if (me == by_bus.end()) continue;
    for (unsigned link = 0; link < kMaxLinks; ++link) {
      int active = 0;
      if (n.state(dev, link, &active) != 0 || !active) continue;
      NvmlPciInfo rem{};
      if (n.remote(dev, link, &rem) != 0) continue;
      unsigned v = 2;
      if (n.version) n.version(dev, link, &v);
      lane[me->second] = nvlink_lane_bandwidth(v);
      auto peer = by_bus.find(normalise_bus_id(rem.bus_id));
      if (peer != by_bus.end()) ++direct[{me->second, peer->second}];
      else ++to_switch[me->second];  // NVSwitch (or the CPU on POWER; not told apart here)
    }
  }
  for (auto& l : host.links) {
    const int d = direct.count({l.a, l.b}) ? direct[{l.a, l.b}] : 0;
    const int s = std::min(to_switch.count(l.a) ? to_switch[l.a] : 0, to_switch.count(l.b) ? to_switch[l.b] : 0);
    if (d + s == 0) continue;
    l.link_class = LinkClass::kNvlink;
    l.nvlinks = d + s;
    l.via_nvswitch = s > 0;
    l.bandwidth = (d + s) * (lane.count(l.a) ? lane[l.a] : 25e9);
  }
  host.notes.push_back(fmt::format("NVML: {} GPU(s) queried for NVLink", count));
}

void add_sysfs_rates(Host& host) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto& nic : host.nics) {
    if (nic.kind == NicKind::kInfiniband || nic.kind == NicKind::kRoce) {
      // "100 Gb/sec (4X EDR)"
      std::ifstream in(fmt::format("/sys/class/infiniband/{}/ports/1/rate", nic.name));
      double gbit = 0;
      if (in >> gbit && gbit > 0) nic.bandwidth = gbit * 1e9 / 8;
    } else {
      std::ifstream in(fmt::format("/sys/class/net/{}/speed", nic.name));
      double mbit = 0;
      if (in >> mbit && mbit > 0) nic.bandwidth = mbit * 1e6 / 8;
    }
  }
  // Virtual interfaces (veth on the emulated cluster, bonds, tunnels) are not PCI functions
  // and hwloc does not list them; they are how such hosts reach each other.
  for (const auto& entry : fs::directory_iterator("/sys/class/net", ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "lo" || fs::exists(entry.path() / "device", ec)) continue;
    bool known = false;
    for (const auto& nic : host.nics) known = known || nic.name == name;
    std::ifstream state(entry.path() / "operstate");
    std::string up;
    state >> up;
    if (known || up != "up") continue;  // skip idle helpers such as tc's ifb devices
    Nic nic;
    nic.name = name;
    nic.kind = NicKind::kEthernet;
    nic.gpu_paths.assign(host.devices.size(), PciPath::kSys);
    std::ifstream in(entry.path() / "speed");
    double mbit = 0;
    if (in >> mbit && mbit > 0) nic.bandwidth = mbit * 1e6 / 8;
    host.nics.push_back(std::move(nic));
  }
}

}  // namespace trellis::topology::detail
