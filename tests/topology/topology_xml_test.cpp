// Every hwloc XML in ../shared/topologies (captured on real machines): what its data says
// about GPUs, NVLink, NICs and NUMA affinity. The expected values were read from the XML
// by hand (see the comments); the tests fail if the reader misses or invents anything.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "trellis/core/error.hpp"
#include "trellis/topology/discovery.hpp"

namespace trellis::topology {
namespace {

std::string shared_file(const std::string& name) {
  const char* root = std::getenv("TRELLIS_SHARED");
  if (!root) return {};
  auto p = std::filesystem::path(root) / "topologies" / name;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

#define LOAD_OR_SKIP(var, name)                                              \
  const std::string var##_path = shared_file(name);                          \
  if (var##_path.empty()) GTEST_SKIP() << name << " not found (TRELLIS_SHARED)"; \
  const Host var = load_xml_host(var##_path)

std::vector<std::string> nic_names(const Host& h, NicKind kind) {
  std::vector<std::string> out;
  for (const auto& n : h.nics)
    if (n.kind == kind) out.push_back(n.name);
  return out;
}

const Nic& nic(const Host& h, const std::string& name) {
  for (const auto& n : h.nics)
    if (n.name == name) return n;
  throw std::runtime_error("no NIC " + name);
}

TEST(TopologyXml, Dgx2SixteenV100AllToAllThroughNvswitch) {
  LOAD_OR_SKIP(h, "hwloc-nvidia-dgx2.xml");
  // 16 CoProc OS devices nvml0..nvml15 (Backend=NVML) under PCI functions 0x0302 10de:1db8.
  ASSERT_EQ(h.devices.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(h.devices[i].name, "nvml" + std::to_string(i));
    EXPECT_EQ(h.devices[i].model, "Tesla V100-SXM3-32GB-H");
    EXPECT_EQ(h.devices[i].memory_bytes, 32ull << 30);  // from the model name (NVML capture)
    EXPECT_EQ(h.devices[i].numa, i < 8 ? 0 : 1) << "GPU " << i;  // buses 34..5e under package 0
  }
  EXPECT_EQ(h.devices[0].pci_bus_id, "0000:34:00.0");
  EXPECT_EQ(h.devices[15].pci_bus_id, "0000:e7:00.0");
  // NVLinkBandwidth: every GPU has 6 x 25000 MB/s to 6 NVSwitch PCI functions.
  auto islands = nvlink_islands(h);
  ASSERT_EQ(islands.size(), 1u);
  EXPECT_EQ(islands[0].size(), 16u);
  ASSERT_EQ(h.links.size(), 16u * 15 / 2);
  for (const auto& l : h.links) {
    EXPECT_EQ(l.link_class, LinkClass::kNvlink);
    EXPECT_TRUE(l.via_nvswitch);
    EXPECT_EQ(l.nvlinks, 6);
    EXPECT_DOUBLE_EQ(l.bandwidth, 150e9);
  }
  // PCIe routes: GPUs 0,1 share one PLX switch; 0,2 two levels of switches; 0,4 separate
  // host bridges on one socket; 0,8 across sockets.
  EXPECT_EQ(h.link(0, 1).pci_path, PciPath::kPix);
  EXPECT_EQ(h.link(0, 2).pci_path, PciPath::kPxb);
  EXPECT_EQ(h.link(0, 4).pci_path, PciPath::kNode);
  EXPECT_EQ(h.link(0, 8).pci_path, PciPath::kSys);
  // pci_link_speed="15.753846" (GB/s, PCIe Gen3 x16) on every GPU: the --no-nvlink fallback.
  EXPECT_NEAR(h.link(0, 8).pci_bandwidth, 15.753846e9, 1e4);
  EXPECT_NEAR(without_nvlink(Topology{{h}, {}, {}, false}).hosts[0].link(0, 8).bandwidth, 15.753846e9, 1e4);
  EXPECT_TRUE(h.nics.empty());  // the capture has NVML objects only, no network devices
  EXPECT_EQ(h.numa_nodes.size(), 2u);
  EXPECT_EQ(h.packages, 2);
}

TEST(TopologyXml, Power8FourP100InTwoNvlinkPairsWithCpuLinks) {
  LOAD_OR_SKIP(h, "hwloc-power8-4gpu-nvlink.xml");
  ASSERT_EQ(h.devices.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h.devices[i].name, "cuda" + std::to_string(i));  // CUDA name preferred over nvml/opencl
    EXPECT_EQ(h.devices[i].model, "Tesla P100-SXM2-16GB");
    EXPECT_EQ(h.devices[i].numa, i < 2 ? 0 : 1);
    // Row "Package": 40000 MB/s to its two GPUs.
    EXPECT_EQ(h.devices[i].host_link, LinkClass::kNvlink);
    EXPECT_DOUBLE_EQ(h.devices[i].host_link_bandwidth, 40e9);
  }
  auto islands = nvlink_islands(h);
  ASSERT_EQ(islands.size(), 2u);
  EXPECT_EQ(islands[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(islands[1], (std::vector<int>{2, 3}));
  EXPECT_EQ(h.link(0, 1).link_class, LinkClass::kNvlink);
  EXPECT_FALSE(h.link(0, 1).via_nvswitch);
  EXPECT_EQ(h.link(0, 1).nvlinks, 2);  // 40000 MB/s of 20 GB/s NVLink 1.0 lanes
  EXPECT_DOUBLE_EQ(h.link(0, 1).bandwidth, 40e9);
  EXPECT_EQ(h.link(2, 3).link_class, LinkClass::kNvlink);
  EXPECT_EQ(h.link(0, 2).link_class, LinkClass::kPcie);
  EXPECT_EQ(h.link(0, 2).pci_path, PciPath::kSys);
  EXPECT_TRUE(h.nics.empty());
}

TEST(TopologyXml, LassenFourV100FourMlx5TwoSockets) {
  LOAD_OR_SKIP(h, "hwloc-lassen-4v100-4mlx5.xml");
  EXPECT_EQ(h.name, "lassen28");
  EXPECT_EQ(h.packages, 2);
  ASSERT_EQ(h.numa_nodes.size(), 2u);
  EXPECT_EQ(h.numa_nodes[0].index, 0);
  EXPECT_EQ(h.numa_nodes[1].index, 8);  // POWER9 numbers the second socket's node 8
  EXPECT_EQ(h.core_count(), 40);
  ASSERT_EQ(h.devices.size(), 4u);
  const int gpu_numa[] = {0, 0, 8, 8};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h.devices[i].model, "Tesla V100-SXM2-16GB");
    EXPECT_EQ(h.devices[i].numa, gpu_numa[i]);
    EXPECT_EQ(h.devices[i].memory_bytes, 16515072ull * 1024);  // CUDAGlobalMemorySize KiB
  }
  // The capture has no NVLinkBandwidth matrix: no NVLink claimed, and the note says why.
  EXPECT_EQ(nvlink_islands(h).size(), 4u);
  bool noted = false;
  for (const auto& n : h.notes) noted = noted || n.find("NVLinkBandwidth") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_EQ(nic_names(h, NicKind::kInfiniband), (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}));
  EXPECT_EQ(nic(h, "mlx5_0").numa, 0);
  EXPECT_EQ(nic(h, "mlx5_1").numa, 0);
  EXPECT_EQ(nic(h, "mlx5_2").numa, 8);
  EXPECT_EQ(nic(h, "mlx5_3").numa, 8);
  EXPECT_EQ(nic(h, "mlx5_0").pci_bus_id, "0003:01:00.0");
  EXPECT_EQ(nic(h, "mlx5_0").gpu_paths.at(0), PciPath::kNode);  // other host bridge, same socket
  EXPECT_EQ(nic(h, "mlx5_0").gpu_paths.at(2), PciPath::kSys);
  EXPECT_EQ(nic_names(h, NicKind::kEthernet), (std::vector<std::string>{"enP5p1s0f0", "enP5p1s0f1"}));
}

TEST(TopologyXml, JurecaA100SeenOnlyAsPciFunctions) {
  LOAD_OR_SKIP(h, "hwloc-jureca-dc-4a100-4mlx5.xml");
  EXPECT_EQ(h.name, "jrc0323");
  EXPECT_EQ(h.numa_nodes.size(), 8u);
  EXPECT_EQ(h.core_count(), 128);
  // 0x0302 [10de:20b0] at 03:00, 44:00, 84:00, c4:00; each behind a NIC's switch.
  ASSERT_EQ(h.devices.size(), 4u);
  const char* bus[] = {"0000:03:00.0", "0000:44:00.0", "0000:84:00.0", "0000:c4:00.0"};
  const int numa[] = {3, 1, 7, 5};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h.devices[i].pci_bus_id, bus[i]);
    EXPECT_EQ(h.devices[i].numa, numa[i]);
    EXPECT_EQ(h.devices[i].model, "A100-SXM4-40GB");
  }
  EXPECT_EQ(nic_names(h, NicKind::kInfiniband), (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}));
  EXPECT_EQ(nic(h, "mlx5_0").numa, 3);
  EXPECT_EQ(nic(h, "mlx5_1").numa, 1);
  EXPECT_EQ(nic(h, "mlx5_2").numa, 7);
  EXPECT_EQ(nic(h, "mlx5_3").numa, 5);
  EXPECT_EQ(nic(h, "mlx5_0").gpu_paths.at(0), PciPath::kPix);
  EXPECT_EQ(nic(h, "mlx5_1").gpu_paths.at(1), PciPath::kPix);
  EXPECT_EQ(nic(h, "mlx5_0").gpu_paths.at(1), PciPath::kSys);
  EXPECT_DOUBLE_EQ(nic(h, "mlx5_0").bandwidth, 200e9 / 8);  // ConnectX-6 (15b3:101b), nominal
}

