// The refined model's terms, one at a time, against hand-computed values, then as a whole
// on shapes whose answer is known in direction (more all-reduces cost more, SiPipe's
// techniques remove bubble terms, 405B does not fit one GPU).
#include <gtest/gtest.h>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/units.hpp"

namespace trellis::sim {
namespace {

using testing::gpu_cluster;
using testing::inputs;

LinkCost link(double alpha, double bw) {
  LinkCost l;
  l.alpha_s = alpha;
  l.bandwidth = bw;
  return l;
}

TEST(CostModel, AllreduceInOneHost) {
  GroupLinks g{8, 1, link(1e-6, 1e9), link(5e-6, 1e8)};
  // 2 ceil(log2 8) alpha + 2 (t-1)/t M / bw
  EXPECT_DOUBLE_EQ(allreduce_time(g, 1e6), 6e-6 + 1.75e-3);
  g.ranks = 1;
  EXPECT_EQ(allreduce_time(g, 1e6), 0);
}

TEST(CostModel, HierarchicalAllreduceAcrossHosts) {
  GroupLinks g{16, 2, link(1e-6, 1e9), link(5e-6, 1e8)};
  const double intra = 3e-6 + 7.0 / 8 * 1e6 / 1e9;          // reduce-scatter in a host of 8
  const double inter = 2 * 5e-6 + 2 * 0.5 * (1e6 / 8) / 1e8;  // all-reduce of the shard over 2 hosts
  EXPECT_DOUBLE_EQ(allreduce_time(g, 1e6), 2 * intra + inter);
}

TEST(CostModel, TransferAndStageSplit) {
  EXPECT_DOUBLE_EQ(transfer_time(link(2e-6, 1e9), 1e3), 3e-6);
  EXPECT_EQ(layers_per_stage(80, 3), (std::vector<int>{27, 27, 26}));
  EXPECT_EQ(layers_per_stage(30, 4), (std::vector<int>{8, 8, 7, 7}));
}

// With --layer-split auto the planner splits layers as `trellis run --layer-split auto` does. Llama-3.2-1B: its untied 128,256 x 2,048 head (263 M) is worth
// 4.3 of its 61 M-parameter layers, so two stages hold 10 and 6 + head; the even split (other
// engines, the published rows) keeps 8 and 8 + head.
TEST(CostModel, HeadAwareSplitBalancesTheLastStage) {
  const ModelSpec small = load_model("llama-3.2-1b");
  const ClusterView host = make_cluster_view(gpu_cluster(1, 2));
  ModelInputs in = inputs(small, host, 2, 1, 2, Variant::kStandard, 16);
  in.layout.head_aware_split = true;  // --layer-split auto
  // Without the host's fixed costs per iteration (which bound so small a model's step on an
  // H100), the slowest stage's forward sets the period.
  in.host.input_prep_s = in.host.input_prep_per_seq_s = in.host.metadata_s = 0;
  EXPECT_EQ(stage_split(in), (std::vector<int>{10, 6}));
  const Prediction balanced = predict(in);
  in.layout.head_aware_split = false;
  EXPECT_EQ(stage_split(in), (std::vector<int>{8, 8}));
  const Prediction even = predict(in);
  ASSERT_TRUE(balanced.feasible && even.feasible);
  // The slowest stage (what the breakdown reports) is lighter when balanced, and so is the
  // period: 10 layers against 8 + a head of 4.3.
  EXPECT_LT(balanced.decode.compute, 0.9 * even.decode.compute);
  EXPECT_LT(balanced.tpot_s, 0.95 * even.tpot_s);
  // One stage has nothing to balance.
  in.layout.head_aware_split = true;
  in.layout.p = 1;
  EXPECT_EQ(stage_split(in), (std::vector<int>{16}));
}

TEST(CostModel, RooflinePicksTheBindingCeiling) {
  const DeviceSpec& h100 = find_device("H100-SXM");
  Efficiency e{1.0, 1.0};
  EXPECT_DOUBLE_EQ(roofline_time(h100, e, 989e12, 1, false), 1.0);      // compute-bound
  EXPECT_DOUBLE_EQ(roofline_time(h100, e, 1, 3350e9, false), 1.0);      // memory-bound
}

struct Llama70B : ::testing::Test {
  ModelSpec model = load_model("llama-3.1-70b");
  ClusterView one_host = make_cluster_view(gpu_cluster(1, 8));
  ClusterView two_hosts = make_cluster_view(gpu_cluster(2, 8));
};

TEST_F(Llama70B, DecodeAtBatchOneIsMemoryBoundAndNearTheWeightReadTime) {
  Prediction p = predict(inputs(model, one_host, 1, 8, 1, Variant::kStandard, 1));
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_DOUBLE_EQ(p.decode.compute_memory_bound, p.decode.compute);
  // Reading 1/8 of the bf16 weights at 80% of 3.35 TB/s is the floor.
  const double floor = model.total_params() * 2 / 8 / (3350e9 * 0.8);
  EXPECT_GT(p.tpot_s, floor);
  EXPECT_LT(p.tpot_s, 2.5 * floor);
  EXPECT_NE(p.dominant.find("memory-bound"), std::string::npos) << p.dominant;
}

TEST_F(Llama70B, VariantsOrderByBlockingAllreduces) {
  auto comm = [&](Variant v) { return predict(inputs(model, one_host, 1, 8, 1, v, 16)).decode.tp_comm; };
  const double standard = comm(Variant::kStandard);
  EXPECT_GT(standard, 0);
  EXPECT_NEAR(comm(Variant::kParallel), standard / 2, 1e-12);
  EXPECT_NEAR(comm(Variant::kDesync2), standard / 2, 1e-12);
  EXPECT_NEAR(comm(Variant::kDesync4), standard / 4, 1e-12);
  EXPECT_EQ(comm(Variant::kNoComm), 0);
  EXPECT_LT(comm(Variant::kLayerParallel), standard);
  EXPECT_GT(comm(Variant::kLayerParallel), standard / 2);
  Prediction ladder = predict(inputs(model, one_host, 1, 8, 1, Variant::kLadder, 16));
  EXPECT_LT(ladder.decode.tp_comm, standard);
  EXPECT_NEAR(ladder.decode.tp_comm + ladder.decode.tp_comm_hidden, standard, 1e-9);
}

TEST_F(Llama70B, TpAcrossHostsCostsMoreThanInside) {
  Prediction in_host = predict(inputs(model, one_host, 1, 8, 1, Variant::kStandard, 16));
  Prediction across = predict(inputs(model, two_hosts, 1, 16, 1, Variant::kStandard, 16));
  ASSERT_TRUE(across.feasible) << across.reason;
  EXPECT_GT(across.decode.tp_comm, in_host.decode.tp_comm);
}

TEST_F(Llama70B, MicrobatchesFillThePipelineBubble) {
  Prediction m1 = predict(inputs(model, two_hosts, 4, 4, 1, Variant::kStandard, 64));
  Prediction m4 = predict(inputs(model, two_hosts, 4, 4, 4, Variant::kStandard, 64));
  ASSERT_TRUE(m1.feasible && m4.feasible);
  EXPECT_GT(m1.decode.bubble, 0);
  EXPECT_LT(m4.decode.bubble, m1.decode.bubble);
  // Decode is weight-bound: each microbatch re-reads the stage's weights, so microbatches
  // only win back the KV-cache share of the idle time, not a factor p.
  EXPECT_GT(m4.decode_tokens_per_s, m1.decode_tokens_per_s);
  EXPECT_LT(m4.decode_tokens_per_s, 4 * m1.decode_tokens_per_s);
}

TEST_F(Llama70B, OneStageHasNoPipelineBubble) {
  // p = 1: nothing to fill. What idles the stage between steps is host work (sampling, input
  // preparation, the tokens' way back), reported apart, never as a pipeline bubble.
  for (int m : {1, 2}) {
    Prediction p = predict(inputs(model, one_host, 1, 8, m, Variant::kStandard, 64));
    ASSERT_TRUE(p.feasible) << p.reason;
    EXPECT_EQ(p.decode.bubble, 0) << "m=" << m;
    EXPECT_EQ(p.dominant.find("pipeline bubble"), std::string::npos) << p.dominant;
  }
  Prediction one = predict(inputs(model, one_host, 1, 8, 1, Variant::kStandard, 64));
  EXPECT_GT(one.decode.host_gap, 0);
  // The two idle terms add up to what the period leaves idle: TPOT = compute-side cycle + idle.
  Prediction two = predict(inputs(model, two_hosts, 2, 8, 1, Variant::kStandard, 64));
  ASSERT_TRUE(two.feasible);
  EXPECT_GT(two.decode.bubble, 0);       // p = 2 with one microbatch: a stage idles while the other runs
  EXPECT_GT(two.decode.host_gap, 0);
  EXPECT_GT(two.decode.bubble, two.decode.host_gap);
}

TEST_F(Llama70B, TpAcrossHostsPaysTheFabricAtTheNicRate) {
  // t = 16 over two hosts: the inter-host part of every all-reduce is the shard's all-reduce at
  // each rank's share of the host's NICs; with ports a quarter as fast it costs ~4x as much.
  ModelInputs in = inputs(model, two_hosts, 1, 16, 1, Variant::kStandard, 16);
  EXPECT_EQ(in.links.tp.hosts, 2);
  EXPECT_DOUBLE_EQ(in.links.tp.inter.bandwidth, 50e9);
  const double msg = 16.0 * model.hidden * 2;
  const double inter = 2 * 6e-6 + 2 * 0.5 * (msg / 8) / 50e9;  // alpha of ib-ndr, 2 hosts, shard = 1/8
  EXPECT_DOUBLE_EQ(allreduce_inter_time(in.links.tp, msg), inter);
  Prediction fast = predict(in);
  ASSERT_TRUE(fast.feasible);
  EXPECT_GT(fast.decode.tp_comm_inter, 0);
  EXPECT_LT(fast.decode.tp_comm_inter, fast.decode.tp_comm);
  EXPECT_NEAR(fast.decode.tp_comm_inter, 2.0 * 80 * inter, 1e-9);  // two per layer, 80 layers
  ClusterView slow_nics = make_cluster_view(gpu_cluster(2, 8, "H100-SXM", 450e9, 8, 12.5e9));
  ModelInputs in_slow = inputs(model, slow_nics, 1, 16, 1, Variant::kStandard, 16);
  EXPECT_DOUBLE_EQ(in_slow.links.tp.inter.bandwidth, 12.5e9);
  Prediction slow = predict(in_slow);
  EXPECT_GT(slow.decode.tp_comm_inter, fast.decode.tp_comm_inter);
  // One NIC per host: eight ranks share it.
  ClusterView one_nic = make_cluster_view(gpu_cluster(2, 8, "H100-SXM", 450e9, 1, 50e9));
  EXPECT_DOUBLE_EQ(layout_links(one_nic, 1, 16).tp.inter.bandwidth, 50e9 / 8);
  // Inside one host nothing crosses the fabric.
  EXPECT_EQ(predict(inputs(model, one_host, 1, 8, 1, Variant::kStandard, 16)).decode.tp_comm_inter, 0);
  EXPECT_EQ(allreduce_inter_time(inputs(model, one_host, 1, 8, 1, Variant::kStandard, 16).links.tp, msg), 0);
}

TEST_F(Llama70B, Fp8HalvesWeightsAndSpeedsUpTheMemoryBoundStep) {
  ModelInputs bf16 = inputs(model, one_host, 1, 8, 1, Variant::kStandard, 16);
  ModelInputs fp8 = bf16;
  fp8.work = with_precision(fp8.work, Precision::kFp8);
  EXPECT_EQ(fp8.work.weight_bytes, 1);
  EXPECT_EQ(fp8.work.kv_bytes, 1);
  EXPECT_EQ(fp8.work.act_bytes, 2);  // activations and all-reduces stay bf16
  Prediction a = predict(bf16), b = predict(fp8);
  ASSERT_TRUE(a.feasible && b.feasible) << b.reason;
  EXPECT_NEAR(b.memory.weights, a.memory.weights / 2, 1e-6 * a.memory.weights);
  EXPECT_NEAR(b.memory.kv_cache, a.memory.kv_cache / 2, 1e-6 * a.memory.kv_cache);
  EXPECT_LT(b.tpot_s, 0.7 * a.tpot_s);           // decode reads half the bytes
  EXPECT_GT(b.tpot_s, 0.4 * a.tpot_s);
  EXPECT_EQ(b.decode.tp_comm, a.decode.tp_comm);  // same bf16 messages
  EXPECT_LT(b.ttft_s, 0.75 * a.ttft_s);           // prefill's GEMMs on the FP8 tensor cores
  // No FP8 tensor cores: refused with the devices that have them.
  ClusterView a100 = make_cluster_view(gpu_cluster(1, 8, "A100-SXM", 300e9));
  ModelInputs no = inputs(model, a100, 1, 8, 1, Variant::kStandard, 16);
  no.work = with_precision(no.work, Precision::kFp8);
  Prediction n = predict(no);
  EXPECT_FALSE(n.feasible);
  EXPECT_NE(n.reason.find("A100-SXM has no FP8 tensor cores"), std::string::npos) << n.reason;
  EXPECT_NE(n.reason.find("H20"), std::string::npos) << n.reason;
  EXPECT_EQ(parse_precision("fp8"), Precision::kFp8);
  EXPECT_THROW(parse_precision("int4"), Error);
}

TEST_F(Llama70B, SipipeTechniquesRemoveBubbleTerms) {
  ModelInputs on = inputs(model, two_hosts, 4, 4, 4, Variant::kStandard, 64);
  ModelInputs off = on;
  off.techniques = PipelineTechniques{false, false, false};
  Prediction a = predict(on), b = predict(off);
  EXPECT_LT(a.tpot_s, b.tpot_s);
  EXPECT_EQ(a.decode.sampling, 0);
  // The slowest stage without the techniques is the last one, which samples on the device.
  EXPECT_GT(b.decode.sampling, 0);
  EXPECT_GT(b.decode.input_prep, 0);
}

TEST_F(Llama70B, PrefillIsComputeBoundAndSlowerThanADecodeStep) {
  Prediction p = predict(inputs(model, one_host, 1, 8, 1, Variant::kStandard, 8));
  EXPECT_LT(p.prefill.compute_memory_bound, p.prefill.compute);
  EXPECT_GT(p.ttft_s, 10 * p.tpot_s);
}

TEST(CostModelFeasibility, RejectsWithNumbers) {
  const ModelSpec big = load_model("llama-3.1-405b");
  ClusterView c = make_cluster_view(gpu_cluster(1, 1));
  Prediction p = predict(inputs(big, c, 1, 1, 1, Variant::kStandard, 1));
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.reason.find("memory: needs"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("GiB usable on H100-SXM"), std::string::npos) << p.reason;
  const ModelSpec m = load_model("llama-3.1-70b");
  ClusterView c3 = make_cluster_view(gpu_cluster(1, 3));
  Prediction q = predict(inputs(m, c3, 1, 3, 1, Variant::kStandard, 1));
  EXPECT_FALSE(q.feasible);
  EXPECT_NE(q.reason.find("t=3 does not divide the 64 attention heads"), std::string::npos) << q.reason;
}

TEST(Cluster, LinksFollowThePlacementPolicy) {
  ClusterView c = make_cluster_view(gpu_cluster(2, 8));
  EXPECT_EQ(c.device.name, "H100-SXM");
  LayoutLinks a = layout_links(c, 2, 8);
  EXPECT_EQ(a.tp.hosts, 1);
  EXPECT_EQ(a.tp.intra.kind, LinkKind::kNvlink);
  EXPECT_EQ(a.boundary_crosses_host, (std::vector<bool>{true}));
  EXPECT_EQ(a.boundaries[0].kind, LinkKind::kRdma);
  LayoutLinks b = layout_links(c, 4, 4);
  EXPECT_EQ(b.boundary_crosses_host, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(b.boundaries[0].kind, LinkKind::kNvlink);
  LayoutLinks d = layout_links(c, 1, 16);
  EXPECT_EQ(d.tp.hosts, 2);
  // Eight ranks of a host share its eight 50 GB/s ports.
  EXPECT_DOUBLE_EQ(d.tp.inter.bandwidth, 50e9);
}

TEST(Cluster, NvlinkDomainSpansHosts) {
  // GB200 NVL72: 18 trays of 4 GPUs, one 72-GPU NVLink domain; two racks.
  ClusterView c = make_cluster_view(gpu_cluster(36, 4, "GB200", 900e9, 4, 50e9));
  EXPECT_EQ(c.device.name, "GB200");
  LayoutLinks before = layout_links(c, 1, 8);
  EXPECT_EQ(before.tp.hosts, 2);  // without the domain, t=8 spans two trays over InfiniBand
  set_nvlink_domain(c, 72);
  EXPECT_EQ(c.domain_ranks(), 72);
  EXPECT_STREQ(c.domain_word(), "NVLink domain");
  EXPECT_NE(c.description.find("NVLink domains of 72 GPUs"), std::string::npos) << c.description;
  LayoutLinks in_rack = layout_links(c, 1, 8);
  EXPECT_EQ(in_rack.tp.hosts, 1);
  EXPECT_EQ(in_rack.tp.intra.kind, LinkKind::kNvlink);
  EXPECT_DOUBLE_EQ(in_rack.tp.intra.bandwidth, 900e9);
  EXPECT_EQ(layout_links(c, 1, 72).tp.hosts, 1);     // the whole rack is one TP group on NVLink
  LayoutLinks racks = layout_links(c, 1, 144);       // two racks: the fabric between them
  EXPECT_EQ(racks.tp.hosts, 2);
  EXPECT_EQ(racks.tp.inter.kind, LinkKind::kRdma);
  LayoutLinks pp = layout_links(c, 2, 36);           // a stage boundary inside the rack: NVLink
  EXPECT_EQ(pp.boundary_crosses_host, (std::vector<bool>{false}));
  EXPECT_EQ(pp.boundaries[0].kind, LinkKind::kNvlink);
  LayoutLinks pp2 = layout_links(c, 2, 72);          // between racks: the fabric
  EXPECT_EQ(pp2.boundary_crosses_host, (std::vector<bool>{true}));
  EXPECT_EQ(pp2.boundaries[0].kind, LinkKind::kRdma);
  EXPECT_THROW(set_nvlink_domain(c, 6), Error);     // not whole trays
  EXPECT_THROW(set_nvlink_domain(c, 100), Error);   // not whole trays and does not divide 144
}

TEST(Cluster, UnknownGpuModelAsksForTheCatalogName) {
  try {
    make_cluster_view(gpu_cluster(1, 2, "Tesla M2090"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu"), std::string::npos) << e.what();
  }
  EXPECT_EQ(make_cluster_view(gpu_cluster(1, 2, "Tesla M2090"), "A100-SXM").device.name, "A100-SXM");
  EXPECT_EQ(match_device_model("Tesla V100-SXM3-32GB-H")->name, "V100-SXM3");
  EXPECT_EQ(match_device_model("NVIDIA H100 80GB HBM3")->name, "H100-SXM");
  EXPECT_EQ(match_device_model("NVIDIA H100 PCIe")->name, "H100-PCIe");
  EXPECT_EQ(match_device_model("NVIDIA H20")->name, "H20");
  EXPECT_EQ(match_device_model("NVIDIA H200")->name, "H200");
  EXPECT_EQ(match_device_model("NVIDIA GB200")->name, "GB200");
  EXPECT_EQ(match_device_model("NVIDIA B200")->name, "B200");
}

}  // namespace
}  // namespace trellis::sim
