// White-box test of the NVML probe against tests/topology/fake_nvml.cpp, loaded through
// the same dlopen("libnvidia-ml.so.1") as on a GPU machine (LD_LIBRARY_PATH points at the
// fake). Checks how links are counted and told apart (direct vs NVSwitch) and how NVML's
// 8-digit PCI domains are matched to hwloc's 4-digit ones.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "trellis/topology/discovery.hpp"

namespace trellis::topology {
namespace {

Host four_gpus() {
  Host h;
  h.name = "fake";
  for (int i = 0; i < 4; ++i) {
    Device d;
    d.index = i;
    d.pci_bus_id = fmt::format("0000:{:02x}:00.0", 0x10 * (i + 1));
    h.devices.push_back(d);
  }
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) h.links.push_back(DeviceLink{a, b, LinkClass::kPcie, PciPath::kSys, 0, false, 0, 0});
  return h;
}

TEST(NvmlProbe, CountsDirectAndSwitchedLinks) {
  Host h = four_gpus();
  add_nvml_links(h);
  ASSERT_FALSE(h.notes.empty());
  ASSERT_EQ(h.notes.back(), "NVML: 4 GPU(s) queried for NVLink") << h.notes.back();
  EXPECT_EQ(h.link(0, 1).link_class, LinkClass::kNvlink);
  EXPECT_FALSE(h.link(0, 1).via_nvswitch);
  EXPECT_EQ(h.link(0, 1).nvlinks, 4);
  EXPECT_DOUBLE_EQ(h.link(0, 1).bandwidth, 100e9);
  EXPECT_EQ(h.link(2, 3).link_class, LinkClass::kNvlink);
  EXPECT_TRUE(h.link(2, 3).via_nvswitch);
  EXPECT_EQ(h.link(2, 3).nvlinks, 6);
  EXPECT_DOUBLE_EQ(h.link(2, 3).bandwidth, 150e9);
  EXPECT_EQ(h.link(0, 2).link_class, LinkClass::kPcie);
  auto islands = nvlink_islands(h);
  EXPECT_EQ(islands, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
}

}  // namespace
}  // namespace trellis::topology