TEST(TopologyXml, TwoNumaK40mAndOneMlx5) {
  LOAD_OR_SKIP(h, "hwloc-2numa-k40m-mlx5.xml");
  EXPECT_EQ(h.name, "conan");
  EXPECT_EQ(h.numa_nodes.size(), 2u);
  // Only 84:00.0 carries a CUDA OS device (cuda0, "Tesla K40m"); the other NVIDIA
  // functions have none and the AMD OpenCL device is not an NVIDIA GPU.
  ASSERT_EQ(h.devices.size(), 1u);
  EXPECT_EQ(h.devices[0].name, "cuda0");
  EXPECT_EQ(h.devices[0].model, "Tesla K40m");
  EXPECT_EQ(h.devices[0].pci_bus_id, "0000:84:00.0");
  EXPECT_EQ(h.devices[0].numa, 1);
  EXPECT_EQ(nic_names(h, NicKind::kInfiniband), (std::vector<std::string>{"mlx5_0"}));
  EXPECT_EQ(nic(h, "mlx5_0").numa, 1);
  EXPECT_EQ(nic_names(h, NicKind::kEthernet), (std::vector<std::string>{"eth0", "eth1"}));
}

TEST(TopologyXml, EveryFileRoundTripsThroughJson) {
  const char* files[] = {"hwloc-nvidia-dgx2.xml", "hwloc-power8-4gpu-nvlink.xml", "hwloc-lassen-4v100-4mlx5.xml",
                         "hwloc-jureca-dc-4a100-4mlx5.xml", "hwloc-2numa-k40m-mlx5.xml"};
  int loaded = 0;
  for (const char* f : files) {
    const std::string path = shared_file(f);
    if (path.empty()) continue;
    Topology t = load_xml_hosts({path});
    EXPECT_EQ(topology_from_json_text(to_json_text(t)), t) << f;
    EXPECT_FALSE(format_matrix(t.hosts[0]).empty());
    ++loaded;
  }
  if (loaded == 0) GTEST_SKIP() << "no shared topologies";
}

