// Shared fixtures for sim tests: a hand-built Topology (no parser needed) and model inputs.
#pragma once

#include "trellis/sim/catalog.hpp"
#include "trellis/sim/cluster.hpp"
#include "trellis/sim/cost_model.hpp"
#include "trellis/topology/topology.hpp"

namespace trellis::sim::testing {

// `hosts` hosts of `gpus` GPUs of `model`, all pairs NVLink at `nvlink_bw` (or PCIe when
// 0), `nics` InfiniBand ports of `nic_bw` bytes/s per host.
inline topology::Topology gpu_cluster(int hosts, int gpus, const std::string& model = "H100-SXM",
                                      double nvlink_bw = 450e9, int nics = 8, double nic_bw = 50e9) {
  topology::Topology t;
  for (int h = 0; h < hosts; ++h) {
    topology::Host host;
    host.name = "node" + std::to_string(h);
    for (int g = 0; g < gpus; ++g) {
      topology::Device d;
      d.index = g;
      d.model = model;
      host.devices.push_back(d);
    }
    for (int a = 0; a < gpus; ++a)
      for (int b = a + 1; b < gpus; ++b) {
        topology::DeviceLink l;
        l.a = a, l.b = b;
        l.link_class = nvlink_bw > 0 ? topology::LinkClass::kNvlink : topology::LinkClass::kPcie;
        l.bandwidth = nvlink_bw;
        host.links.push_back(l);
      }
    for (int n = 0; n < nics; ++n) {
      topology::Nic nic;
      nic.name = "mlx5_" + std::to_string(n);
      nic.kind = topology::NicKind::kInfiniband;
      nic.bandwidth = nic_bw;
      host.nics.push_back(nic);
    }
    t.hosts.push_back(host);
  }
  t.fabric.link_class = hosts > 1 || nics > 0 ? topology::LinkClass::kRdma : topology::LinkClass::kTcp;
  t.fabric.bandwidth = nic_bw;
  return t;
}

// CPU sharing on one 2-core machine (emulated hosts), 2 kernel threads per rank, memory
// bandwidth 1e12 B/s and `host_flops` for the attention core; `matmul` is the measured curve.
inline CpuSharing two_core_sharing(double host_flops, std::vector<MatmulPoint> matmul = {}) {
  CpuSharing c;
  c.enabled = true;
  c.cores = 2;
  c.threads_per_rank = 2;
  c.one_machine = true;
  c.host_flops = host_flops;
  c.host_memory_bandwidth = 1e12;
  c.matmul = std::move(matmul);
  return c;
}

// Inputs for one layout of `model` on the cluster view `c` (which must outlive them).
inline ModelInputs inputs(const ModelSpec& model, const ClusterView& c, int p, int t, int m, Variant v, int batch) {
  ModelInputs in;
  in.model = &model;
  in.device = &c.device;
  in.work.batch = batch;
  in.layout = Layout{p, t, m, v, 0.8};
  in.links = layout_links(c, p, t);
  return in;
}

}  // namespace trellis::sim::testing
