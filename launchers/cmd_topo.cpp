// `trellis topo`: the machines as trellis sees them (discovered live on every rank, read
// from hwloc XML files, or synthesised from a spec), an nvidia-smi-topo-style matrix per
// host, and optionally the PP x TP placement with the link class of every TP group and
// stage boundary.
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/process.hpp"
#include "trellis/runtime/engine/engine.hpp"
#include "trellis/runtime/engine/stage_handoff.hpp"
#include "trellis/topology/discovery.hpp"
#include "trellis/topology/placement.hpp"
#include "trellis/transport/selection.hpp"

namespace trellis::launchers {
namespace {

struct TopoOptions {
  std::vector<std::string> files;
  std::string synthetic;
  int pp = 0, tp = 0;
  bool no_nvlink = false;
  bool no_nvml = false;
  bool no_ucx = false;
  bool json = false;
  std::string ranks = "auto";
  int cpu_ranks_per_host = 0;
  topology::ModelShape model;
  std::string transport;  // --transport; empty: setting comm.transport
};

// Every rank must take part in live discovery (it is a collective); files and specs are
// read by rank 0 alone.
topology::Topology load(Session& s, const TopoOptions& o) {
  if (!o.files.empty()) return topology::load_xml_hosts(o.files);
  if (!o.synthetic.empty()) return topology::parse_synthetic(o.synthetic);
  topology::DiscoverOptions d;
  d.use_nvml = !o.no_nvml;
  d.use_ucx = !o.no_ucx;
  topology::Host mine = topology::discover_local_host(d);
  if (!s.under_mpirun) {
    // One process: show this machine and plan for hypothetical ranks on it.
    topology::Topology t;
    t.hosts.push_back(std::move(mine));
    t.fabric = topology::derive_fabric(t.hosts);
    return t;
  }
  topology::AllgatherFn gather = [&s](const std::string& text) {
    return transport::allgather_strings(s.world(), text, s.deadline());
  };
  return topology::gather_topology(mine, s.rank(), static_cast<int>(::getpid()), allowed_cpus(), gather);
}

topology::PlaceOptions place_options(const TopoOptions& o) {
  topology::PlaceOptions p;
  if (o.ranks == "gpu") p.kind = topology::RankKind::kGpu;
  else if (o.ranks == "cpu") p.kind = topology::RankKind::kCpu;
  p.cpu_ranks_per_host = o.cpu_ranks_per_host;
  p.no_nvlink = o.no_nvlink;
  return p;
}

// Fills a missing --pp or --tp from the ranks available.
void complete_grid(const topology::Topology& topo, TopoOptions& o) {
  if (o.pp <= 0 && o.tp <= 0) return;
  const int n = topology::ranks_available(topo, place_options(o));
  if (o.pp <= 0) o.pp = (o.tp > 0 && n % o.tp == 0) ? n / o.tp : -1;
  if (o.tp <= 0) o.tp = (o.pp > 0 && n % o.pp == 0) ? n / o.pp : -1;
  if (o.pp <= 0 || o.tp <= 0)
    throw_error(ErrorCode::kInvalidArgument, "--pp/--tp: {} ranks available cannot be split that way", n);
}

// Hosts that differ only by name get one matrix.
bool same_hardware(topology::Host a, const topology::Host& b) {
  a.name = b.name;
  a.boot_id = b.boot_id;
  return a == b;
}

void print_text(const topology::Topology& topo, const TopoOptions& o, const topology::Placement* pl,
                const topology::Placement* with_nvlink) {
  std::cout << topology::describe(topo) << "\n";
  for (std::size_t i = 0; i < topo.hosts.size(); ++i) {
    std::size_t first = 0;
    while (first < i && !same_hardware(topo.hosts[first], topo.hosts[i])) ++first;
    if (first < i) {
      std::cout << fmt::format("host {}: same hardware as {}\n\n", topo.hosts[i].name, topo.hosts[first].name);
      continue;
    }
    std::cout << fmt::format("device matrix of host {}{}:\n", topo.hosts[i].name,
                             o.no_nvlink ? " (NVLink treated as absent)" : "");
    std::cout << topology::format_matrix(topo.hosts[i]) << "\n";
  }
  if (!pl) return;
  std::cout << topology::format_placement(*pl, topo);
  if (!with_nvlink) return;
  std::cout << "\nwith NVLink -> without (--no-nvlink):\n";
  for (int s = 0; s < pl->pp; ++s) {
    const auto &a = with_nvlink->tp_groups[static_cast<std::size_t>(s)], &b = pl->tp_groups[static_cast<std::size_t>(s)];
    std::cout << fmt::format("  TP group of stage {}: {} -> {}{}\n", s, to_string(a.link_class), to_string(b.link_class),
                             a.link_class == b.link_class ? " (unchanged)" : "");
  }
  for (int s = 0; s + 1 < pl->pp; ++s) {
    const auto &a = with_nvlink->boundaries[static_cast<std::size_t>(s)], &b = pl->boundaries[static_cast<std::size_t>(s)];
    std::cout << fmt::format("  boundary {} -> {}: {} -> {}{}\n", s, s + 1, to_string(a.link_class), to_string(b.link_class),
                             a.link_class == b.link_class ? " (unchanged)" : "");
  }
}

// The path each stage boundary's hidden state takes (runtime/engine/stage_handoff.hpp), as
// `trellis run` would choose it for these ranks: CUDA IPC needs GPU ranks on one host.
void print_handoffs(Session& s, const topology::Placement& pl) {
  if (pl.pp < 2) return;
  runtime::EngineGrid grid;
  grid.pp = pl.pp;
  grid.tp = pl.tp;
  for (int st = 0; st < pl.pp; ++st)
    for (int k = 0; k < pl.tp; ++k) grid.rank_of.push_back(pl.rank_at(st, k));
  for (const auto& r : pl.ranks) grid.host_of.push_back(r.host);
  const auto mode = runtime::parse_stage_handoff(s.config.get_string("comm.stage_handoff"), "comm.stage_handoff");
  std::cout << fmt::format("\nstage hand-off (comm.stage_handoff={}, {} ranks):\n", runtime::to_string(mode),
                           pl.kind == topology::RankKind::kGpu ? "GPU" : "CPU");
  try {
    for (const auto& h : runtime::plan_stage_handoffs(grid, mode, pl.kind == topology::RankKind::kGpu))
      std::cout << "  " << h.describe() << "\n";
  } catch (const Error& e) {
    std::cout << "  refused: " << e.what() << "\n";
  }
}

int run_topo(Session& s, TopoOptions o) {
  if (!o.files.empty() && !o.synthetic.empty())
    throw_error(ErrorCode::kInvalidArgument, "--topo-file and --synthetic exclude each other");
  o.no_nvlink = o.no_nvlink || s.config.get_bool("comm.no_nvlink");  // the setting, as transport reads it
  const bool live = o.files.empty() && o.synthetic.empty();
  if (!live && !s.is_root()) return 0;
  topology::Topology topo = load(s, o);
  if (!s.is_root()) return 0;
  complete_grid(topo, o);
  std::optional<topology::Placement> pl, with_nvlink;
  if (o.pp > 0) {
    pl = topology::place(o.model, topo, o.pp, o.tp, place_options(o));
    if (o.no_nvlink) {
      auto opts = place_options(o);
      opts.no_nvlink = false;
      with_nvlink = topology::place(o.model, topo, o.pp, o.tp, opts);
    }
  }
  const topology::Topology shown = o.no_nvlink ? topology::without_nvlink(topo) : topo;
  if (o.json) {
    nlohmann::json j;
    j["topology"] = nlohmann::json::parse(topology::to_json_text(shown));
    if (pl) j["placement"] = nlohmann::json::parse(topology::placement_to_json_text(*pl));
    if (with_nvlink) j["placement_with_nvlink"] = nlohmann::json::parse(topology::placement_to_json_text(*with_nvlink));
    std::cout << versioned_json(j) << "\n";
    return 0;
  }
  print_text(shown, o, pl ? &*pl : nullptr, with_nvlink ? &*with_nvlink : nullptr);
  if (pl) {  // the backend each link will use (transport/README.md, policy table)
    auto policy = transport::SelectionPolicy::parse(
        o.transport.empty() ? s.config.get_string("comm.transport") : o.transport,
        o.no_nvlink || s.config.get_bool("comm.no_nvlink"));
    std::cout << fmt::format("\nbackends (--transport {}):\n", policy.describe())
              << transport::format_link_plan(transport::plan_links(*pl, policy));
    print_handoffs(s, *pl);
  }
  return 0;
}

}  // namespace

Action define_topo(CLI::App& sub) {
  auto o = std::make_shared<TopoOptions>();
  sub.add_option("--topo-file", o->files,
                 "hwloc XML of a host (2.x format); repeat for several hosts, or N×FILE / NxFILE for N identical "
                 "hosts")->type_name("FILE");
  sub.add_option("--synthetic", o->synthetic, "A synthetic cluster spec (grammar below)")->type_name("SPEC");
  sub.add_option("--pp", o->pp, "Pipeline stages p (place the grid; with --tp, or derived from the ranks available)");
  sub.add_option("--tp", o->tp, "Tensor-parallel ranks per stage t");
  sub.add_flag("--no-nvlink", o->no_nvlink, "Treat NVLink as absent (interconnect study); shows what changes");
  sub.add_flag("--no-nvml", o->no_nvml, "Live discovery: do not load NVML (no NVLink information)");
  sub.add_flag("--no-ucx", o->no_ucx, "Live discovery: do not add the network devices UCX lists");
  sub.add_flag("--json", o->json, "Print the topology and placement as JSON");
  sub.add_option("--transport", o->transport,
                 "Backend override to show: NAME, or CLASS=NAME,... (default: setting comm.transport)");
  sub.add_option("--ranks", o->ranks, "What a rank is: auto (a GPU when there are GPUs), gpu or cpu")
      ->check(CLI::IsMember({"auto", "gpu", "cpu"}));
  sub.add_option("--cpu-ranks-per-host", o->cpu_ranks_per_host,
                 "CPU ranks per host for files/specs (default one per NUMA node)");
  sub.add_option("--layers", o->model.layers, "Model layers (placement checks layers >= p)")->capture_default_str();
  sub.add_option("--heads", o->model.heads, "Attention heads (must divide by t)")->capture_default_str();
  sub.add_option("--kv-heads", o->model.kv_heads, "KV heads (GQA; must divide by t)")->capture_default_str();
  sub.add_option("--head-cost", o->model.head_cost,
                 "The last stage's LM head in decoder layers (what `trellis run --layer-split auto` weighs it as); "
                 "0 splits the layers evenly")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  sub.add_option("--layer-split", o->model.split, "Layers per stage as given, one count per stage (e.g. 22,8)")
      ->delimiter(',');
  sub.footer(std::string(topology::synthetic_grammar()) +
             "\n\nWithout --topo-file or --synthetic, every rank discovers its host with hwloc (and NVML "
             "when present) and rank 0 prints the whole job; under mpirun the placement uses the real ranks.");
  return [o](Session& s) { return run_topo(s, *o); };
}

}  // namespace trellis::launchers
