// `trellis plan`: the command line's options turned into a sim::PlanRequest (cmd_plan.hpp).
#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cmd_plan.hpp"
#include "json_output.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/sim/calibration.hpp"
#include "trellis/sim/cluster_spec.hpp"
#include "trellis/sim/launch.hpp"
#include "trellis/sim/planner.hpp"
#include "trellis/sim/swift_estimate.hpp"
#include "trellis/sim/units.hpp"
#include "trellis/sim/validate.hpp"
#include "trellis/topology/discovery.hpp"

namespace trellis::launchers {
namespace {

topology::Topology load_cluster(const PlanOptions& o, std::string& device_override, int& nvlink_domain) {
  if (!o.cluster.empty() && !o.topo_files.empty())
    throw_error(ErrorCode::kInvalidArgument, "--cluster and --topo-file: give one of them");
  if (!o.topo_files.empty()) return topology::load_xml_hosts(o.topo_files);
  if (o.cluster.empty()) {
    topology::Topology t;
    t.hosts.push_back(topology::discover_local_host());
    t.fabric = topology::derive_fabric(t.hosts);
    return t;
  }
  sim::ClusterSpec spec = sim::parse_cluster_spec(o.cluster, device_override);
  device_override = spec.device;
  nvlink_domain = spec.nvlink_domain;
  return topology::parse_synthetic(spec.synthetic);
}

// --variants: empty means the variant the model was trained as.
std::vector<sim::Variant> parse_variants(const std::string& text, const sim::ModelSpec& model) {
  if (text.empty()) return {model.trained_variant};
  if (text == "all") return sim::all_variants();
  std::vector<sim::Variant> v;
  for (const auto& s : split(text, ',')) {
    try {
      v.push_back(sim::parse_variant(std::string(trim(s))));
    } catch (const Error& e) {
      throw_error(e.code(), "--variants: {} (or all)", e.what());
    }
  }
  return v;
}

// --dtype: auto (bf16 on GPUs, f32 on CPUs), one precision, a list, or all (bf16 and, where
// the device has FP8 tensor cores, fp8; f32 on CPUs).
std::vector<sim::Precision> parse_precisions(const std::string& text, const sim::DeviceSpec& d) {
  const bool cpu = d.kind == sim::DeviceKind::kCpu;
  if (text == "auto") return {cpu ? sim::Precision::kF32 : sim::Precision::kBf16};
  if (text == "all") {
    if (cpu) return {sim::Precision::kF32};
    if (d.has_fp8()) return {sim::Precision::kBf16, sim::Precision::kFp8};
    return {sim::Precision::kBf16};
  }
  std::vector<sim::Precision> out;
  for (const auto& s : split(text, ',')) {
    sim::Precision p;
    try {
      p = sim::parse_precision(trim(s));
    } catch (const Error&) {
      throw_error(ErrorCode::kInvalidArgument, "--dtype '{}': valid: auto, all, bf16, fp8, f32 or a list like bf16,fp8",
                  text);
    }
    if (p == sim::Precision::kFp8 && !d.has_fp8())
      throw_error(ErrorCode::kInvalidArgument, "--dtype fp8: {} has no FP8 tensor cores; devices that have them: {}",
                  d.name, sim::fp8_device_names());
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

// --prefill-chunk: a list of whole numbers of tokens, each >= 0 (0: whole prompts) and no
// longer than the model's context (its max_position_embeddings; prompt + generated tokens
// when the config does not say).
std::vector<int> parse_prefill_chunks(const std::string& text, const sim::ModelSpec& model, const sim::Workload& w) {
  if (text.empty()) return sim::default_prefill_chunks();
  const long context = model.max_positions > 0 ? model.max_positions : static_cast<long>(w.prompt_len) + w.gen_len;
  std::vector<int> out;
  for (const auto& part : split(text, ',')) {
    const std::string_view v = trim(part);
    long c = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), c);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size())
      throw_error(ErrorCode::kInvalidArgument,
                  "--prefill-chunk '{}': '{}' is not a whole number of tokens (a list like 0,256,512; 0: whole prompts)",
                  text, v);
    if (c < 0)
      throw_error(ErrorCode::kInvalidArgument, "--prefill-chunk {}: must be >= 0 tokens (0: whole prompts)", c);
    if (c > context)
      throw_error(ErrorCode::kInvalidArgument, "--prefill-chunk {}: longer than the context of {} ({} tokens{})", c,
                  model.name, context, model.max_positions > 0 ? "" : ": prompt + generated, the config has no limit");
    out.push_back(static_cast<int>(c));
  }
  return out;
}

void apply_calibration(sim::PlanRequest& r, const sim::Calibration& cal) {
  if (cal.runtime()) {
    // The measured engine cost replaces the assumed input-preparation figures (SiPipe's GPU
    // numbers), which it includes: the tiny-model runs prepare inputs too.
    r.host.step_overhead_s = cal.runtime()->step_overhead_s;
    r.host.step_overhead_per_seq_s = cal.runtime()->step_overhead_per_seq_s;
    r.host.input_prep_s = 0;
    r.host.input_prep_per_seq_s = 0;
  }
  const auto& c = cal.compute();
  if (!c) return;
  const bool f32 = r.work.act_bytes >= 4;
  const double flops = f32 ? r.cluster.device.dense_flops_fp32 : r.cluster.device.dense_flops_bf16;
  // GPU figures are per device; a CPU host's are for the whole host (all its threads), which
  // the cluster view divides among the host's ranks.
  const double ranks = r.cluster.device.kind == sim::DeviceKind::kCpu ? r.cluster.devices_per_host : 1;
  r.compute_scale = c->flops / (flops * ranks * r.efficiency.compute);
  r.memory_scale = c->memory_bandwidth / (r.cluster.device.memory_bandwidth * ranks * r.efficiency.memory);
  // CPU hosts with measured matmul rates: linear layers from the measured curve, cores
  // shared among the ranks busy at once (sim/cost_model.hpp CpuSharing).
  if (r.cluster.device.kind == sim::DeviceKind::kCpu && !c->matmul.empty()) {
    r.cpu.enabled = true;
    r.cpu.cores = c->cores > 0 ? c->cores : 1;
    r.cpu.threads_per_rank = c->threads_per_rank;
    r.cpu.matmul = c->matmul;
    r.cpu.host_flops = c->flops;
    r.cpu.host_memory_bandwidth = c->memory_bandwidth;
    r.cpu.one_machine = r.cluster.hosts == 1;
  }
  if (to_lower(c->device) != to_lower(r.cluster.device.name))
    r.cluster.warnings.push_back(fmt::format("calibration {} measured compute on '{}' but the cluster's device is {}",
                                             cal.origin(), c->device, r.cluster.device.name));
}

// --swift, --swift-m, --swift-alpha, --swift-r: the SWIFT estimate, or nothing.
std::optional<sim::SwiftEstimate> parse_swift(const PlanOptions& o) {
  if (!o.swift && o.swift_m.empty() && o.swift_alpha.empty() && o.swift_r.empty()) return std::nullopt;
  sim::SwiftEstimate e;
  if (!o.swift_m.empty()) e.m = parse_double(o.swift_m, "--swift-m");
  if (!o.swift_alpha.empty()) e.alpha = parse_double(o.swift_alpha, "--swift-alpha");
  if (!o.swift_r.empty()) e.r = parse_double(o.swift_r, "--swift-r");
  sim::check_swift_estimate(e);
  return e;
}

// `cores_per_host` (may be null): the smallest host's cores, 0 when unknown.
}  // namespace

