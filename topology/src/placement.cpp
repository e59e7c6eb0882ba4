// Placement of the PP x TP grid: order the slots (GPUs or CPU ranks) so that consecutive
// runs of t share the fastest domain, then cut the order into p stages. Because slots are
// ordered host by host, consecutive stages share a host wherever they can, so the stage
// boundaries cross hosts only where they must.
#include "trellis/topology/placement.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <map>

#include <fmt/ranges.h>

#include "trellis/core/error.hpp"

namespace trellis::topology {
namespace {

struct Slot {
  int host = -1;
  int device = -1;
  int numa = -1;
  int rank = -1;  // discovered MPI rank, or -1 (assigned in grid order)
};

void validate(const ModelShape& m, int p, int t) {
  if (p < 1) throw_error(ErrorCode::kInvalidArgument, "placement: pipeline degree p={} must be at least 1", p);
  if (t < 1) throw_error(ErrorCode::kInvalidArgument, "placement: tensor degree t={} must be at least 1", t);
  if (m.heads < 1 || m.kv_heads < 1 || m.layers < 1)
    throw_error(ErrorCode::kInvalidArgument, "placement: model shape needs layers, heads and kv-heads >= 1 "
                "(got layers={}, heads={}, kv-heads={})", m.layers, m.heads, m.kv_heads);
  // The t values that split both head counts, to name in the errors below.
  std::string valid;
  for (int v = 1; v <= m.kv_heads; ++v)
    if (m.heads % v == 0 && m.kv_heads % v == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(v);
  if (m.heads % t != 0)
    throw_error(ErrorCode::kInvalidArgument,
                "placement: attention heads ({}) must be divisible by t={} (each TP rank holds heads/t heads): "
                "{} heads / {} KV heads cannot be split over {} ranks; valid t: {}",
                m.heads, t, m.heads, m.kv_heads, t, valid);
  if (m.kv_heads % t != 0)
    throw_error(ErrorCode::kInvalidArgument,
                "placement: KV heads ({}) must be divisible by t={} (GQA: each TP rank holds kv_heads/t KV heads): "
                "{} heads / {} KV heads cannot be split over {} ranks; valid t: {}",
                m.kv_heads, t, m.heads, m.kv_heads, t, valid);
  if (m.layers < p)
    throw_error(ErrorCode::kInvalidArgument, "placement: layers ({}) must be >= p={} (every stage needs a layer)",
                m.layers, p);
  if (!(m.head_cost >= 0) || m.head_cost > 1e6)
    throw_error(ErrorCode::kInvalidArgument, "placement: head cost {} (in layers) must be a number in [0, 1e6]",
                m.head_cost);
  if (!m.split.empty()) {
    long sum = 0;
    for (int n : m.split) sum += n;
    const bool positive = std::all_of(m.split.begin(), m.split.end(), [](int n) { return n >= 1; });
    if (static_cast<int>(m.split.size()) != p || !positive || sum != m.layers)
      throw_error(ErrorCode::kInvalidArgument,
                  "placement: layer split {} must give each of the p={} stages at least one layer and add up to the "
                  "model's {} layers", fmt::format("{}", fmt::join(m.split, ",")), p, m.layers);
  }
}

// GPUs of a host in placement order: NVLink islands (ordered by NUMA node, then first
// GPU), each island's GPUs in index order. Without NVLink every GPU is its own island, so
// this is NUMA order — TP groups then stay on one PCIe root where they can.
std::vector<int> gpu_order(const Host& h) {
  auto islands = nvlink_islands(h);
  auto numa = [&](const std::vector<int>& isl) { return h.devices[static_cast<std::size_t>(isl.front())].numa; };
  std::stable_sort(islands.begin(), islands.end(), [&](const auto& a, const auto& b) {
    return std::make_pair(numa(a), a.front()) < std::make_pair(numa(b), b.front());
  });
  std::vector<int> order;
  for (const auto& isl : islands) order.insert(order.end(), isl.begin(), isl.end());
  return order;
}

bool use_gpus(const Topology& topo, const PlaceOptions& o) {
  if (o.kind == RankKind::kCpu) return false;
  std::map<int, int> ranks_on;
  for (const auto& r : topo.ranks) ++ranks_on[r.host];
  bool ok = topo.device_count() > 0;
  for (const auto& [host, n] : ranks_on) {
    const int gpus = static_cast<int>(topo.hosts[static_cast<std::size_t>(host)].devices.size());
    if (gpus < n) {
      if (o.kind == RankKind::kGpu)
        throw_error(ErrorCode::kInvalidArgument, "placement: host {} has {} rank(s) but only {} GPU(s)",
                    topo.hosts[static_cast<std::size_t>(host)].name, n, gpus);
      ok = false;
    }
  }
  if (o.kind == RankKind::kGpu && !ok)
    throw_error(ErrorCode::kInvalidArgument, "placement: GPU ranks requested but the topology has no GPU");
  return ok;
}

std::vector<Slot> make_slots(const Topology& topo, const PlaceOptions& o, bool gpus) {
  std::vector<Slot> slots;
  for (int h = 0; h < static_cast<int>(topo.hosts.size()); ++h) {
    const Host& host = topo.hosts[static_cast<std::size_t>(h)];
    std::vector<int> ranks;
    for (const auto& r : topo.ranks)
      if (r.host == h) ranks.push_back(r.rank);
    const bool discovered = !topo.ranks.empty();
    if (gpus) {
      auto order = gpu_order(host);
      const std::size_t n = discovered ? ranks.size() : order.size();
      for (std::size_t i = 0; i < n; ++i) {
        const auto& d = host.devices[static_cast<std::size_t>(order[i])];
        slots.push_back({h, d.index, d.numa, discovered ? ranks[i] : -1});
      }
      continue;
    }
    const int numa_count = std::max<int>(1, static_cast<int>(host.numa_nodes.size()));
    const int n = discovered ? static_cast<int>(ranks.size())
                             : (o.cpu_ranks_per_host > 0 ? o.cpu_ranks_per_host : numa_count);
    for (int i = 0; i < n; ++i) {
      // Spread ranks over NUMA nodes in blocks, so neighbours (a TP group) share a node.
      const int k = i * numa_count / n;
      const int numa = host.numa_nodes.empty() ? -1 : host.numa_nodes[static_cast<std::size_t>(k)].index;
      slots.push_back({h, -1, numa, discovered ? ranks[static_cast<std::size_t>(i)] : -1});
    }
  }
  return slots;
}

std::string describe_slots(const Topology& topo, bool gpus, std::size_t n) {
  if (!topo.ranks.empty()) return fmt::format("{} discovered rank(s) on {} host(s)", n, topo.hosts.size());
  return fmt::format("{} {} on {} host(s)", n, gpus ? "GPU(s)" : "CPU rank slot(s)", topo.hosts.size());
}

// Splits the cores of each (host, NUMA node) among the ranks placed there, disjointly.
void assign_cores(const Topology& topo, Placement& pl) {
  std::map<std::pair<int, int>, std::vector<int>> groups;
  for (const auto& r : pl.ranks) groups[{r.host, r.numa}].push_back(r.rank);
  for (auto& [key, members] : groups) {
    const Host& host = topo.hosts[static_cast<std::size_t>(key.first)];
    std::vector<const Core*> cores;
    for (const auto& n : host.numa_nodes)
      if (key.second < 0 || n.index == key.second)
        for (const auto& c : n.cores) cores.push_back(&c);
    if (cores.empty()) continue;
    const std::size_t m = members.size();
    if (cores.size() < m)
      pl.notes.push_back(fmt::format("host {} NUMA {}: {} ranks share {} core(s)", host.name, key.second, m,
                                     cores.size()));
    for (std::size_t i = 0; i < m; ++i) {
      auto& r = pl.ranks[static_cast<std::size_t>(members[i])];
      const std::size_t lo = i * cores.size() / m;
      const std::size_t hi = std::max(lo + 1, (i + 1) * cores.size() / m);  // more ranks than cores: share
      for (std::size_t c = lo; c < hi; ++c) r.cores.insert(r.cores.end(), cores[c]->pus.begin(), cores[c]->pus.end());
    }
  }
}

int nic_score(const Nic& nic, const RankPlacement& r) {
  // Lower is closer: PCIe distance (GPU ranks) or NUMA match (CPU ranks), RDMA first.
  int dist = static_cast<int>(PciPath::kSys);
  if (r.device >= 0 && static_cast<std::size_t>(r.device) < nic.gpu_paths.size())
    dist = static_cast<int>(nic.gpu_paths[static_cast<std::size_t>(r.device)]);
  else if (nic.numa >= 0 && nic.numa == r.numa)
    dist = static_cast<int>(PciPath::kNode);
  const bool rdma = nic.kind == NicKind::kInfiniband || nic.kind == NicKind::kRoce;
  return dist * 2 + (rdma ? 0 : 1);
}

void assign_nics(const Topology& topo, Placement& pl) {
  std::map<std::pair<int, std::string>, int> load;
  for (auto& r : pl.ranks) {
    const Host& host = topo.hosts[static_cast<std::size_t>(r.host)];
    const Nic* best = nullptr;
    auto key = [&](const Nic& n) {
      return std::make_tuple(nic_score(n, r), -n.bandwidth, load[{r.host, n.name}]);
    };
    for (const auto& n : host.nics)
      if (!best || key(n) < key(*best)) best = &n;
    if (best) {
      r.nic = best->name;
      ++load[{r.host, best->name}];
    }
  }
}

Endpoint endpoint(const RankPlacement& r) { return Endpoint{r.host, r.device, r.numa, r.rank}; }

void slowest(const Topology& topo, const RankPlacement& a, const RankPlacement& b, GroupLink& g) {
  double bw = 0;
  LinkClass c = link_between(topo, endpoint(a), endpoint(b), &bw);
  if (c > g.link_class || (c == g.link_class && bw < g.bandwidth)) {
    g.link_class = c;
    g.bandwidth = bw;
  }
}

void classify_links(const Topology& topo, Placement& pl) {
  const int p = pl.pp, t = pl.tp;
  for (int s = 0; s < p; ++s) {
    GroupLink g;
    g.bandwidth = t > 1 ? 1e300 : 0;
    for (int i = 0; i < t; ++i)
      for (int j = i + 1; j < t; ++j)
        slowest(topo, pl.ranks[static_cast<std::size_t>(pl.rank_at(s, i))],
                pl.ranks[static_cast<std::size_t>(pl.rank_at(s, j))], g);
    if (g.bandwidth >= 1e300) g.bandwidth = 0;
    pl.tp_groups.push_back(g);
    std::vector<int> hosts;
    for (int i = 0; i < t; ++i) hosts.push_back(pl.ranks[static_cast<std::size_t>(pl.rank_at(s, i))].host);
    std::sort(hosts.begin(), hosts.end());
    hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
    if (hosts.size() > 1)
      pl.notes.push_back(fmt::format("the TP group of stage {} spans {} hosts: its all-reduces cross the fabric", s,
                                     hosts.size()));
  }
  for (int s = 0; s + 1 < p; ++s) {
    GroupLink g;
    g.bandwidth = 1e300;
    for (int i = 0; i < t; ++i)
      slowest(topo, pl.ranks[static_cast<std::size_t>(pl.rank_at(s, i))],
              pl.ranks[static_cast<std::size_t>(pl.rank_at(s + 1, i))], g);
    if (g.bandwidth >= 1e300) g.bandwidth = 0;
    pl.boundaries.push_back(g);
  }
}

}  // namespace

std::string_view to_string(RankKind k) {
  switch (k) {
    case RankKind::kAuto: return "auto";
    case RankKind::kGpu: return "gpu";
    case RankKind::kCpu: return "cpu";
  }
  return "?";
}

int Placement::rank_at(int stage, int tp_index) const {
  if (stage < 0 || stage >= pp || tp_index < 0 || tp_index >= tp)
    throw_error(ErrorCode::kInvalidArgument, "placement: grid position (stage {}, tp {}) is outside {}x{}", stage,
                tp_index, pp, tp);
  for (const auto& r : ranks)
    if (r.stage == stage && r.tp == tp_index) return r.rank;
  throw_error(ErrorCode::kInternal, "placement: no rank at (stage {}, tp {})", stage, tp_index);
}

std::vector<int> split_layers(int layers, int p, double head_cost) {
  if (p < 1 || layers < p)
    throw_error(ErrorCode::kInvalidArgument, "layer split: {} layers cannot fill p={} stages", layers, p);
  // The first p-1 stages share `rest` layers evenly, earlier ones taking the remainder.
  auto fill = [p](int rest, int last) {
    std::vector<int> out;
    for (int s = 0; s + 1 < p; ++s) out.push_back(rest / (p - 1) + (s < rest % (p - 1) ? 1 : 0));
    out.push_back(last);
    return out;
  };
  std::vector<int> even;
  for (int s = 0; s < p; ++s) even.push_back(layers / p + (s < layers % p ? 1 : 0));
  if (p == 1 || !(head_cost > 0)) return even;
  // Slowest stage for a last stage of `last` layers; whole layers, so scan every choice.
  auto slowest = [&](int last) {
    const int rest = layers - last, others = (rest + p - 2) / (p - 1);
    return std::max(last + head_cost, static_cast<double>(others));
  };
  int best = even.back();
  for (int last = 1; last <= layers - (p - 1); ++last) {
    const double c = slowest(last), b = slowest(best);
    if (c < b - 1e-9 || (c <= b + 1e-9 && std::abs(last - even.back()) < std::abs(best - even.back()))) best = last;
  }
  return fill(layers - best, best);
}

std::vector<int> Placement::layers_per_stage() const {
  if (!model.split.empty()) {
    validate(model, pp, std::max(1, tp));  // a placement read from JSON is checked here
    return model.split;
  }
  return split_layers(model.layers, pp, model.head_cost);
}

int ranks_available(const Topology& topo, const PlaceOptions& options) {
  return static_cast<int>(make_slots(topo, options, use_gpus(topo, options)).size());
}

Placement place(const ModelShape& model, const Topology& input, int p, int t, const PlaceOptions& options) {
  validate(model, p, t);
  const Topology topo = options.no_nvlink ? without_nvlink(input) : input;
  if (topo.hosts.empty()) throw_error(ErrorCode::kInvalidArgument, "placement: the topology has no host");
  const bool gpus = use_gpus(topo, options);
  const std::vector<Slot> slots = make_slots(topo, options, gpus);
  if (static_cast<std::size_t>(p) * static_cast<std::size_t>(t) != slots.size())
    throw_error(ErrorCode::kInvalidArgument, "placement: p x t = {} x {} = {} must equal the ranks available: {}", p,
                t, p * t, describe_slots(topo, gpus, slots.size()));
  Placement pl;
  pl.pp = p;
  pl.tp = t;
  pl.model = model;
  pl.kind = gpus ? RankKind::kGpu : RankKind::kCpu;
  pl.nvlink_disabled = topo.nvlink_disabled;
  pl.ranks.resize(slots.size());
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const Slot& s = slots[k];
    const int rank = s.rank >= 0 ? s.rank : static_cast<int>(k);
    if (rank < 0 || static_cast<std::size_t>(rank) >= slots.size())
      throw_error(ErrorCode::kInvalidArgument, "placement: discovered rank {} is outside 0..{}", rank, slots.size() - 1);
    RankPlacement& r = pl.ranks[static_cast<std::size_t>(rank)];
    r.rank = rank;
    r.stage = static_cast<int>(k) / t;
    r.tp = static_cast<int>(k) % t;
    r.host = s.host;
    r.device = s.device;
    r.numa = s.numa;
  }
  assign_cores(topo, pl);
  assign_nics(topo, pl);
  classify_links(topo, pl);
  if (topo.nvlink_disabled) pl.notes.push_back("NVLink treated as absent (--no-nvlink)");
  return pl;
}

}  // namespace trellis::topology