TEST(TopologyXml, CountTimesFileMakesDistinctIdenticalHosts) {
  const std::string path = shared_file("hwloc-lassen-4v100-4mlx5.xml");
  if (path.empty()) GTEST_SKIP();
  for (const std::string spec : {"3x" + path, "3\xC3\x97" + path}) {
    Topology t = load_xml_hosts({spec});
    ASSERT_EQ(t.hosts.size(), 3u) << spec;
    EXPECT_EQ(t.hosts[0].name, "lassen28-0");
    EXPECT_EQ(t.hosts[2].name, "lassen28-2");
    EXPECT_NE(t.hosts[0].boot_id, t.hosts[1].boot_id);
    EXPECT_EQ(t.fabric.link_class, LinkClass::kRdma);
    EXPECT_DOUBLE_EQ(t.fabric.bandwidth, 100e9 / 8);
  }
  const std::string dgx = shared_file("hwloc-nvidia-dgx2.xml");
  if (dgx.empty()) return;
  Topology mixed = load_xml_hosts({path, dgx});
  ASSERT_EQ(mixed.hosts.size(), 2u);
  EXPECT_EQ(mixed.fabric.link_class, LinkClass::kTcp);  // the DGX-2 capture shows no RDMA NIC
}

// --- bad input: each error names the file and what went wrong ---

