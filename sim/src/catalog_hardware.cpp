// Device and link catalog. Bandwidths are per direction and per device port unless the
// note says otherwise; vendors quote NVLink as bidirectional totals, so those figures are
// halved here. Alpha values are not on any datasheet: they are typical per-step start-up
// latencies (kernel launch + protocol handshake) and are marked "assumed"; a calibration
// file (calibration.hpp) replaces them with measurements.
#include <algorithm>
#include <array>

#include "catalog_lookup.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/catalog.hpp"
#include "trellis/sim/units.hpp"

namespace trellis::sim {
namespace {

const std::vector<DeviceSpec>& devices() {
  static const std::vector<DeviceSpec> kDevices = {
      {"A100-SXM", DeviceKind::kGpu, tflops(312), tflops(624), tflops(19.5), 80 * kGB, gbyte_per_s(2039),
       "nvlink3", "pcie4", us(4),
       "NVIDIA A100 datasheet (80GB SXM4): BF16 312 TFLOP/s dense, 624 sparse; FP32 19.5; HBM2e 2,039 GB/s"},
      {"A100-PCIe", DeviceKind::kGpu, tflops(312), tflops(624), tflops(19.5), 80 * kGB, gbyte_per_s(1935),
       "pcie4", "pcie4", us(4),
       "NVIDIA A100 datasheet (80GB PCIe): BF16 312 dense / 624 sparse; HBM2e 1,935 GB/s; no NVSwitch"},
      {"H100-SXM", DeviceKind::kGpu, tflops(989), tflops(1979), tflops(67), 80 * kGB, gbyte_per_s(3350),
       "nvlink4", "pcie5", us(4),
       "NVIDIA H100 datasheet (SXM5 80GB): BF16 989 TFLOP/s dense, 1,979 sparse; FP8 1,979 dense, 3,958 sparse; "
       "FP32 67; HBM3 3.35 TB/s",
       tflops(1979)},
      {"H100-PCIe", DeviceKind::kGpu, tflops(756), tflops(1513), tflops(51), 80 * kGB, gbyte_per_s(2000),
       "pcie5", "pcie5", us(4),
       "NVIDIA H100 datasheet (PCIe 80GB): BF16 756 dense / 1,513 sparse; FP8 1,513 dense / 3,026 sparse; FP32 51; "
       "HBM2e 2.0 TB/s; NVLink bridge only pairs GPUs, so the in-host class is PCIe Gen5",
       tflops(1513)},
      {"H200", DeviceKind::kGpu, tflops(989), tflops(1979), tflops(67), 141 * kGB, gbyte_per_s(4800),
       "nvlink4", "pcie5", us(4),
       "NVIDIA H200 datasheet (SXM): BF16 989 dense / 1,979 sparse, FP8 1,979 dense / 3,958 sparse (same die as "
       "H100 SXM); 141 GB HBM3e at 4.8 TB/s",
       tflops(1979)},
      {"B200", DeviceKind::kGpu, tflops(2250), tflops(4500), tflops(80), 180 * kGB, gbyte_per_s(8000),
       "nvlink5", "pcie5", us(4),
       "NVIDIA HGX B200 datasheet per GPU: FP16/BF16 2.25 PFLOP/s dense, 4.5 sparse; FP8 4.5 dense, 9 sparse; "
       "180 GB usable HBM3e (1.44 TB per 8 GPUs) at 8 TB/s; FP32 ~80 TFLOP/s (approximate)",
       tflops(4500)},
      // GB200 NVL72: one rack of 18 compute trays, each 2 Grace CPUs + 4 Blackwell GPUs, all 72
      // GPUs in one NVLink domain through 9 NVLink Switch trays (`1xNVL72` in trellis plan).
      {"GB200", DeviceKind::kGpu, tflops(2500), tflops(5000), tflops(80), 186 * kGB, gbyte_per_s(8000),
       "nvlink5", "pcie5", us(4),
       "NVIDIA GB200 NVL72 product page and datasheet, rack figures / 72 GPUs: FP16/BF16 360 PFLOP/s sparse "
       "(5 per GPU sparse, 2.5 dense), FP8 720 PFLOP/s sparse (10 per GPU sparse, 5 dense); 13.4 TB HBM3e "
       "(186 GB per GPU) at 576 TB/s (8 TB/s per GPU); NVLink 130 TB/s (1.8 TB/s bidirectional per GPU); "
       "FP32 ~80 TFLOP/s per GPU (approximate, as B200)",
       tflops(5000)},
      // H20: the Hopper part for the Chinese market: H100-class memory system and NVLink,
      // compute cut to ~15% of H100 SXM to stay under the export threshold.
      {"H20", DeviceKind::kGpu, tflops(148), 0, tflops(44), 96 * kGB, gbyte_per_s(4000), "nvlink4", "pcie5",
       us(4),
       "NVIDIA HGX H20 specification (partner spec sheets, as reported by SemiAnalysis, Nov 2023): BF16 148 "
       "TFLOP/s and FP8 296 TFLOP/s dense (no sparse figure quoted), FP32 44, TF32 74; 96 GB HBM3 at 4.0 TB/s; "
       "NVLink 900 GB/s bidirectional; PCIe Gen5 x16",
       tflops(296)},
      {"L40S", DeviceKind::kGpu, tflops(362.05), tflops(733), tflops(91.6), 48 * kGB, gbyte_per_s(864),
       "pcie4", "pcie4", us(4),
       "NVIDIA L40S datasheet: BF16 362.05 TFLOP/s dense, 733 sparse; FP8 733 dense, 1,466 sparse; FP32 91.6; "
       "48 GB GDDR6 at 864 GB/s; no NVLink",
       tflops(733)},
      // Older GPUs of the shared hwloc XML files (DGX-2, Lassen, POWER8, the K40m node).
      // They have no bf16: the 16-bit fields hold their fp16 figures.
      {"V100-SXM2", DeviceKind::kGpu, tflops(125), 0, tflops(15.7), 32 * kGB, gbyte_per_s(900), "nvlink2", "pcie3",
       us(5), "NVIDIA V100 datasheet (SXM2): FP16 tensor 125 TFLOP/s (no sparsity support); FP32 15.7; HBM2 900 GB/s"},
      {"V100-SXM3", DeviceKind::kGpu, tflops(125), 0, tflops(15.7), 32 * kGB, gbyte_per_s(900), "nvlink2", "pcie3",
       us(5), "NVIDIA DGX-2 V100 SXM3 32GB: FP16 tensor 125 TFLOP/s; HBM2 900 GB/s; NVSwitch all-to-all"},
      {"P100-SXM2", DeviceKind::kGpu, tflops(21.2), 0, tflops(10.6), 16 * kGB, gbyte_per_s(732), "nvlink1", "pcie3",
       us(6), "NVIDIA Tesla P100 SXM2 datasheet: FP16 21.2 TFLOP/s (no tensor cores); FP32 10.6; HBM2 732 GB/s"},
      {"K40m", DeviceKind::kGpu, tflops(4.29), 0, tflops(4.29), 12 * kGB, gbyte_per_s(288), "pcie3", "pcie3", us(8),
       "NVIDIA Tesla K40 datasheet: FP32 4.29 TFLOP/s at boost, no fast 16-bit path (16-bit field = FP32); "
       "GDDR5 288 GB/s; 12 GB"},
      // A CPU host runs the f32 CPU path of trellis. The numbers describe a typical 2-socket
      // server and are assumptions; calibrate with `trellis bench` for a real one.
      {"cpu", DeviceKind::kCpu, tflops(2.0), 0, tflops(2.0), 256 * kGiB, gbyte_per_s(200), "shm", "shm", us(1),
       "assumed: 2 sockets x 32 cores x 2.0 GHz x 32 f32 FLOP/cycle (AVX-512, 2 FMA units) ~ 4 TFLOP/s peak, "
       "halved for sustained GEMM; 16 DDR5 channels ~ 200 GB/s sustained; 256 GiB RAM. No sparse figure"},
  };
  return kDevices;
}

const std::vector<LinkSpec>& links() {
  static const std::vector<LinkSpec> kLinks = {
      {"same-process", LinkKind::kSameProcess, gbyte_per_s(20), us(0.2),
       "assumed: one memcpy in a shared address space (~20 GB/s), no protocol"},
      {"shm", LinkKind::kSharedMemory, gbyte_per_s(10), us(1),
       "assumed: two copies through a shared-memory segment (~10 GB/s per direction), ~1 us per handshake"},
      {"nvlink3", LinkKind::kNvlink, gbyte_per_s(300), us(3),
       "A100: 12 NVLink3 links x 50 GB/s = 600 GB/s bidirectional per GPU through NVSwitch; alpha assumed"},
      {"nvlink4", LinkKind::kNvlink, gbyte_per_s(450), us(3),
       "H100/H200 SXM: 18 NVLink4 links = 900 GB/s bidirectional per GPU through NVSwitch; alpha assumed"},
      {"nvlink5", LinkKind::kNvlink, gbyte_per_s(900), us(3),
       "B200/GB200: NVLink5 1.8 TB/s bidirectional per GPU; alpha assumed"},
      {"nvl72", LinkKind::kNvlink, gbyte_per_s(900), us(4),
       "GB200 NVL72 NVLink Switch domain: 72 GPUs on 18 trays, each GPU 1.8 TB/s bidirectional into 9 NVLink "
       "Switch trays (130 TB/s per rack), the same rate to a GPU on another tray as on its own; alpha assumed "
       "(one more switch hop than in an HGX box)"},
      {"nvlink1", LinkKind::kNvlink, gbyte_per_s(80), us(4),
       "P100: 4 NVLink1 links x 20 GB/s per direction per GPU; alpha assumed"},
      {"nvlink2", LinkKind::kNvlink, gbyte_per_s(150), us(4),
       "V100: 6 NVLink2 links x 25 GB/s per direction per GPU (300 GB/s bidirectional); alpha assumed"},
      {"pcie3", LinkKind::kPcie, gbyte_per_s(15.75), us(6),
       "PCIe Gen3 x16: 8 GT/s x 16 lanes, 128b/130b ~ 15.75 GB/s per direction; alpha assumed"},
      {"pcie4", LinkKind::kPcie, gbyte_per_s(32), us(5),
       "PCIe Gen4 x16: 16 GT/s x 16 lanes, 128b/130b ~ 31.5 GB/s per direction; alpha assumed"},
      {"pcie5", LinkKind::kPcie, gbyte_per_s(63), us(5),
       "PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b ~ 63 GB/s per direction; alpha assumed"},
      {"ib-hdr", LinkKind::kRdma, gbit_per_s(200), us(6),
       "InfiniBand HDR: 200 Gbit/s per port (ConnectX-6); alpha assumed (NCCL-over-IB step)"},
      {"ib-ndr", LinkKind::kRdma, gbit_per_s(400), us(6),
       "InfiniBand NDR: 400 Gbit/s per port (ConnectX-7); alpha assumed"},
      {"roce-100", LinkKind::kRdma, gbit_per_s(100), us(8), "RoCE v2 100 GbE per port; alpha assumed"},
      {"roce-200", LinkKind::kRdma, gbit_per_s(200), us(8), "RoCE v2 200 GbE per port; alpha assumed"},
      {"roce-400", LinkKind::kRdma, gbit_per_s(400), us(8),
       "RoCE v2 400 GbE per port (ConnectX-7 / BlueField-3, Spectrum-X; the usual H20 and GB200 Ethernet "
       "fabric); alpha assumed"},
      {"tcp-1g", LinkKind::kTcp, gbit_per_s(1), us(30), "TCP over 1 GbE; alpha assumed"},
      {"tcp-10g", LinkKind::kTcp, gbit_per_s(10), us(30),
       "TCP over 10 GbE; alpha assumed (kernel stack, two syscalls per message)"},
      {"tcp-25g", LinkKind::kTcp, gbit_per_s(25), us(30), "TCP over 25 GbE; alpha assumed"},
      {"tcp-100g", LinkKind::kTcp, gbit_per_s(100), us(30), "TCP over 100 GbE; alpha assumed"},
  };
  return kLinks;
}

}  // namespace

std::string_view to_string(LinkKind k) {
  switch (k) {
    case LinkKind::kSameProcess: return "same-process";
    case LinkKind::kSharedMemory: return "shm";
    case LinkKind::kNvlink: return "nvlink";
    case LinkKind::kPcie: return "pcie";
    case LinkKind::kRdma: return "rdma";
    case LinkKind::kTcp: return "tcp";
  }
  return "?";
}

std::span<const DeviceSpec> device_catalog() { return devices(); }
std::span<const LinkSpec> link_catalog() { return links(); }

const DeviceSpec& find_device(std::string_view name) {
  static const std::array<std::pair<std::string_view, std::string_view>, 6> kAliases = {{
      {"h100", "H100-SXM"}, {"a100", "A100-SXM"}, {"h200-sxm", "H200"},
      {"h100-sxm5", "H100-SXM"}, {"a100-sxm4", "A100-SXM"}, {"host", "cpu"}}};
  const std::string key = detail::catalog_key(name);
  for (const auto& [alias, target] : kAliases)
    if (key == alias) return find_device(target);
  for (const auto& d : devices())
    if (detail::catalog_key(d.name) == key) return d;
  throw_error(ErrorCode::kNotFound, "unknown device '{}'; valid devices: {}", name, device_names());
}

std::string fp8_device_names() {
  std::string out;
  for (const auto& d : devices())
    if (d.has_fp8()) out += (out.empty() ? "" : ", ") + d.name;
  return out;
}

const LinkSpec& find_link(std::string_view name) {
  const std::string key = detail::catalog_key(name);
  for (const auto& l : links())
    if (detail::catalog_key(l.name) == key) return l;
  throw_error(ErrorCode::kNotFound, "unknown link '{}'; valid links: {}", name, link_names());
}

std::string device_names() {
  std::string out;
  for (const auto& d : devices()) out += (out.empty() ? "" : ", ") + d.name;
  return out;
}

std::string link_names() {
  std::string out;
  for (const auto& l : links()) out += (out.empty() ? "" : ", ") + l.name;
  return out;
}

}  // namespace trellis::sim
