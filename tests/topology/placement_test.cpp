// Placement of the PP x TP grid on synthetic clusters and on the real captures, with and
// without NVLink, and the constraints that reject impossible grids.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "trellis/core/error.hpp"
#include "trellis/topology/discovery.hpp"
#include "trellis/topology/placement.hpp"

namespace trellis::topology {
namespace {

const char* kTwoByEightH100 = "hosts=2,gpus=8,gpu=H100-SXM,nvlink=all,nics=8x400g-ib";

std::set<int> hosts_of_stage(const Placement& pl, int s) {
  std::set<int> out;
  for (int i = 0; i < pl.tp; ++i) out.insert(pl.ranks[pl.rank_at(s, i)].host);
  return out;
}

void expect_grid_is_a_permutation(const Placement& pl) {
  std::set<std::pair<int, int>> cells;
  for (std::size_t r = 0; r < pl.ranks.size(); ++r) {
    EXPECT_EQ(pl.ranks[r].rank, static_cast<int>(r));
    cells.insert({pl.ranks[r].stage, pl.ranks[r].tp});
  }
  EXPECT_EQ(cells.size(), pl.ranks.size());
  EXPECT_EQ(pl.tp_groups.size(), static_cast<std::size_t>(pl.pp));
  EXPECT_EQ(pl.boundaries.size(), static_cast<std::size_t>(pl.pp - 1));
}

TEST(Placement, TwoHostsP2T8KeepsEachTpGroupOnOneHost) {
  Topology t = parse_synthetic(kTwoByEightH100);
  Placement pl = place(ModelShape{32, 32, 8}, t, 2, 8);
  expect_grid_is_a_permutation(pl);
  EXPECT_EQ(pl.kind, RankKind::kGpu);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(hosts_of_stage(pl, s), (std::set<int>{s}));
    EXPECT_EQ(pl.tp_groups[s].link_class, LinkClass::kNvlink);
    EXPECT_DOUBLE_EQ(pl.tp_groups[s].bandwidth, 450e9);
  }
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kRdma);
  EXPECT_DOUBLE_EQ(pl.boundaries[0].bandwidth, 400e9 / 8);
  // Each GPU uses the NIC on its own PCIe switch: 8 GPUs, 8 NICs, all distinct per host.
  std::set<std::pair<int, std::string>> nics;
  for (const auto& r : pl.ranks) nics.insert({r.host, r.nic});
  EXPECT_EQ(nics.size(), 16u);
}

TEST(Placement, TwoHostsP4T4PutsTwoStagesPerHost) {
  Topology t = parse_synthetic(kTwoByEightH100);
  Placement pl = place(ModelShape{32, 32, 8}, t, 4, 4);
  expect_grid_is_a_permutation(pl);
  EXPECT_EQ(hosts_of_stage(pl, 0), (std::set<int>{0}));
  EXPECT_EQ(hosts_of_stage(pl, 1), (std::set<int>{0}));
  EXPECT_EQ(hosts_of_stage(pl, 2), (std::set<int>{1}));
  EXPECT_EQ(hosts_of_stage(pl, 3), (std::set<int>{1}));
  for (const auto& g : pl.tp_groups) EXPECT_EQ(g.link_class, LinkClass::kNvlink);
  // Only the middle boundary crosses hosts.
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kNvlink);
  EXPECT_EQ(pl.boundaries[1].link_class, LinkClass::kRdma);
  EXPECT_EQ(pl.boundaries[2].link_class, LinkClass::kNvlink);
  EXPECT_EQ(pl.layers_per_stage(), (std::vector<int>{8, 8, 8, 8}));
}

TEST(Placement, NoNvlinkTurnsTheSameGridsIntoPcie) {
  Topology t = parse_synthetic(kTwoByEightH100);
  PlaceOptions o;
  o.no_nvlink = true;
  Placement a = place(ModelShape{32, 32, 8}, t, 2, 8, o);
  EXPECT_TRUE(a.nvlink_disabled);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(hosts_of_stage(a, s), (std::set<int>{s}));
    EXPECT_EQ(a.tp_groups[s].link_class, LinkClass::kPcie);
    EXPECT_DOUBLE_EQ(a.tp_groups[s].bandwidth, 64e9);
  }
  EXPECT_EQ(a.boundaries[0].link_class, LinkClass::kRdma);
  Placement b = place(ModelShape{32, 32, 8}, t, 4, 4, o);
  for (const auto& g : b.tp_groups) EXPECT_EQ(g.link_class, LinkClass::kPcie);
  EXPECT_EQ(b.boundaries[0].link_class, LinkClass::kPcie);
  EXPECT_EQ(b.boundaries[1].link_class, LinkClass::kRdma);
  // A TP group of 4 stays on one NUMA node's GPUs when it can (GPUs 0-3 on NUMA 0).
  std::set<int> numa;
  for (int i = 0; i < 4; ++i) numa.insert(b.ranks[b.rank_at(0, i)].numa);
  EXPECT_EQ(numa.size(), 1u);
  EXPECT_NE(place(ModelShape{32, 32, 8}, t, 2, 8), a);
}

