// The link-selection policy table and its overrides (see selection.hpp and README.md).
#include "trellis/transport/selection.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/transport/collectives.hpp"

namespace trellis::transport {

using topology::LinkClass;

namespace {

bool crosses_hosts(LinkClass c) { return c == LinkClass::kRdma || c == LinkClass::kTcp; }
bool gpu_only(LinkClass c) { return c == LinkClass::kNvlink || c == LinkClass::kPcie; }

std::string table_reason(LinkClass c, bool gpu) {
  if (gpu) return "policy: nccl for GPU tensors";
  if (crosses_hosts(c)) return "policy: ucx across hosts (RDMA where the NIC has it, else TCP)";
  return "policy: shm in a host";
}

// Rejects overrides that cannot carry this link.
void check_feasible(LinkClass c, bool gpu, Backend b, const std::string& origin) {
  if (b == Backend::kShm && crosses_hosts(c))
    throw_error(ErrorCode::kInvalidArgument, "{}: shm cannot carry a {} link (shm joins ranks of one host only)",
                origin, topology::to_string(c));
  if (gpu && b != Backend::kNccl)
    throw_error(ErrorCode::kInvalidArgument,
                "{}: {} cannot carry GPU tensors ({} link); only nccl reads GPU memory here", origin, to_string(b),
                topology::to_string(c));
  if (!gpu && b == Backend::kNccl)
    throw_error(ErrorCode::kInvalidArgument, "{}: nccl carries GPU tensors only; this {} link moves CPU tensors",
                origin, topology::to_string(c));
}

}  // namespace

SelectionPolicy SelectionPolicy::parse(std::string_view transport, bool no_nvlink) {
  SelectionPolicy p;
  p.no_nvlink = no_nvlink;
  auto text = to_lower(trim(transport));
  if (text.empty() || text == "auto") return p;
  for (const auto& entry : split(text, ',')) {
    auto e = std::string(trim(entry));
    auto eq = e.find('=');
    if (eq == std::string::npos) {
      if (p.global)
        throw_error(ErrorCode::kInvalidArgument, "--transport '{}': two global backends; use NAME or CLASS=NAME,...",
                    transport);
      p.global = parse_backend(e);
      continue;
    }
    auto cls = topology::parse_link_class(trim(std::string_view(e).substr(0, eq)));
    p.per_class[cls] = parse_backend(trim(std::string_view(e).substr(eq + 1)));
  }
  return p;
}

SelectionPolicy SelectionPolicy::from_config(const Config& config) {
  return parse(config.get_string("comm.transport"), config.get_bool("comm.no_nvlink"));
}

std::string SelectionPolicy::describe() const {
  std::string s = global ? std::string(to_string(*global)) : std::string(per_class.empty() ? "auto" : "");
  for (const auto& [c, b] : per_class)
    s += fmt::format("{}{}={}", s.empty() ? "" : ",", topology::to_string(c), to_string(b));
  if (no_nvlink) s += ", no-nvlink";
  return s;
}

Backend default_backend(LinkClass c, bool gpu_tensors) {
  if (gpu_tensors) return Backend::kNccl;
  return crosses_hosts(c) ? Backend::kUcx : Backend::kShm;
}

LinkChoice choose_backend(LinkClass c, bool gpu, const SelectionPolicy& policy) {
  if (policy.no_nvlink && c == LinkClass::kNvlink) c = LinkClass::kPcie;  // the path NCCL falls back to
  if (!gpu && gpu_only(c))
    throw_error(ErrorCode::kInvalidArgument, "a {} link between CPU ranks: that class joins GPUs only",
                topology::to_string(c));
  LinkChoice out{c, default_backend(c, gpu), false, table_reason(c, gpu)};
  std::string origin;
  if (auto it = policy.per_class.find(c); it != policy.per_class.end()) {
    out.backend = it->second;
    origin = fmt::format("--transport {}={}", topology::to_string(c), to_string(it->second));
  } else if (policy.global) {
    out.backend = *policy.global;
    origin = fmt::format("--transport {}", to_string(*policy.global));
  }
  if (!origin.empty()) {
    check_feasible(c, gpu, out.backend, origin);
    out.overridden = true;
    out.why = origin;
  }
  return out;
}

LinkPlan plan_links(const topology::Placement& placement, const SelectionPolicy& policy) {
  LinkPlan plan;
  plan.gpu_tensors = placement.kind == topology::RankKind::kGpu;
  for (const auto& g : placement.tp_groups) {
    plan.tp_groups.push_back(choose_backend(g.link_class, plan.gpu_tensors, policy));
    if (placement.tp == 1) plan.tp_groups.back().why = "one rank per stage: no TP traffic";
  }
  for (const auto& b : placement.boundaries) plan.boundaries.push_back(choose_backend(b.link_class, plan.gpu_tensors, policy));
  bool any_nccl = false;
  for (const auto* v : {&plan.tp_groups, &plan.boundaries})
    for (const auto& c : *v) any_nccl |= c.backend == Backend::kNccl;
  auto built = built_backends();
  if (any_nccl && std::find(built.begin(), built.end(), Backend::kNccl) == built.end())
    plan.notes.push_back("nccl is not built here (no CUDA/NCCL): these GPU links cannot run on this build");
  if (policy.no_nvlink && any_nccl) plan.notes.push_back("--no-nvlink: NCCL runs with NCCL_P2P_DISABLE=1");
  return plan;
}

GroupOptions follow_transport(GroupOptions base, const LinkChoice& tp_group) {
  if (!tp_group.overridden || base.algorithm != Algorithm::kAuto) return base;
  switch (tp_group.backend) {
    case Backend::kMpi: base.algorithm = Algorithm::kMpi; break;
    case Backend::kShm: base.algorithm = Algorithm::kShm; break;
    case Backend::kUcx:
    case Backend::kTcp:
      base.algorithm = Algorithm::kRing;
      base.cross_host = tp_group.backend;
      break;
    default: break;  // nccl: GPU tensors, no CPU collective to redirect
  }
  return base;
}

LinkChoice choose_for_pair(const topology::Placement& placement, const topology::Topology& topo, int a, int b,
                           const SelectionPolicy& policy) {
  auto endpoint = [&](int r) {
    if (r < 0 || r >= static_cast<int>(placement.ranks.size()))
      throw_error(ErrorCode::kInvalidArgument, "rank {} is not in the placement ({} ranks)", r, placement.ranks.size());
    const auto& rp = placement.ranks[r];
    return topology::Endpoint{rp.host, rp.device, rp.numa, rp.rank};
  };
  auto c = topology::link_between(topo, endpoint(a), endpoint(b));
  return choose_backend(c, placement.kind == topology::RankKind::kGpu, policy);
}

std::string format_link_plan(const LinkPlan& plan) {
  std::string out;
  auto line = [&](const std::string& what, const LinkChoice& c) {
    out += fmt::format("  {:<22} {:<13} -> {:<5} ({})\n", what, topology::to_string(c.link_class), to_string(c.backend),
                       c.why);
  };
  for (std::size_t s = 0; s < plan.tp_groups.size(); ++s) line(fmt::format("TP group of stage {}", s), plan.tp_groups[s]);
  for (std::size_t s = 0; s < plan.boundaries.size(); ++s) line(fmt::format("stage {} -> {}", s, s + 1), plan.boundaries[s]);
  for (const auto& n : plan.notes) out += "  note: " + n + "\n";
  return out;
}

std::vector<std::pair<std::string, std::string>> environment_for(const SelectionPolicy& policy) {
  if (policy.no_nvlink) return {{"NCCL_P2P_DISABLE", "1"}};
  return {};
}

}  // namespace trellis::transport