sim::PlanRequest build_request(const PlanOptions& o, std::optional<sim::Calibration>& cal, int* cores_per_host,
                               std::vector<std::string>* host_names) {
  sim::PlanRequest r;
  r.model = sim::load_model(o.model);
  std::string device = o.gpu;
  int nvlink_domain = 0;
  topology::Topology topo = load_cluster(o, device, nvlink_domain);
  if (host_names) {
    host_names->clear();
    for (const auto& h : topo.hosts) host_names->push_back(h.name);
  }
  if (cores_per_host) {
    *cores_per_host = 0;
    for (const auto& h : topo.hosts)
      *cores_per_host = *cores_per_host == 0 ? h.core_count() : std::min(*cores_per_host, h.core_count());
  }
  if (o.no_nvlink) topo = topology::without_nvlink(std::move(topo));
  if (!o.calibration.empty()) cal = sim::Calibration::load(o.calibration);
  r.cluster = sim::make_cluster_view(topo, device, cal ? &*cal : nullptr, o.ranks_per_host);
  if (nvlink_domain > 0) sim::set_nvlink_domain(r.cluster, nvlink_domain, cal ? &*cal : nullptr);
  const auto precisions = parse_precisions(o.dtype, r.cluster.device);
  r.work = sim::with_precision(r.work, precisions.front());
  if (precisions.size() > 1) r.precisions = precisions;
  r.work.prompt_len = o.prompt_len;
  r.work.gen_len = o.gen_len;
  r.devices = o.gpus;
  r.prefill_chunks = parse_prefill_chunks(o.prefill_chunk, r.model, r.work);
  r.batches.clear();
  for (auto b : parse_int_list(o.batch, "--batch")) {
    if (b < 1) throw_error(ErrorCode::kInvalidArgument, "--batch: {} is not >= 1", b);
    r.batches.push_back(static_cast<int>(b));
  }
  r.variants = parse_variants(o.variants, r.model);
  r.objective = sim::parse_objective(o.objective);
  // SLOs: as given (0 switches one off); otherwise goodput and latency plan for the default
  // chat-serving SLOs on GPU clusters. CPU hosts (trellis's development target) get none.
  const bool defaults = r.objective != sim::Objective::kThroughput && r.cluster.device.kind == sim::DeviceKind::kGpu;
  if (o.slo_tpot_ms > 0) r.slo_tpot_s = o.slo_tpot_ms * 1e-3;
  else if (o.slo_tpot_ms < 0 && defaults) r.slo_tpot_s = sim::kDefaultSloTpotS;
  if (o.slo_ttft_ms > 0) r.slo_ttft_s = o.slo_ttft_ms * 1e-3;
  else if (o.slo_ttft_ms < 0 && defaults) r.slo_ttft_s = sim::kDefaultSloTtftS;
  if (o.no_sipipe) r.techniques = sim::PipelineTechniques{false, false, false};
  r.head_aware_split = o.layer_split == "auto";
  if (o.sim_model == "appendix") r.kind = sim::ModelKind::kAppendix;
  else if (o.sim_model != "refined")
    throw_error(ErrorCode::kInvalidArgument, "--sim-model '{}': valid: refined, appendix", o.sim_model);
  r.replicas = !o.no_replicas;
  r.expert_imbalance = o.expert_imbalance;
  r.swift = parse_swift(o);
  if (cal) apply_calibration(r, *cal);
  return r;
}


}  // namespace trellis::launchers