TEST(Placement, NvlinkPairsGroupTheIslands) {
  Topology t = parse_synthetic("gpus=4,gpu=V100-SXM2,nvlink=pairs,nics=0");
  Placement pl = place(ModelShape{4, 8, 8}, t, 2, 2);
  EXPECT_EQ(pl.tp_groups[0].link_class, LinkClass::kNvlink);
  EXPECT_EQ(pl.tp_groups[1].link_class, LinkClass::kNvlink);
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kPcie);
  std::set<int> g0 = {pl.ranks[pl.rank_at(0, 0)].device, pl.ranks[pl.rank_at(0, 1)].device};
  EXPECT_TRUE(g0 == (std::set<int>{0, 1}) || g0 == (std::set<int>{2, 3}));
}

TEST(Placement, CpuRanksGetDisjointCoresOnTheirNumaNode) {
  Topology t = parse_synthetic("hosts=2,sockets=2,cores=8,smt=2,nics=1x25g-eth");
  PlaceOptions o;
  o.cpu_ranks_per_host = 4;
  Placement pl = place(ModelShape{8, 8, 4}, t, 2, 4, o);
  EXPECT_EQ(pl.kind, RankKind::kCpu);
  std::map<int, std::set<int>> used;  // host -> PUs
  for (const auto& r : pl.ranks) {
    EXPECT_EQ(r.device, -1);
    EXPECT_EQ(r.cores.size(), 8u);  // 8 cores per NUMA node, 2 ranks per node: 4 cores x 2 threads
    for (int pu : r.cores) EXPECT_TRUE(used[r.host].insert(pu).second) << "PU " << pu << " used twice";
    EXPECT_EQ(r.nic, "eth0");
  }
  EXPECT_EQ(hosts_of_stage(pl, 0), (std::set<int>{0}));
  EXPECT_EQ(pl.tp_groups[0].link_class, LinkClass::kSharedMemory);
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kTcp);
  EXPECT_EQ(ranks_available(t, o), 8);
}

TEST(Placement, DiscoveredRanksAreMappedByHost) {
  // Ranks 0 and 2 on node0, 1 and 3 on node1 (round-robin mpirun): TP groups by host.
  Topology t = parse_synthetic("hosts=2,sockets=1,cores=4");
  t.ranks = {{0, 0, 100, {}}, {1, 1, 101, {}}, {2, 0, 102, {}}, {3, 1, 103, {}}};
  Placement pl = place(ModelShape{4, 4, 2}, t, 2, 2);
  EXPECT_EQ(pl.rank_at(0, 0), 0);
  EXPECT_EQ(pl.rank_at(0, 1), 2);
  EXPECT_EQ(pl.rank_at(1, 0), 1);
  EXPECT_EQ(pl.rank_at(1, 1), 3);
  EXPECT_EQ(pl.tp_groups[0].link_class, LinkClass::kSharedMemory);
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kTcp);
  EXPECT_THROW(place(ModelShape{4, 4, 2}, t, 1, 2), Error);  // 2 != 4 discovered ranks
}

TEST(Placement, TpGroupThatCannotFitAHostIsReported) {
  // 3 hosts x 2 GPUs at t=3: a TP group must cross the fabric, and the placement says so.
  Topology t = parse_synthetic("hosts=3,gpus=2,gpu=A100-SXM,nics=1x200g-ib");
  Placement pl = place(ModelShape{12, 12, 3}, t, 2, 3);
  EXPECT_EQ(hosts_of_stage(pl, 0), (std::set<int>{0, 1}));
  EXPECT_EQ(pl.tp_groups[0].link_class, LinkClass::kRdma);
  bool noted = false;
  for (const auto& n : pl.notes) noted = noted || n.find("TP group of stage 0 spans 2 hosts") != std::string::npos;
  EXPECT_TRUE(noted);
}

