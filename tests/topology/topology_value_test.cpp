// The Topology value without any machine: link classes, synthetic specs (and their
// errors), JSON round trips, gathering hosts from ranks through a fake allgather, and live
// discovery of the machine running the test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>

#include "trellis/core/error.hpp"
#include "trellis/topology/discovery.hpp"
#include "trellis/topology/placement.hpp"

namespace trellis::topology {
namespace {

TEST(LinkClassNames, RoundTripAndOrder) {
  for (LinkClass c : kAllLinkClasses) EXPECT_EQ(parse_link_class(to_string(c)), c);
  EXPECT_EQ(parse_link_class("IB"), LinkClass::kRdma);
  EXPECT_EQ(parse_link_class(" NVLink "), LinkClass::kNvlink);
  EXPECT_LT(LinkClass::kSameProcess, LinkClass::kSharedMemory);
  EXPECT_LT(LinkClass::kSharedMemory, LinkClass::kNvlink);
  EXPECT_LT(LinkClass::kNvlink, LinkClass::kPcie);
  EXPECT_LT(LinkClass::kPcie, LinkClass::kRdma);
  EXPECT_LT(LinkClass::kRdma, LinkClass::kTcp);
  try {
    parse_link_class("carrier-pigeon");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("carrier-pigeon"), std::string::npos);
  }
  for (PciPath p : {PciPath::kSame, PciPath::kPix, PciPath::kPxb, PciPath::kPhb, PciPath::kNode, PciPath::kSys})
    EXPECT_EQ(parse_pci_path(to_string(p)), p);
}

TEST(Synthetic, TwoByEightH100) {
  Topology t = parse_synthetic("hosts=2,gpus=8,gpu=H100-SXM,nvlink=all,nics=8x400g-ib");
  ASSERT_EQ(t.hosts.size(), 2u);
  EXPECT_EQ(t.hosts[0].name, "node0");
  EXPECT_EQ(t.hosts[1].name, "node1");
  EXPECT_NE(t.hosts[0].boot_id, t.hosts[1].boot_id);
  EXPECT_EQ(t.device_count(), 16);
  const Host& h = t.hosts[0];
  EXPECT_EQ(h.devices[0].memory_bytes, 80ull << 30);
  EXPECT_EQ(nvlink_islands(h).size(), 1u);
  EXPECT_EQ(h.link(0, 7).nvlinks, 18);
  EXPECT_TRUE(h.link(0, 7).via_nvswitch);
  EXPECT_DOUBLE_EQ(h.link(0, 7).bandwidth, 450e9);
  EXPECT_EQ(h.nics.size(), 8u);
  EXPECT_EQ(h.nics[0].name, "mlx5_0");
  EXPECT_EQ(h.nics[0].kind, NicKind::kInfiniband);
  EXPECT_EQ(h.nics[0].gpu_paths[0], PciPath::kPix);
  EXPECT_EQ(h.nics[0].gpu_paths[7], PciPath::kSys);
  EXPECT_EQ(h.devices[0].numa, 0);
  EXPECT_EQ(h.devices[7].numa, 1);
  EXPECT_EQ(t.fabric.link_class, LinkClass::kRdma);
  EXPECT_DOUBLE_EQ(t.fabric.bandwidth, 50e9);
  EXPECT_EQ(topology_from_json_text(to_json_text(t)), t);
  EXPECT_EQ(parse_synthetic("hosts=2,gpus=8,gpu=H100-SXM,nvlink=all,nics=8x400g-ib"), t);  // deterministic
}

TEST(Synthetic, DefaultsAndVariants) {
  Topology cpu = parse_synthetic("");
  ASSERT_EQ(cpu.hosts.size(), 1u);
  EXPECT_EQ(cpu.hosts[0].devices.size(), 0u);
  EXPECT_EQ(cpu.hosts[0].numa_nodes.size(), 2u);
  EXPECT_EQ(cpu.hosts[0].core_count(), 64);
  Topology pcie = parse_synthetic("gpus=4,gpu=L40S");
  EXPECT_EQ(nvlink_islands(pcie.hosts[0]).size(), 4u);
  EXPECT_EQ(pcie.hosts[0].link(0, 1).pci_path, PciPath::kPix);
  EXPECT_EQ(pcie.hosts[0].link(0, 3).pci_path, PciPath::kSys);
  Topology islands = parse_synthetic("gpus=8,gpu=A100-SXM,nvlink=4");
  EXPECT_EQ(nvlink_islands(islands.hosts[0]).size(), 2u);
  Topology roce = parse_synthetic("hosts=3,nics=2x100g-roce,name=gpu-");
  EXPECT_EQ(roce.hosts[2].name, "gpu-2");
  EXPECT_EQ(roce.fabric.link_class, LinkClass::kRdma);
  EXPECT_EQ(parse_synthetic("hosts=2,nics=0").fabric.link_class, LinkClass::kTcp);
}

std::string synthetic_error(const std::string& spec) {
  try {
    parse_synthetic(spec);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "no error";
}

TEST(Synthetic, ErrorsPointAtTheToken) {
  std::string m = synthetic_error("hosts=2,gpus=x,gpu=H100-SXM");
  EXPECT_NE(m.find("'gpus=x'"), std::string::npos) << m;
  EXPECT_NE(m.find("column 9"), std::string::npos) << m;
  EXPECT_NE(m.find("        ^^^^^^"), std::string::npos) << m;  // caret under the token
  EXPECT_NE(synthetic_error("hosts=2,bogus=1").find("unknown key 'bogus'"), std::string::npos);
  EXPECT_NE(synthetic_error("hosts").find("'hosts' is not key=value"), std::string::npos);
  EXPECT_NE(synthetic_error("gpu=H100-SMX").find("'H100-SMX' is not a known model"), std::string::npos);
  EXPECT_NE(synthetic_error("nics=8x400g-foo").find("nics=8x400g-foo"), std::string::npos);
  EXPECT_NE(synthetic_error("hosts=0").find("hosts"), std::string::npos);
  EXPECT_NE(synthetic_error("gpus=2,gpu=L40S,nvlink=all").find("has no NVLink"), std::string::npos);
  EXPECT_NE(synthetic_error("nvlink=sideways").find("nvlink=sideways"), std::string::npos);
}

TEST(TopologyValue, WithoutNvlinkIsIdempotentAndKeepsPcieRoutes) {
  Topology t = parse_synthetic("gpus=8,gpu=H100-SXM");
  Topology n = without_nvlink(t);
  EXPECT_TRUE(n.nvlink_disabled);
  EXPECT_EQ(nvlink_islands(n.hosts[0]).size(), 8u);
  EXPECT_EQ(n.hosts[0].link(0, 1).link_class, LinkClass::kPcie);
  EXPECT_EQ(n.hosts[0].link(0, 1).pci_path, t.hosts[0].link(0, 1).pci_path);
  EXPECT_DOUBLE_EQ(n.hosts[0].link(0, 1).bandwidth, 64e9);  // H100: PCIe Gen5 x16
  EXPECT_DOUBLE_EQ(t.hosts[0].link(0, 1).pci_bandwidth, 64e9);
  EXPECT_EQ(without_nvlink(n), n);
  EXPECT_NE(n, t);
  EXPECT_NE(format_matrix(t.hosts[0]).find("NVS18"), std::string::npos);
  EXPECT_EQ(format_matrix(n.hosts[0]).find("NVS18"), std::string::npos);
}

TEST(TopologyValue, LinkBetweenEndpoints) {
  Topology t = parse_synthetic("hosts=2,gpus=2,gpu=A100-SXM,nics=1x200g-ib");
  EXPECT_EQ(link_between(t, {0, 0, 0, 1}, {0, 0, 0, 1}), LinkClass::kSameProcess);
  double bw = 0;
  EXPECT_EQ(link_between(t, {0, 0, 0, 1}, {0, 1, 0, 2}, &bw), LinkClass::kNvlink);
  EXPECT_DOUBLE_EQ(bw, 300e9);
  EXPECT_EQ(link_between(t, {0, -1, 0, 1}, {0, -1, 1, 2}), LinkClass::kSharedMemory);
  EXPECT_EQ(link_between(t, {0, 0, 0, 1}, {1, 0, 0, 2}, &bw), LinkClass::kRdma);
  EXPECT_DOUBLE_EQ(bw, 25e9);
  EXPECT_THROW(link_between(t, {5, 0, 0, 1}, {5, 1, 0, 2}), Error);
}

TEST(TopologyValue, CorruptJsonNamesTheField) {
  try {
    topology_from_json_text("{\"hosts\": [], \"fabric\": {}}", "cluster.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput);
    EXPECT_NE(std::string(e.what()).find("cluster.json"), std::string::npos);
  }
  EXPECT_THROW(topology_from_json_text("not json"), Error);
}

// A float too large for the integer member it lands in was read by a plain cast, which is
// undefined (UBSan, fuzz/topology_fuzz.cpp): now refused naming where it stands. Also too
// deep a document.
TEST(TopologyValue, OutOfRangeNumberIsRefusedWithItsPath) {
  nlohmann::json j = nlohmann::json::parse(to_json_text(parse_synthetic("hosts=1,sockets=1,cores=2")));
  j["hosts"][0]["numa_nodes"][0]["memory_bytes"] = 5.5e118;
  try {
    topology_from_json_text(j.dump(), "cluster.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput);
    EXPECT_NE(std::string(e.what()).find("/hosts/0/numa_nodes/0/memory_bytes is out of range"), std::string::npos)
        << e.what();
  }
  std::string deep = "{\"hosts\": " + std::string(100, '[') + std::string(100, ']') + "}";
  try {
    topology_from_json_text(deep, "deep.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than 64 levels"), std::string::npos) << e.what();
  }
}

// Simulates 4 ranks on 2 hosts: each rank's string is collected, then every rank builds
// the topology from all four.
TEST(Gather, RanksAreGroupedByHostnameAndBootId) {
  Topology cluster = parse_synthetic("hosts=2,sockets=1,cores=2");
  const int host_of_rank[] = {0, 1, 0, 1};
  std::vector<std::string> sent(4);
  for (int r = 0; r < 4; ++r)
    gather_topology(cluster.hosts[host_of_rank[r]], r, 1000 + r, {r}, [&](const std::string& mine) {
      sent[r] = mine;
      return std::vector<std::string>{};
    });
  Topology seen[4];
  for (int r = 0; r < 4; ++r)
    seen[r] = gather_topology(cluster.hosts[host_of_rank[r]], r, 1000 + r, {r},
                              [&](const std::string&) { return sent; });
  for (int r = 1; r < 4; ++r) EXPECT_EQ(seen[r], seen[0]);
  const Topology& t = seen[0];
  ASSERT_EQ(t.hosts.size(), 2u);
  EXPECT_EQ(t.hosts[0], cluster.hosts[0]);
  ASSERT_EQ(t.ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(t.ranks[r].host, host_of_rank[r]);
    EXPECT_EQ(t.ranks[r].pid, 1000 + r);
    EXPECT_EQ(t.ranks[r].bound_pus, (std::vector<int>{r}));
  }
  // Same hostname, different boot id: two machines (e.g. a rebooted or cloned image).
  Host a = cluster.hosts[0], b = cluster.hosts[0];
  b.boot_id = "other";
  std::vector<std::string> two(2);
  gather_topology(a, 0, 1, {}, [&](const std::string& s) { two[0] = s; return std::vector<std::string>{}; });
  gather_topology(b, 1, 2, {}, [&](const std::string& s) { two[1] = s; return std::vector<std::string>{}; });
  EXPECT_EQ(gather_topology(a, 0, 1, {}, [&](const std::string&) { return two; }).hosts.size(), 2u);
  EXPECT_THROW(gather_topology(a, 0, 1, {}, [](const std::string&) { return std::vector<std::string>{"junk"}; }),
               Error);
}

TEST(Live, DiscoversThisMachine) {
  Host h = discover_local_host();
  EXPECT_FALSE(h.name.empty());
  EXPECT_FALSE(h.boot_id.empty());
  EXPECT_GE(h.core_count(), 1);
  EXPECT_GE(h.numa_nodes.size(), 1u);
  EXPECT_EQ(h.source, "hwloc");
  // Without NVIDIA hardware NVML is absent, which is a note and not an error.
  Topology t;
  t.hosts.push_back(h);
  t.fabric = derive_fabric(t.hosts);
  EXPECT_EQ(topology_from_json_text(to_json_text(t)), t);
  EXPECT_FALSE(describe(t).empty());
}

TEST(Live, UcxDeviceListIsConsultedOnRequest) {
  DiscoverOptions o;
  o.use_nvml = false;
  o.use_ucx = true;
  Host h = discover_local_host(o);
  bool noted = false;
  for (const auto& n : h.notes) noted = noted || n.rfind("UCX:", 0) == 0;
  EXPECT_TRUE(noted);
  // Every NIC has one PCIe path per GPU, whichever list it came from.
  for (const auto& nic : h.nics) EXPECT_EQ(nic.gpu_paths.size(), h.devices.size()) << nic.name;
}

}  // namespace
}  // namespace trellis::topology
