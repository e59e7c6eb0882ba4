// Calibration files: both forms (fitted figures, raw points), their effect on the links,
// and malformed files naming the field.
#include <gtest/gtest.h>

#include "calibration_errors.hpp"
#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/calibration.hpp"

namespace trellis::sim {
namespace {

std::string error_of(const std::string& text) { return testing::calibration_error_of(text); }

TEST(Calibration, ReadsFittedFigures) {
  Calibration c = Calibration::parse(
      R"({"schema": "trellis.calibration.v1", "machine": "box", "extra": 1,
          "links": [{"class": "shm", "alpha_us": 2.5, "bandwidth_GBps": 8, "max_bytes": 4194304}]})",
      "cal.json");
  ASSERT_NE(c.link(LinkKind::kSharedMemory), nullptr);
  EXPECT_DOUBLE_EQ(c.link(LinkKind::kSharedMemory)->alpha_s, 2.5e-6);
  EXPECT_DOUBLE_EQ(c.link(LinkKind::kSharedMemory)->bandwidth, 8e9);
  EXPECT_EQ(c.link(LinkKind::kTcp), nullptr);
  EXPECT_EQ(c.machine(), "box");
}

TEST(Calibration, FitsRawPointsExactly) {
  // time = 4 us + bytes / 2 GB/s
  std::string pts;
  for (double b : {8.0, 4096.0, 1048576.0}) pts += fmt::format(R"({{"bytes": {}, "seconds": {}}},)", b, 4e-6 + b / 2e9);
  pts.pop_back();
  Calibration c = Calibration::parse(
      R"({"schema": "trellis.calibration.v1", "links": [{"class": "tcp", "points": [)" + pts + "]}]}", "cal.json");
  const CalibratedLink* l = c.link(LinkKind::kTcp);
  ASSERT_NE(l, nullptr);
  EXPECT_NEAR(l->alpha_s, 4e-6, 1e-12);
  EXPECT_NEAR(l->bandwidth, 2e9, 1e3);
  EXPECT_DOUBLE_EQ(l->max_bytes, 1048576.0);
}

TEST(Calibration, ReplacesCatalogFiguresInTheClusterView) {
  Calibration c = Calibration::parse(
      R"({"schema": "trellis.calibration.v1", "links": [{"class": "rdma", "alpha_us": 20, "bandwidth_GBps": 1}]})",
      "cal.json");
  ClusterView v = make_cluster_view(testing::gpu_cluster(2, 8), "", &c);
  EXPECT_TRUE(v.inter.calibrated);
  EXPECT_DOUBLE_EQ(v.inter.alpha_s, 20e-6);
  EXPECT_FALSE(v.intra[1].calibrated);  // NVLink was not measured: catalog
}

TEST(Calibration, MeasuredAllreduceReplacesTheFormulaForItsGroupSize) {
  // The shape transport's `bench comm` writes: links with samples (not refitted), an
  // unfitted bandwidth of 0, and all-reduces per algorithm including peers.
  Calibration c = Calibration::parse(R"({"schema": "trellis.calibration.v1", "machine": "vm",
      "links": [{"class": "shm", "backend": "shm", "alpha_us": 1.5, "bandwidth_GBps": 0,
                 "samples": [{"bytes": 8, "seconds": 1.5e-6}]}],
      "allreduce": [{"class": "shm", "algorithm": "ring", "ranks": 4, "alpha_us": 30, "bus_bandwidth_GBps": 2},
                    {"class": "shm", "algorithm": "shm", "ranks": 4, "alpha_us": 10, "bus_bandwidth_GBps": 3},
                    {"class": "shm", "algorithm": "MPI_Allreduce", "ranks": 4, "alpha_us": 1, "bus_bandwidth_GBps": 9}]})",
      "cal.json");
  const CalibratedAllreduce* ar = c.allreduce(LinkKind::kSharedMemory, 4);
  ASSERT_NE(ar, nullptr);
  EXPECT_EQ(ar->algorithm, "shm");  // the faster trellis algorithm; the MPI peer is skipped
  topology::Topology topo = testing::gpu_cluster(1, 0, "", 0, 0);
  for (int i = 0; i < 4; ++i) topo.hosts[0].numa_nodes.push_back(topology::NumaNode{i, 0, 8ull << 30, {}});
  ClusterView v = make_cluster_view(topo, "", &c);
  ASSERT_EQ(v.devices_per_host, 4);
  EXPECT_DOUBLE_EQ(v.intra[1].alpha_s, 1.5e-6);
  EXPECT_DOUBLE_EQ(v.intra[1].bandwidth, find_link("shm").bandwidth);  // 0 = keep the catalog's
  LayoutLinks l = layout_links(v, 1, 4);
  EXPECT_EQ(l.tp.measured_algorithm, "shm");
  EXPECT_DOUBLE_EQ(allreduce_time(l.tp, 1e6), 10e-6 + 1.5 * 1e6 / 3e9);
  EXPECT_EQ(layout_links(v, 2, 2).tp.measured_bus_bandwidth, 0);  // 2 ranks were not measured
}

TEST(Calibration, MalformedFilesNameTheField) {
  EXPECT_NE(error_of("[1,2]").find("top level"), std::string::npos);
  EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"links": []})").find("'schema'"), std::string::npos);
  EXPECT_NE(error_of(R"({"schema": "v0"})").find("'schema'"), std::string::npos);
  const std::string head = R"({"schema": "trellis.calibration.v1", "links": [)";
  EXPECT_NE(error_of(head + R"({"class": "tcp", "alpha_us": "fast", "bandwidth_GBps": 1}]})")
                .find("'links[0].alpha_us' must be a number"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"({"class": "warp", "alpha_us": 1, "bandwidth_GBps": 1}]})").find("links[0].class"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"({"class": "tcp", "alpha_us": 1}]})").find("links[0].bandwidth_GBps' is missing"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"({"class": "tcp", "points": [{"bytes": 8, "seconds": 1e-6}, {"bytes": 16}]}]})")
                .find("links[0].points[1].seconds"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"({"class": "tcp", "alpha_us": 1, "bandwidth_GBps": -3}]})").find("must be >= 0"),
            std::string::npos);
}

}  // namespace
}  // namespace trellis::sim