std::string placement_error(const ModelShape& m, const Topology& t, int p, int tp) {
  try {
    place(m, t, p, tp);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "no error";
}

TEST(Placement, EachImpossibleGridNamesItsConstraint) {
  Topology t = parse_synthetic(kTwoByEightH100);
  EXPECT_NE(placement_error({32, 32, 8}, t, 2, 4).find("p x t = 2 x 4 = 8 must equal the ranks available: 16"),
            std::string::npos);
  EXPECT_NE(placement_error({32, 36, 12}, t, 2, 8).find("attention heads (36) must be divisible by t=8"),
            std::string::npos);
  EXPECT_NE(placement_error({32, 32, 4}, t, 2, 8).find("KV heads (4) must be divisible by t=8"), std::string::npos);
  EXPECT_NE(placement_error({2, 32, 8}, t, 4, 4).find("layers (2) must be >= p=4"), std::string::npos);
  EXPECT_NE(placement_error({32, 32, 8}, t, 0, 16).find("p=0"), std::string::npos);
  PlaceOptions gpu;
  gpu.kind = RankKind::kGpu;
  EXPECT_THROW(place({32, 32, 8}, parse_synthetic("hosts=2"), 1, 2, gpu), Error);
}

std::string shared_file(const std::string& name) {
  const char* root = std::getenv("TRELLIS_SHARED");
  if (!root) return {};
  auto p = std::filesystem::path(root) / "topologies" / name;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

TEST(Placement, Dgx2AndItsNoNvlinkTwin) {
  const std::string f = shared_file("hwloc-nvidia-dgx2.xml");
  if (f.empty()) GTEST_SKIP();
  Topology t = load_xml_hosts({f});
  Placement pl = place(ModelShape{32, 32, 8}, t, 2, 8);
  EXPECT_EQ(pl.tp_groups[0].link_class, LinkClass::kNvlink);
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kNvlink);
  // Stage 0 = the 8 GPUs of socket 0, so their cores are socket 0's.
  for (int i = 0; i < 8; ++i) EXPECT_EQ(pl.ranks[pl.rank_at(0, i)].numa, 0);
  // The capture keeps 2 cores per socket: 8 ranks share them evenly, 4 per core.
  std::map<int, int> per_pu;
  for (int i = 0; i < 8; ++i)
    for (int pu : pl.ranks[pl.rank_at(0, i)].cores) ++per_pu[pu];
  EXPECT_EQ(per_pu, (std::map<int, int>{{0, 4}, {1, 4}}));
  PlaceOptions o;
  o.no_nvlink = true;
  Placement pn = place(ModelShape{32, 32, 8}, t, 2, 8, o);
  EXPECT_EQ(pn.tp_groups[0].link_class, LinkClass::kPcie);
  EXPECT_EQ(pn.boundaries[0].link_class, LinkClass::kPcie);
}

TEST(Placement, Power8PairsBecomeTheTpGroups) {
  const std::string f = shared_file("hwloc-power8-4gpu-nvlink.xml");
  if (f.empty()) GTEST_SKIP();
  Topology t = load_xml_hosts({f});
  Placement pl = place(ModelShape{24, 16, 4}, t, 2, 2);
  EXPECT_EQ(pl.tp_groups[0].link_class, LinkClass::kNvlink);
  EXPECT_EQ(pl.tp_groups[1].link_class, LinkClass::kNvlink);
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kPcie);
  Placement whole = place(ModelShape{24, 16, 4}, t, 1, 4);
  EXPECT_EQ(whole.tp_groups[0].link_class, LinkClass::kPcie);  // the pairs are not linked
}

TEST(Placement, JurecaRanksUseTheNicOnTheirSwitch) {
  const std::string f = shared_file("hwloc-jureca-dc-4a100-4mlx5.xml");
  if (f.empty()) GTEST_SKIP();
  Topology t = load_xml_hosts({"2x" + f});
  Placement pl = place(ModelShape{32, 32, 8}, t, 2, 4);
  const char* want[] = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};
  for (const auto& r : pl.ranks) EXPECT_EQ(r.nic, want[r.device]) << "rank " << r.rank;
  EXPECT_EQ(pl.boundaries[0].link_class, LinkClass::kRdma);
  for (const auto& r : pl.ranks) EXPECT_FALSE(r.cores.empty());
}

TEST(Placement, JsonRoundTripAndPrinting) {
  Topology t = parse_synthetic(kTwoByEightH100);
  Placement pl = place(ModelShape{32, 32, 8}, t, 4, 4);
  EXPECT_EQ(placement_from_json_text(placement_to_json_text(pl)), pl);
  const std::string text = format_placement(pl, t);
  EXPECT_NE(text.find("stage boundaries"), std::string::npos);
  EXPECT_NE(text.find("rdma"), std::string::npos);
  EXPECT_THROW(placement_from_json_text("{\"pp\": 1}"), Error);
}

