// The planner's cluster grammar (short forms, NVL72, nvlink-domain, catalog GPUs the topology
// layer does not know, the errors that list the valid names) and the launch commands of a
// pick (hostfiles, mpirun lines, GPUs and ports of replicas that share a host).
#include <gtest/gtest.h>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/cluster_spec.hpp"
#include "trellis/sim/launch.hpp"
#include "trellis/topology/discovery.hpp"

namespace trellis::sim {
namespace {

std::string error_of(const std::string& spec) {
  try {
    parse_cluster_spec(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ClusterSpec, Nvl72IsEighteenTraysInOneNvlinkDomain) {
  const ClusterSpec one = parse_cluster_spec("1xNVL72");
  EXPECT_EQ(one.device, "GB200");
  EXPECT_EQ(one.nvlink_domain, 72);
  const topology::Topology t = topology::parse_synthetic(one.synthetic);
  ASSERT_EQ(t.hosts.size(), 18u);
  EXPECT_EQ(t.hosts[0].devices.size(), 4u);
  EXPECT_EQ(t.hosts[0].nics.size(), 4u);  // one 400G NIC per GPU
  ClusterView c = make_cluster_view(t, one.device);
  set_nvlink_domain(c, one.nvlink_domain);
  EXPECT_DOUBLE_EQ(c.intra[1].bandwidth, 900e9);  // NVLink 5 inside a tray too
  EXPECT_EQ(layout_links(c, 1, 72).tp.hosts, 1);
  const ClusterSpec two = parse_cluster_spec("2xnvl72-roce400");
  EXPECT_NE(two.synthetic.find("hosts=36"), std::string::npos) << two.synthetic;
  EXPECT_NE(two.synthetic.find("nics=4x400g-roce"), std::string::npos) << two.synthetic;
  // The attribute form, and a catalog GPU the topology layer does not know.
  const ClusterSpec attr = parse_cluster_spec("hosts=4,gpus=4,gpu=GB200,nvlink-domain=8");
  EXPECT_EQ(attr.nvlink_domain, 8);
  EXPECT_EQ(attr.device, "GB200");
  EXPECT_EQ(attr.synthetic.find("nvlink-domain"), std::string::npos) << attr.synthetic;
  EXPECT_NO_THROW(topology::parse_synthetic(attr.synthetic));
}

TEST(ClusterSpec, ShortFormsAndCatalogGpus) {
  const ClusterSpec h20 = parse_cluster_spec("2x8xH20-ROCE400");
  EXPECT_EQ(h20.device, "H20");
  EXPECT_EQ(h20.nvlink_domain, 0);
  EXPECT_NE(h20.synthetic.find("nics=8x400g-roce"), std::string::npos) << h20.synthetic;
  EXPECT_NE(h20.synthetic.find("nvlink-bw=450GB"), std::string::npos) << h20.synthetic;
  const ClusterView c = make_cluster_view(topology::parse_synthetic(h20.synthetic), h20.device);
  EXPECT_EQ(c.device.name, "H20");
  EXPECT_EQ(c.inter.name, "roce-400");  // RoCE NICs: the RoCE entry, not InfiniBand NDR
  EXPECT_EQ(parse_cluster_spec("2x8xH100-NDR").device, "");  // the topology knows H100-SXM
  EXPECT_EQ(parse_cluster_spec("hosts=2,gpus=8,gpu=H20", "B200").device, "B200");  // --gpu wins
}

TEST(ClusterSpec, BadInputNamesTheValidChoices) {
  EXPECT_NE(error_of("2x8xH100-FOO").find("unknown fabric 'FOO'"), std::string::npos);
  EXPECT_NE(error_of("2x8xH100-FOO").find("roce400"), std::string::npos);
  EXPECT_NE(error_of("1xNVL72-ib").find("unknown fabric 'ib'"), std::string::npos);
  EXPECT_NE(error_of("2x8xTPU").find("valid devices: "), std::string::npos);
  EXPECT_NE(error_of("hosts=2,gpus=8,gpu=TPU").find("valid GPUs: "), std::string::npos);
  EXPECT_EQ(error_of("hosts=2,gpus=8,gpu=TPU").find("cpu"), std::string::npos);
  EXPECT_NE(error_of("hosts=2,fabric=ib").find("unknown key 'fabric'; valid keys: hosts"), std::string::npos);
  EXPECT_NE(error_of("hosts=2,gpus=8,nvlink-domain=0").find("must be >= 1"), std::string::npos);
  EXPECT_NE(error_of("bogus").find("unknown cluster 'bogus'"), std::string::npos);
}

Candidate pick(int d, int p, int t, int batch) {
  Candidate c;
  c.replicas = d;
  c.layout = Layout{p, t, p, Variant::kStandard, 0.8};
  c.batch = batch;
  return c;
}

TEST(Launch, ReplicasFillHostsInRankOrder) {
  PlanRequest r;
  r.model = load_model("llama-3.1-70b");
  r.cluster = make_cluster_view(testing::gpu_cluster(4, 8));
  const std::vector<std::string> hosts = {"a", "b", "c", "d"};
  // Two replicas of t=16: two hosts each.
  const Launch big = launch_commands(r, pick(2, 1, 16, 32), hosts, "/ckpt dir");
  ASSERT_EQ(big.replicas.size(), 2u);
  EXPECT_EQ(big.replicas[1].hostfile, "c slots=8\nd slots=8\n");
  EXPECT_EQ(big.replicas[0].serve,
            "mpirun -np 16 --hostfile hosts.0 trellis serve --model '/ckpt dir' --pp 1 --tp 16 --max-seqs 32 "
            "--port 8000");
  EXPECT_EQ(big.replicas[0].run,
            "mpirun -np 16 --hostfile hosts.0 trellis run --model '/ckpt dir' --pp 1 --tp 16 --max-seqs 32 "
            "--workload n=32,in=1024,out=512");
  EXPECT_TRUE(big.replicas[1].devices.empty());
  // Sixteen replicas of t=2: four per host, each with its GPUs and its own port.
  const Launch small = launch_commands(r, pick(16, 1, 2, 8), hosts, "");
  ASSERT_EQ(small.replicas.size(), 16u);
  EXPECT_EQ(small.model, "\"$TRELLIS_MODEL\"");
  EXPECT_EQ(small.replicas[5].hostfile, "b slots=2  # GPUs 2-3\n");
  EXPECT_EQ(small.replicas[5].devices, "2,3");
  EXPECT_EQ(small.replicas[5].port, 8001);
  EXPECT_NE(small.replicas[5].serve.find("-x CUDA_VISIBLE_DEVICES=2,3 trellis serve"), std::string::npos);
  bool model_note = false;
  for (const auto& n : small.notes) model_note = model_note || n.find("TRELLIS_MODEL") != std::string::npos;
  EXPECT_TRUE(model_note);
  // A pipeline of 2 stages x t=8 on hosts of 8: a stage per host; a variant is passed on.
  Candidate lad = pick(1, 2, 8, 64);
  lad.layout.variant = Variant::kLadder;
  lad.needs_trained_model = true;
  const Launch pp = launch_commands(r, lad, hosts, "/m");
  EXPECT_EQ(pp.replicas[0].hostfile, "a slots=8\nb slots=8\n");
  EXPECT_NE(pp.replicas[0].serve.find("--pp 2 --tp 8 --variant ladder"), std::string::npos);
  bool trained_note = false;
  for (const auto& n : pp.notes) trained_note = trained_note || n.find("trained as ladder") != std::string::npos;
  EXPECT_TRUE(trained_note);
  EXPECT_EQ(pp.replicas[0].serve.find("--layer-split"), std::string::npos);  // even: run's default
  // A layout planned with --layer-split auto launches with it (a pipeline only).
  lad.layout.head_aware_split = true;
  EXPECT_NE(launch_commands(r, lad, hosts, "/m").replicas[0].serve.find(" --layer-split auto"), std::string::npos);
  EXPECT_NE(sbatch_script(r, lad, "", "trellis plan", 0).find(" --layer-split auto"), std::string::npos);
  Candidate flat = pick(2, 1, 16, 32);
  flat.layout.head_aware_split = true;
  EXPECT_EQ(launch_commands(r, flat, hosts, "").replicas[0].run.find("--layer-split"), std::string::npos);
  EXPECT_EQ(shell_quote("plain/path"), "plain/path");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
}

}  // namespace
}  // namespace trellis::sim
