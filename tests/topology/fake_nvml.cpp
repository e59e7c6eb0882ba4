// A stand-in libnvidia-ml.so.1 for nvml_probe_test: 4 GPUs, GPU0-GPU1 joined by 4 direct
// NVLinks, GPU2 and GPU3 by 6 links each to one NVSwitch, NVLink version 3. Only the entry
// points trellis looks up, with NVML's C signatures (return 0 = NVML_SUCCESS).
#include <cstdio>
#include <cstring>

namespace {
struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_sub_system_id;
  char bus_id[32];
};
int index_of(void* dev) { return static_cast<int>(reinterpret_cast<long>(dev)) - 1; }
void fill(PciInfo* info, unsigned bus) {
  std::memset(info, 0, sizeof(*info));
  info->bus = bus;
  std::snprintf(info->bus_id, sizeof(info->bus_id), "00000000:%02X:00.0", bus);
}
constexpr unsigned kBus[] = {0x10, 0x20, 0x30, 0x40};
}  // namespace

extern "C" {
int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) { *n = 4; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** dev) {
  if (i >= 4) return 2;
  *dev = reinterpret_cast<void*>(static_cast<long>(i) + 1);
  return 0;
}
int nvmlDeviceGetPciInfo_v3(void* dev, PciInfo* info) { fill(info, kBus[index_of(dev)]); return 0; }
int nvmlDeviceGetNvLinkState(void* dev, unsigned link, int* active) {
  const int g = index_of(dev);
  *active = (g < 2 && link < 4) || (g >= 2 && link < 6);
  return 0;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* dev, unsigned, PciInfo* info) {
  const int g = index_of(dev);
  fill(info, g == 0 ? kBus[1] : g == 1 ? kBus[0] : 0x99);  // 0x99: the NVSwitch
  return 0;
}
int nvmlDeviceGetNvLinkVersion(void*, unsigned, unsigned* v) { *v = 3; return 0; }
}