// The last stage also reads the LM head; split_layers gives it fewer layers so that the
// slowest stage is as fast as whole layers allow.
TEST(Placement, SplitLayersWeighsTheHeadOnTheLastStage) {
  // No head cost: the even split, earlier stages taking the remainder (as before).
  EXPECT_EQ(split_layers(30, 4, 0), (std::vector<int>{8, 8, 7, 7}));
  EXPECT_EQ(split_layers(32, 4, 0), (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(split_layers(7, 1, 5), (std::vector<int>{7}));
  // SmolLM2 (30 layers, the head worth 8 of them): 19 | 11 + 8 instead of 15 | 15 + 8.
  EXPECT_EQ(split_layers(30, 2, 8.0), (std::vector<int>{19, 11}));
  // Worth 14 layers (Q4_1 layers, Q8_0 head): 22 | 8 + 14.
  EXPECT_EQ(split_layers(30, 2, 13.6), (std::vector<int>{22, 8}));
  // Three stages: the first two share what the last leaves; 13 | 12 | 5 + 8 and 13 | 13 | 4 + 8
  // are equally fast, and the one nearer the even split wins.
  EXPECT_EQ(split_layers(30, 3, 8.0), (std::vector<int>{13, 12, 5}));
  // A head larger than the model's layers: the last stage keeps one layer.
  EXPECT_EQ(split_layers(30, 2, 100.0), (std::vector<int>{29, 1}));
  // A head too small to move a layer leaves the even split.
  EXPECT_EQ(split_layers(32, 2, 0.5), (std::vector<int>{16, 16}));
  // Every split is a valid one, and no other split has a faster slowest stage.
  for (int layers : {2, 5, 16, 30, 80})
    for (int p = 1; p <= std::min(layers, 5); ++p)
      for (double h : {0.0, 0.7, 1.2, 3.0, 8.0, 40.0}) {
        const auto split = split_layers(layers, p, h);
        ASSERT_EQ(static_cast<int>(split.size()), p);
        int sum = 0;
        double slowest = 0;
        for (int s = 0; s < p; ++s) {
          EXPECT_GE(split[s], 1);
          sum += split[s];
          slowest = std::max(slowest, split[s] + (s == p - 1 ? h : 0.0));
        }
        EXPECT_EQ(sum, layers);
        for (int last = 1; last <= layers - (p - 1) && p > 1; ++last) {
          const int others = (layers - last + p - 2) / (p - 1);
          EXPECT_LE(slowest, std::max(last + h, static_cast<double>(others)) + 1e-9)
              << layers << " layers, p=" << p << ", head " << h << ": last=" << last << " is faster";
        }
      }
  EXPECT_THROW(split_layers(3, 4, 0), Error);
}

TEST(Placement, GivenSplitIsCheckedAndKept) {
  Topology t = parse_synthetic("hosts=1,gpus=0,cores=4");
  ModelShape m{30, 9, 3};
  m.split = {22, 8};
  Placement pl = place(m, t, 2, 1, PlaceOptions{RankKind::kCpu, 2});
  EXPECT_EQ(pl.layers_per_stage(), (std::vector<int>{22, 8}));
  EXPECT_NE(format_placement(pl, t).find("22/8 (as given)"), std::string::npos);
  EXPECT_EQ(placement_from_json_text(placement_to_json_text(pl)), pl);
  for (std::vector<int> bad : {std::vector<int>{29, 2}, {30}, {30, 0}, {10, 10, 10}}) {
    m.split = bad;
    try {
      place(m, t, 2, 1, PlaceOptions{RankKind::kCpu, 2});
      ADD_FAILURE() << "split of " << bad.size() << " entries accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("layer split"), std::string::npos) << e.what();
    }
  }
  m.split.clear();
  m.head_cost = 8;
  pl = place(m, t, 2, 1, PlaceOptions{RankKind::kCpu, 2});
  EXPECT_EQ(pl.layers_per_stage(), (std::vector<int>{19, 11}));
  EXPECT_NE(format_placement(pl, t).find("LM head costs as much as 8.0 layers"), std::string::npos);
  // A placement file from before head_cost and split existed reads as an even split.
  std::string old = placement_to_json_text(pl);
  const auto at = old.find("\"head_cost\"");
  ASSERT_NE(at, std::string::npos);
  old.replace(at, old.find(',', at) + 1 - at, "");
  EXPECT_EQ(placement_from_json_text(old).layers_per_stage(), (std::vector<int>{15, 15}));
  m.head_cost = -1;
  EXPECT_THROW(place(m, t, 2, 1, PlaceOptions{RankKind::kCpu, 2}), Error);
}

}  // namespace
}  // namespace trellis::topology