class BadXml : public testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    auto p = std::filesystem::path(testing::TempDir()) / name;
    std::ofstream(p) << text;
    return p.string();
  }
  static std::string error_of(const std::string& path, ErrorCode* code = nullptr) {
    try {
      load_xml_host(path);
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.what();
    }
    return "no error";
  }
};

TEST_F(BadXml, MissingFileIsNotFound) {
  ErrorCode code{};
  std::string msg = error_of("/nonexistent/topo.xml", &code);
  EXPECT_EQ(code, ErrorCode::kNotFound);
  EXPECT_NE(msg.find("/nonexistent/topo.xml"), std::string::npos) << msg;
}

TEST_F(BadXml, GarbageAndEmptyNameTheFile) {
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"garbage.xml", "this is not xml at all\n"}, {"empty.xml", ""}}) {
    const std::string p = write(name, text);
    ErrorCode code{};
    std::string msg = error_of(p, &code);
    EXPECT_EQ(code, ErrorCode::kCorruptInput) << msg;
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

TEST_F(BadXml, TruncatedCaptureSaysWhatHwlocSaid) {
  const std::string src = shared_file("hwloc-power8-4gpu-nvlink.xml");
  if (src.empty()) GTEST_SKIP();
  std::ifstream in(src);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string p = write("truncated.xml", all.substr(0, all.size() / 2));
  std::string msg = error_of(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("hwloc"), std::string::npos) << msg;
}

TEST_F(BadXml, Version3IsExplained) {
  const std::string src = shared_file("hwloc-power8-4gpu-nvlink.xml");
  if (src.empty()) GTEST_SKIP();
  std::ifstream in(src);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = all.find("<topology version=\"2.0\">");
  ASSERT_NE(at, std::string::npos);
  all.replace(at, 24, "<topology version=\"3.0\">");
  const std::string p = write("v3.xml", all);
  std::string msg = error_of(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("version 3.0"), std::string::npos) << msg;
}

TEST_F(BadXml, BadCountPrefixIsReported) {
  EXPECT_THROW(load_xml_hosts({"0x/nonexistent.xml"}), Error);
  EXPECT_THROW(load_xml_hosts({}), Error);
}

}  // namespace
}  // namespace trellis::topology
