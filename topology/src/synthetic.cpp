// Synthetic clusters: a comma-separated key=value spec turned into the same Host values
// that discovery produces, for machines nobody here has.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/topology/discovery.hpp"

namespace trellis::topology {
namespace {

constexpr std::string_view kGrammar = R"(Synthetic cluster spec: comma-separated key=value tokens, every key optional.
  hosts=N          hosts in the cluster (1)
  name=PREFIX      host names PREFIX0, PREFIX1, ... (node)
  sockets=N        CPU packages per host (2)
  numa=N           NUMA nodes per socket (1)
  cores=N          cores per socket (32)
  smt=N            hardware threads per core (1)
  mem=SIZE         CPU memory per host, e.g. 2TiB (512GiB)
  gpus=N           GPUs per host (0)
  gpu=MODEL        H100-SXM, H200-SXM, A100-SXM, V100-SXM3, V100-SXM2, H100-PCIe,
                   A100-PCIe, L40S (H100-SXM)
  gpu-mem=SIZE     override the model's GPU memory
  nvlink=MODE      all (every GPU pair through NVSwitch), pairs (GPUs 0-1, 2-3, ...),
                   N (islands of N GPUs through NVSwitch), none. Default: all for SXM
                   models, none otherwise
  nvlink-bw=RATE   per-direction NVLink bandwidth of one GPU pair, e.g. 450GB (model's)
  nics=NxRATE-KIND NICs per host: count x port rate (g = Gb/s) - ib|roce|eth,
                   e.g. 8x400g-ib, 2x100g-eth; nics=0 for none (1x100g-eth)
GPUs and NICs are spread evenly over the NUMA nodes; every two GPUs share a PCIe switch
and a NIC shares the switch of the GPUs it serves.
Example: hosts=2,gpus=8,gpu=H100-SXM,nvlink=all,nics=8x400g-ib)";

struct GpuModel {
  std::string_view name;
  double memory_gib;
  int nvlinks;      // lanes per GPU, 0 = PCIe card
  double lane_bw;   // bytes/s per lane per direction
  double pcie_bw;   // bytes/s of the card's PCIe x16 link (Gen5 64, Gen4 32, Gen3 16 GB/s)
};
constexpr GpuModel kModels[] = {
    {"H100-SXM", 80, 18, 25e9, 64e9},  {"H200-SXM", 141, 18, 25e9, 64e9}, {"A100-SXM", 80, 12, 25e9, 32e9},
    {"V100-SXM3", 32, 6, 25e9, 16e9},  {"V100-SXM2", 16, 6, 25e9, 16e9},  {"H100-PCIe", 80, 0, 0, 64e9},
    {"A100-PCIe", 80, 0, 0, 32e9},     {"L40S", 48, 0, 0, 32e9},
};

struct Spec {
  int hosts = 1, sockets = 2, numa = 1, cores = 32, smt = 1, gpus = 0;
  std::string name = "node";
  std::uint64_t mem = 512ull << 30;
  const GpuModel* model = &kModels[0];
  std::optional<std::uint64_t> gpu_mem;
  std::string nvlink;  // "" = model default
  int island = 0;      // nvlink=N
  std::optional<double> nvlink_bw;
  int nics = 1;
  double nic_rate = 100e9 / 8;
  NicKind nic_kind = NicKind::kEthernet;
};

[[noreturn]] void bad_token(std::string_view spec, std::size_t pos, std::size_t len, const std::string& why) {
  throw_error(ErrorCode::kInvalidArgument, "synthetic spec: {} (token at column {})\n  {}\n  {}{}", why,
              pos + 1, spec, std::string(pos, ' '), std::string(std::max<std::size_t>(len, 1), '^'));
}

int positive(std::string_view v, std::string_view key, int lo, int hi) {
  auto n = parse_int(v, key);
  if (n < lo || n > hi) throw_error(ErrorCode::kInvalidArgument, "{}: {} is not in {}..{}", key, n, lo, hi);
  return static_cast<int>(n);
}

void parse_nics(Spec& s, std::string_view v) {
  if (v == "0") {
    s.nics = 0;
    return;
  }
  auto x = v.find_first_of("xX");
  auto dash = v.rfind('-');
  if (x == std::string_view::npos || dash == std::string_view::npos || dash < x)
    throw_error(ErrorCode::kInvalidArgument, "nics: '{}' is not COUNTxRATE-KIND (e.g. 8x400g-ib)", v);
  s.nics = positive(v.substr(0, x), "nics count", 1, 64);
  std::string rate = to_lower(v.substr(x + 1, dash - x - 1));
  if (!rate.empty() && rate.back() == 'g') rate.pop_back();
  s.nic_rate = parse_double(rate, "nics rate (Gb/s)") * 1e9 / 8;
  s.nic_kind = parse_nic_kind(v.substr(dash + 1));
  if (s.nic_kind == NicKind::kUnknown) throw_error(ErrorCode::kInvalidArgument, "nics kind: use ib, roce or eth");
}

void apply(Spec& s, const std::string& key, std::string_view v) {
  if (key == "hosts") s.hosts = positive(v, key, 1, 4096);
  else if (key == "name") s.name = std::string(v);
  else if (key == "sockets") s.sockets = positive(v, key, 1, 16);
  else if (key == "numa") s.numa = positive(v, key, 1, 16);
  else if (key == "cores") s.cores = positive(v, key, 1, 1024);
  else if (key == "smt") s.smt = positive(v, key, 1, 8);
  else if (key == "mem") s.mem = parse_size(v, key);
  else if (key == "gpus") s.gpus = positive(v, key, 0, 64);
  else if (key == "gpu-mem") s.gpu_mem = parse_size(v, key);
  else if (key == "nics") parse_nics(s, v);
  else if (key == "nvlink-bw") {
    std::string t = to_lower(v);
    for (std::string_view suffix : {"gb/s", "gbs", "gb", "g"})
      if (t.size() > suffix.size() && t.ends_with(suffix)) {
        t.resize(t.size() - suffix.size());
        break;
      }
    s.nvlink_bw = parse_double(t, key) * 1e9;
  } else if (key == "gpu") {
    auto it = std::find_if(std::begin(kModels), std::end(kModels),
                           [&](const GpuModel& m) { return to_lower(m.name) == to_lower(v); });
    if (it == std::end(kModels)) {
      std::string known;
      for (const auto& m : kModels) known += (known.empty() ? "" : ", ") + std::string(m.name);
      throw_error(ErrorCode::kInvalidArgument, "gpu: '{}' is not a known model ({})", v, known);
    }
    s.model = &*it;
  } else if (key == "nvlink") {
    std::string t = to_lower(v);
    if (t == "all" || t == "pairs" || t == "none") s.nvlink = t;
    else {
      s.island = positive(v, "nvlink (all, pairs, none or an island size)", 1, 64);
      s.nvlink = "islands";
    }
  } else {
    throw_error(ErrorCode::kInvalidArgument,
                "unknown key '{}' (keys: hosts name sockets numa cores smt mem gpus gpu gpu-mem nvlink "
                "nvlink-bw nics)", key);
  }
}

Spec parse_spec(std::string_view spec) {
  Spec s;
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    std::size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view token = spec.substr(pos, end - pos);
    if (!trim(token).empty()) {
      auto eq = token.find('=');
      if (eq == std::string_view::npos) bad_token(spec, pos, token.size(), fmt::format("'{}' is not key=value", token));
      try {
        apply(s, to_lower(trim(token.substr(0, eq))), trim(token.substr(eq + 1)));
      } catch (const Error& e) {
        bad_token(spec, pos, token.size(), fmt::format("bad token '{}': {}", token, e.what()));
      }
    }
    pos = end + 1;
  }
  if (s.nvlink.empty()) s.nvlink = s.model->nvlinks > 0 ? "all" : "none";
  if (s.nvlink != "none" && s.model->nvlinks == 0 && !s.nvlink_bw)
    throw_error(ErrorCode::kInvalidArgument, "synthetic spec: gpu={} has no NVLink; use nvlink=none or give nvlink-bw",
                s.model->name);
  return s;
}

bool nvlinked(const Spec& s, int a, int b) {
  if (s.nvlink == "all") return true;
  if (s.nvlink == "pairs") return a / 2 == b / 2;
  if (s.nvlink == "islands") return a / s.island == b / s.island;
  return false;
}

Host make_host(const Spec& s, int h, std::string_view spec) {
  Host host;
  host.name = fmt::format("{}{}", s.name, h);
  host.boot_id = fmt::format("synthetic-{}", h);
  host.source = fmt::format("synthetic:{}", spec);
  host.cpu_model = "synthetic CPU";
  host.packages = s.sockets;
  const int numa_count = s.sockets * s.numa;
  const int cores_per_numa = std::max(1, s.cores / s.numa);
  int pu = 0, core_index = 0;
  for (int n = 0; n < numa_count; ++n) {
    NumaNode node{n, n / s.numa, s.mem / static_cast<std::uint64_t>(numa_count), {}};
    for (int c = 0; c < cores_per_numa; ++c) {
      Core core{core_index++, {}};
      for (int t = 0; t < s.smt; ++t) core.pus.push_back(pu++);
      node.cores.push_back(std::move(core));
    }
    host.numa_nodes.push_back(std::move(node));
  }
  const int switches = std::max(1, s.gpus / 2);
  auto numa_of_switch = [&](int sw) { return sw * numa_count / switches; };
  auto gpu_switch = [&](int g) { return s.gpus ? g * switches / s.gpus : 0; };
  const double mem = s.gpu_mem ? static_cast<double>(*s.gpu_mem) : s.model->memory_gib * (1ull << 30);
  for (int g = 0; g < s.gpus; ++g) {
    Device d;
    d.index = g;
    d.name = fmt::format("gpu{}", g);
    d.model = std::string(s.model->name);
    d.pci_bus_id = fmt::format("0000:{:02x}:00.0", 0x10 + 0x10 * g);
    d.numa = numa_of_switch(gpu_switch(g));
    d.memory_bytes = static_cast<std::uint64_t>(mem);
    d.pci_bandwidth = s.model->pcie_bw;
    d.host_link_bandwidth = d.pci_bandwidth;
    host.devices.push_back(d);
  }
  auto path = [&](int sw_a, int sw_b) {
    if (sw_a == sw_b) return PciPath::kPix;
    return numa_of_switch(sw_a) == numa_of_switch(sw_b) ? PciPath::kNode : PciPath::kSys;
  };
  const double pair_bw = s.nvlink_bw ? *s.nvlink_bw : s.model->nvlinks * s.model->lane_bw;
  for (int a = 0; a < s.gpus; ++a)
    for (int b = a + 1; b < s.gpus; ++b) {
      DeviceLink l{a, b, LinkClass::kPcie, path(gpu_switch(a), gpu_switch(b)), 0, false, s.model->pcie_bw,
                   s.model->pcie_bw};
      if (nvlinked(s, a, b)) {
        l.link_class = LinkClass::kNvlink;
        l.nvlinks = s.model->nvlinks;
        l.via_nvswitch = s.nvlink != "pairs";
        l.bandwidth = pair_bw;
      }
      host.links.push_back(l);
    }
  for (int k = 0; k < s.nics; ++k) {
    Nic nic;
    nic.kind = s.nic_kind;
    nic.name = s.nic_kind == NicKind::kEthernet ? fmt::format("eth{}", k) : fmt::format("mlx5_{}", k);
    nic.bandwidth = s.nic_rate;
    nic.pci_bus_id = fmt::format("0000:{:02x}:00.1", 0x10 + 0x10 * (k * std::max(1, s.gpus) / s.nics));
    const int sw = k * switches / s.nics;
    nic.numa = numa_of_switch(sw);
    for (int g = 0; g < s.gpus; ++g) nic.gpu_paths.push_back(path(sw, gpu_switch(g)));
    host.nics.push_back(std::move(nic));
  }
  return host;
}

}  // namespace

std::string_view synthetic_grammar() { return kGrammar; }

Topology parse_synthetic(std::string_view spec) {
  const Spec s = parse_spec(spec);
  Topology topo;
  for (int h = 0; h < s.hosts; ++h) topo.hosts.push_back(make_host(s, h, spec));
  topo.fabric = derive_fabric(topo.hosts);
  return topo;
}

}  // namespace trellis::topology
