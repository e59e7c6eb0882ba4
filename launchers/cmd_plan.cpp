// `trellis plan`: predicts every (replicas, p, t, microbatches, variant, precision, batch)
// layout of a model on a cluster before anyone books it, ranks them by the objective (default:
// goodput under chat-serving SLOs) and says why the winner wins; prints the mpirun command
// and hostfile that run the top pick. Plans the model as trained unless --variants asks for
// more. The cluster comes from the topology layer (synthetic spec, hwloc XML files, or this
// machine) plus the planner's own NVLink domains (GB200 NVL72); the numbers from sim's
// catalogs or a calibration file. `--sbatch FILE` writes a Slurm batch script that runs the
// top pick with srun --mpi=pmix.
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/sim/calibration.hpp"
#include "trellis/sim/cluster_spec.hpp"
#include "trellis/sim/launch.hpp"
#include "trellis/sim/planner.hpp"
#include "trellis/sim/units.hpp"
#include "trellis/sim/validate.hpp"
#include "trellis/topology/discovery.hpp"

namespace trellis::launchers {
namespace {

struct PlanOptions {
  std::string model;
  std::string cluster;
  std::vector<std::string> topo_files;
  std::string gpu;
  int gpus = 0;
  double slo_tpot_ms = -1, slo_ttft_ms = -1;  // < 0: not given (the objective's default)
  std::string objective = "goodput";
  std::string batch = "1,2,4,8,16,32,64,128,256";
  std::string variants;  // empty: the variant the model was trained as
  std::string calibration;
  std::string svg;
  std::string sim_model = "refined";
  std::string dtype = "auto";
  std::string validate;
  std::string sbatch;  // FILE, or "-" for stdout
  std::string command_line;  // as typed, for the script's header
  int prompt_len = 1024, gen_len = 512, top = 10, ranks_per_host = 0;
  bool json = false, no_sipipe = false, no_nvlink = false, no_replicas = false;
};

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

// `cores_per_host` (may be null): the smallest host's cores, 0 when unknown.
sim::PlanRequest build_request(const PlanOptions& o, std::optional<sim::Calibration>& cal,
                               int* cores_per_host = nullptr, std::vector<std::string>* host_names = nullptr) {
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
  if (o.sim_model == "appendix") r.kind = sim::ModelKind::kAppendix;
  else if (o.sim_model != "refined")
    throw_error(ErrorCode::kInvalidArgument, "--sim-model '{}': valid: refined, appendix", o.sim_model);
  r.replicas = !o.no_replicas;
  if (cal) apply_calibration(r, *cal);
  return r;
}

std::string layout_name(const sim::Candidate& c) {
  return fmt::format("{}x{}x{}", c.replicas, c.layout.p, c.layout.t);
}

nlohmann::json candidate_json(const sim::Candidate& c) {
  const auto& p = c.prediction;
  nlohmann::json j = {{"replicas", c.replicas}, {"pp", c.layout.p}, {"tp", c.layout.t},
                      {"microbatches", c.layout.microbatches}, {"variant", sim::to_string(c.layout.variant)},
                      {"precision", sim::to_string(c.precision)}, {"batch", c.batch}, {"feasible", p.feasible},
                      {"needs_trained_model", c.needs_trained_model}};
  if (!p.feasible) {
    j["reason"] = p.reason;
    if (c.miss > 0) j["miss"] = c.miss;
    return j;
  }
  j.update({{"tokens_per_s", c.total_tokens_per_s}, {"decode_tokens_per_s", p.decode_tokens_per_s * c.replicas},
            {"tpot_ms", p.tpot_s * 1e3}, {"ttft_ms", p.ttft_s * 1e3}, {"request_latency_s", c.request_latency_s},
            {"memory_per_device_GiB", p.memory.total() / sim::kGiB}, {"tp_link", c.tp_link},
            {"tp_hosts", c.tp_hosts}, {"dominant", p.dominant}, {"warnings", p.warnings}});
  if (!c.slo_miss.empty()) {
    j["slo_miss"] = c.slo_miss;
    j["miss"] = c.miss;
  }
  const auto& d = p.decode;
  j["decode_breakdown_ms"] = {{"compute", d.compute * 1e3}, {"memory_bound", d.compute_memory_bound * 1e3},
                              {"tp_comm", d.tp_comm * 1e3}, {"tp_comm_hidden", d.tp_comm_hidden * 1e3},
                              {"tp_comm_inter_host", d.tp_comm_inter * 1e3},
                              {"logits_gather", d.logits_gather * 1e3}, {"boundary", d.boundary * 1e3},
                              {"sampling", d.sampling * 1e3}, {"input_prep", d.input_prep * 1e3},
                              {"bubble", d.bubble * 1e3}, {"host_gap", d.host_gap * 1e3}};
  return j;
}

std::map<std::string, int> rejection_counts(const sim::PlanResult& res) {
  std::map<std::string, int> n;
  for (const auto& c : res.rejected) {
    std::string k = !c.prediction.feasible ? c.prediction.reason.substr(0, c.prediction.reason.find(':'))
                                           : std::string("latency SLO");
    if (c.prediction.reason.find("attention heads") != std::string::npos) k = "attention heads not divisible by t";
    else if (c.prediction.reason.find("KV heads") != std::string::npos) k = "KV heads vs t";
    else if (c.prediction.reason.find("microbatches") != std::string::npos) k = "microbatches > batch";
    ++n[k];
  }
  return n;
}

// What the ranking maximises, in one line.
std::string objective_line(const sim::PlanRequest& r) {
  const bool slo = r.slo_ttft_s || r.slo_tpot_s;
  switch (r.objective) {
    case sim::Objective::kGoodput:
      return slo ? "goodput: tokens/s of the layouts that meet the SLO (--objective throughput|latency)"
                 : "goodput with no SLO: tokens/s (--objective throughput|latency)";
    case sim::Objective::kThroughput: return "throughput: tokens/s, no default SLO (--objective goodput|latency)";
    case sim::Objective::kLatency:
      return fmt::format("latency: the shortest request (TTFT + {} x TPOT){} (--objective goodput|throughput)",
                         r.work.gen_len, slo ? " among the layouts that meet the SLO" : "");
  }
  return {};
}

// "SLO      TPOT <= 50 ms, TTFT <= 2000 ms (defaults: ...)".
std::string slo_line(const sim::PlanRequest& r, const PlanOptions& o) {
  auto one = [](const std::optional<double>& v) { return v ? fmt::format("{:g} ms", *v * 1e3) : std::string("-"); };
  const bool defaulted = (o.slo_tpot_ms < 0 && r.slo_tpot_s) || (o.slo_ttft_ms < 0 && r.slo_ttft_s);
  return fmt::format("SLO      TPOT <= {}, TTFT <= {}{}\n", one(r.slo_tpot_s), one(r.slo_ttft_s),
                     defaulted ? " (defaults for chat serving, docs/planner.md; --slo-tpot-ms/--slo-ttft-ms change "
                                 "them, 0 drops one)"
                               : "");
}

bool show_precision(const sim::PlanRequest& r) { return r.precisions.size() > 1 || r.work.fp8_linear; }

// One table row; `last` is the text after the TP link column.
std::string row(int i, const sim::Candidate& c, int devices, bool precision, const std::string& last) {
  const auto& p = c.prediction;
  return fmt::format("{:>3} {:>9} {:>3} {:<9}{} {:>5} {:>10.0f} {:>9.1f} {:>9.2f} {:>9.1f} {:>8.1f}  {}{}\n", i,
                     layout_name(c), c.layout.microbatches, sim::to_string(c.layout.variant),
                     precision ? fmt::format(" {:<4}", sim::to_string(c.precision)) : std::string(), c.batch,
                     c.total_tokens_per_s, c.total_tokens_per_s / devices, p.tpot_s * 1e3, p.ttft_s * 1e3,
                     p.memory.total() / sim::kGiB, c.tp_link, last);
}

std::string header(bool precision, const char* last) {
  return fmt::format("{:>3} {:>9} {:>3} {:<9}{} {:>5} {:>10} {:>9} {:>9} {:>9} {:>8}  {}\n", "#", "d x p x t", "m",
                     "variant", precision ? fmt::format(" {:<4}", "prec") : std::string(), "batch", "tokens/s",
                     "tok/s/dev", "TPOT ms", "TTFT ms", "mem GiB", last);
}

std::string label(const sim::Candidate& c) {
  if (c.layout.variant == sim::Variant::kNoComm) return " (bound: outputs wrong)";
  if (c.needs_trained_model) return " (needs a model trained for it)";
  return {};
}

void print_text(const sim::PlanRequest& r, const sim::PlanResult& res, const PlanOptions& o, double ms) {
  const double params = r.model.total_params();
  std::cout << fmt::format("model    {} ({} parameters, {} layers, {} heads / {} KV heads), trained as {}{}\n",
                           r.model.name,
                           params >= 1e9 ? fmt::format("{:.1f} B", params / 1e9) : fmt::format("{:.1f} M", params / 1e6),
                           r.model.layers, r.model.heads, r.model.kv_heads, sim::to_string(r.model.trained_variant),
                           r.model.trained_variant_field.empty()
                               ? std::string()
                               : fmt::format(" (config: {})", r.model.trained_variant_field));
  std::cout << fmt::format("cluster  {}\n", r.cluster.description);
  std::string prec;
  for (auto p : r.precisions) prec += (prec.empty() ? "" : " and ") + std::string(sim::to_string(p));
  if (prec.empty()) prec = r.work.act_bytes >= 4 ? "f32" : r.work.fp8_linear ? "fp8" : "bf16";
  std::cout << fmt::format("workload prompt {} + generate {} tokens, {} weights and KV cache, SiPipe techniques {}, {} model\n",
                           r.work.prompt_len, r.work.gen_len, prec, o.no_sipipe ? "off" : "on", o.sim_model);
  std::string variants;
  for (auto v : r.variants) variants += (variants.empty() ? "" : ",") + std::string(sim::to_string(v));
  std::cout << fmt::format("variants {}{}\n", variants,
                           o.variants.empty() ? " (the model as trained; --variants all for the others, which need a "
                                                "model trained for them)"
                                              : fmt::format(" (all but {} need a model trained for them)",
                                                            sim::to_string(r.model.trained_variant)));
  std::cout << "objective " << objective_line(r) << "\n";
  if (r.slo_tpot_s || r.slo_ttft_s) std::cout << slo_line(r, o);
  std::cout << fmt::format("searched {} layouts in {:.1f} ms: {} within the SLO, {} rejected\n\n", res.evaluated, ms,
                           res.ranked.size(), res.rejected.size());
  for (const auto& w : res.warnings) std::cout << "warning: " << w << "\n";
  const bool precision = show_precision(r);
  const int n = r.devices > 0 ? r.devices : r.cluster.ranks();
  if (res.ranked.empty()) {
    std::cout << "no feasible configuration: binding constraint is " << res.binding_constraint << "\n";
    if (!res.closest.empty()) {
      const bool fits = res.closest.front().prediction.feasible;
      std::cout << "\nclosest misses, one per grid (how far each misses):\n"
                << (fits ? header(precision, "TP link, misses by")
                         : fmt::format("{:>3} {:>9} {:>3} {:<9} {:>5}  {}\n", "#", "d x p x t", "m", "variant", "batch",
                                       "misses by"));
      for (int i = 0; i < std::min<int>(o.top, static_cast<int>(res.closest.size())); ++i) {
        const auto& c = res.closest[static_cast<std::size_t>(i)];
        if (!c.prediction.feasible) {
          const auto& p = c.prediction;
          std::cout << fmt::format("{:>3} {:>9} {:>3} {:<9} {:>5}  memory: needs {:.1f} GiB per device > {:.1f} GiB "
                                   "usable (+{:.0f}%)\n",
                                   i + 1, layout_name(c), c.layout.microbatches, sim::to_string(c.layout.variant),
                                   c.batch, p.memory.total() / sim::kGiB, p.capacity / sim::kGiB, 100 * (c.miss - 1));
        } else {
          std::cout << row(i + 1, c, n, precision, ", " + c.slo_miss + label(c));
        }
      }
    }
    return;
  }
  std::cout << header(precision, "TP link");
  for (int i = 0; i < std::min<int>(o.top, static_cast<int>(res.ranked.size())); ++i) {
    const auto& c = res.ranked[static_cast<std::size_t>(i)];
    std::cout << row(i + 1, c, n, precision, label(c));
  }
  std::cout << "\nwhy #1: " << res.why << "\n";
  if (res.tp_across_hosts) std::cout << res.tp_across_hosts->line << "\n";
  std::cout << "rejected:";
  for (const auto& [k, v] : rejection_counts(res)) std::cout << fmt::format(" {} x {};", v, k);
  std::cout << (res.rejected.empty() ? " none\n" : "\n");
  for (const auto& w : res.ranked.front().prediction.warnings) std::cout << "warning: " << w << "\n";
}

// The checkpoint `trellis run` loads: --model when it is a directory or a config.json (its
// directory), absolute; empty for a catalog name (the script then wants TRELLIS_MODEL).
std::string checkpoint_of(const std::string& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(model);
  if (fs::is_regular_file(p, ec) && p.filename() == "config.json") p = p.parent_path();
  if (!fs::is_directory(p, ec)) return {};
  return fs::absolute(p, ec).lexically_normal().string();
}

// The first ranked layout that computes the model's real outputs (nocomm is a bound).
const sim::Candidate* sbatch_pick(const sim::PlanResult& res) {
  for (const auto& c : res.ranked)
    if (c.layout.variant != sim::Variant::kNoComm) return &c;
  return nullptr;
}

std::string launch_text(const sim::Launch& l, const sim::Candidate& c) {
  const auto& r0 = l.replicas.front();
  std::string s = fmt::format("\nrun #{}: {} x (pp {} x tp {}){}\n", 1, c.replicas, c.layout.p, c.layout.t,
                              c.replicas > 1 ? ", replica 0 shown" : "");
  s += "  cat > hosts.0 <<'EOF'\n";
  for (const auto& line : split(r0.hostfile, '\n')) s += "  " + line + "\n";
  s += "  EOF\n";
  s += "  " + r0.serve + "\n";
  s += "  " + r0.run + "    # or a batch run\n";
  if (l.replicas.size() > 1) {
    const auto& r1 = l.replicas[1];
    std::string hosts1;
    for (auto line : split(r1.hostfile, '\n')) {
      if (const auto hash = line.find("  # "); hash != std::string::npos)
        line = line.substr(0, hash) + " (" + line.substr(hash + 4) + ")";
      hosts1 += (hosts1.empty() ? "" : ", ") + line;
    }
    s += fmt::format("  replica 1: hosts.1 = {}{}, --port {}; and so on\n", hosts1,
                     r1.devices.empty() ? std::string() : ", CUDA_VISIBLE_DEVICES=" + r1.devices, r1.port);
  }
  for (const auto& n : l.notes) s += "  note: " + n + "\n";
  return s;
}

nlohmann::json launch_json(const sim::Launch& l) {
  nlohmann::json j = {{"model", l.model}, {"notes", l.notes}};
  j["replicas"] = nlohmann::json::array();
  for (const auto& r : l.replicas)
    j["replicas"].push_back({{"hostfile", r.hostfile}, {"cuda_visible_devices", r.devices}, {"port", r.port},
                             {"serve", r.serve}, {"run", r.run}});
  return j;
}

nlohmann::json tp_across_json(const sim::TpAcrossHosts& x) {
  nlohmann::json j = {{"hosts", x.hosts}, {"domain", x.domain}, {"link", x.link},
                      {"link_GBps_per_rank", x.link_bandwidth / 1e9}, {"inter_host_ms_per_step", x.inter_s * 1e3},
                      {"decode_step_ms", x.step_s * 1e3}, {"gain", x.gain}, {"explanation", x.line}};
  if (x.alternative) j["best_tp_inside_a_host"] = candidate_json(*x.alternative);
  return j;
}

int run_plan(Session&, const PlanOptions& o) {
  std::optional<sim::Calibration> cal;
  int cores_per_host = 0;
  std::vector<std::string> hosts;
  sim::PlanRequest r = build_request(o, cal, &cores_per_host, &hosts);
  if (o.sbatch == "-" && o.json) throw_error(ErrorCode::kInvalidArgument, "--sbatch - and --json both want stdout");
  if (!o.validate.empty()) {
    std::cout << sim::format_validation(sim::validate(r, sim::load_measurements(o.validate), cal ? &*cal : nullptr));
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  sim::PlanResult res = sim::plan(r);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!o.svg.empty()) {
    std::ofstream f(o.svg);
    if (!f) throw_error(ErrorCode::kIo, "--svg {}: cannot write", o.svg);
    f << sim::pareto_svg(res, fmt::format("{} on {} x {} {}: Pareto frontier per variant ({} model)", r.model.name,
                                          r.cluster.hosts, r.cluster.devices_per_host, r.cluster.device.name,
                                          o.sim_model));
  }
  const sim::Candidate* top = sbatch_pick(res);
  const sim::Candidate* pick = o.sbatch.empty() ? nullptr : top;
  if (!o.sbatch.empty() && !res.ranked.empty()) {
    if (!pick) throw_error(ErrorCode::kNotFound, "--sbatch: every ranked layout is the nocomm bound (outputs wrong)");
    const std::string script = sim::sbatch_script(r, *pick, checkpoint_of(o.model), o.command_line, cores_per_host);
    if (o.sbatch == "-") {
      std::cout << script;
      return 0;
    }
    std::ofstream f(o.sbatch);
    if (!f || !(f << script)) throw_error(ErrorCode::kIo, "--sbatch {}: cannot write", o.sbatch);
    f.close();
    std::error_code ec;
    std::filesystem::permissions(o.sbatch, std::filesystem::perms::owner_exec | std::filesystem::perms::group_exec,
                                 std::filesystem::perm_options::add, ec);
  }
  std::optional<sim::Launch> launch;
  if (top) launch = sim::launch_commands(r, *top, hosts, checkpoint_of(o.model));
  if (o.json) {
    nlohmann::json j = {{"model", r.model.name}, {"trained_variant", sim::to_string(r.model.trained_variant)},
                        {"cluster", r.cluster.description}, {"objective", sim::to_string(r.objective)},
                        {"evaluated", res.evaluated}, {"search_ms", ms}, {"binding_constraint", res.binding_constraint},
                        {"why", res.why}, {"warnings", res.warnings}};
    j["slo"] = {{"ttft_ms", r.slo_ttft_s ? nlohmann::json(*r.slo_ttft_s * 1e3) : nlohmann::json()},
                {"tpot_ms", r.slo_tpot_s ? nlohmann::json(*r.slo_tpot_s * 1e3) : nlohmann::json()},
                {"ttft_default", o.slo_ttft_ms < 0 && r.slo_ttft_s.has_value()},
                {"tpot_default", o.slo_tpot_ms < 0 && r.slo_tpot_s.has_value()}};
    j["ranked"] = nlohmann::json::array();
    for (int i = 0; i < std::min<int>(o.top, static_cast<int>(res.ranked.size())); ++i)
      j["ranked"].push_back(candidate_json(res.ranked[static_cast<std::size_t>(i)]));
    if (res.ranked.empty()) {
      j["closest"] = nlohmann::json::array();
      for (int i = 0; i < std::min<int>(o.top, static_cast<int>(res.closest.size())); ++i)
        j["closest"].push_back(candidate_json(res.closest[static_cast<std::size_t>(i)]));
    }
    if (res.tp_across_hosts) j["tp_across_hosts"] = tp_across_json(*res.tp_across_hosts);
    if (launch) j["launch"] = launch_json(*launch);
    j["rejected_counts"] = rejection_counts(res);
    if (pick) j["sbatch"] = {{"file", o.sbatch}, {"layout", candidate_json(*pick)}};
    std::cout << versioned_json(j) << "\n";
  } else {
    print_text(r, res, o, ms);
    if (launch) std::cout << launch_text(*launch, *top);
    if (pick)
      std::cout << fmt::format("sbatch script for {} (pp {} x tp {}, {}) written to {}: sbatch {}\n", layout_name(*pick),
                               pick->layout.p, pick->layout.t, sim::to_string(pick->layout.variant), o.sbatch, o.sbatch);
  }
  return res.ranked.empty() ? 1 : 0;
}

}  // namespace

Action define_plan(CLI::App& sub) {
  auto o = std::make_shared<PlanOptions>();
  sub.add_option("--model", o->model, "Catalog model (" + sim::model_names() + ") or a config.json path")->required();
  sub.add_option("--cluster", o->cluster,
                 "Synthetic spec (hosts=2,gpus=8,gpu=H100-SXM,nics=8x400g-ib; see `trellis topo --help`; plus "
                 "nvlink-domain=N and any catalog GPU), HOSTSxGPUSxGPU[-FABRIC] like 2x8xH100-NDR or 2x8xH20-ROCE400, "
                 "or RACKSxNVL72[-FABRIC] like 1xNVL72 (GB200 NVL72: 18 trays x 4 GPUs, one NVLink domain). "
                 "Default: this machine");
  sub.add_option("--topo-file", o->topo_files, "hwloc XML file per host, or NxFILE; repeatable");
  sub.add_option("--gpu", o->gpu, "Device catalog entry to use instead of the topology's model (" + sim::device_names() + ")");
  sub.add_option("--ranks-per-host", o->ranks_per_host, "CPU hosts: ranks per host (default: one per NUMA node)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--gpus", o->gpus, "Devices to use (default: all)")->check(CLI::NonNegativeNumber);
  const CLI::Validator slo_check(
      [](std::string& v) {
        try {
          return std::stod(v) >= 0 ? std::string() : std::string("must be >= 0 ms (0 drops the SLO)");
        } catch (const std::exception&) {
          return std::string("not a number of milliseconds");
        }
      },
      "MS");
  sub.add_option("--objective", o->objective,
                 "goodput (tokens/s of layouts meeting the SLOs), throughput (tokens/s; no default SLOs) or latency "
                 "(shortest request meeting the SLOs)")
      ->capture_default_str();
  sub.add_option("--slo-tpot-ms", o->slo_tpot_ms,
                 fmt::format("Largest acceptable time per output token (default {:g} ms under goodput/latency on "
                             "GPUs; 0: none)",
                             sim::kDefaultSloTpotS * 1e3))
      ->check(slo_check);
  sub.add_option("--slo-ttft-ms", o->slo_ttft_ms,
                 fmt::format("Largest acceptable time to first token (default {:g} ms under goodput/latency on "
                             "GPUs; 0: none)",
                             sim::kDefaultSloTtftS * 1e3))
      ->check(slo_check);
  sub.add_option("--batch", o->batch, "Concurrent sequences per replica, e.g. 1,4,16 or 1-256")->capture_default_str();
  sub.add_option("--prompt-len", o->prompt_len, "Prompt tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_option("--gen-len", o->gen_len, "Generated tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_option("--variants", o->variants,
                 "Default: the variant the model was trained as (standard, or parallel when its config says so). "
                 "all, or a list of standard,parallel,ladder,desync2,desync4,lp,nocomm: the others need a model "
                 "trained for them");
  sub.add_option("--calibration", o->calibration, "Calibration JSON from `trellis bench comm` (schema: docs/planner.md)");
  sub.add_option("--sim-model", o->sim_model, "refined (default) or appendix (SiPipe eq. 1-10 as written)");
  sub.add_option("--dtype", o->dtype,
                 "Weights and KV cache: auto (bf16 on GPUs, f32 on CPUs), bf16, fp8 (e4m3, on GPUs with FP8 tensor "
                 "cores: " + sim::fp8_device_names() + "), f32, a list like bf16,fp8, or all")
      ->capture_default_str();
  sub.add_option("--top", o->top, "Rows to print")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_flag("--no-sipipe", o->no_sipipe, "Model a pipeline without SiPipe's CPU sampling, token-safe inputs and SAT");
  sub.add_flag("--no-nvlink", o->no_nvlink, "Treat NVLink as absent (interconnect study)");
  sub.add_flag("--no-replicas", o->no_replicas, "Only layouts with p x t = all devices (no data-parallel replicas)");
  sub.add_option("--svg", o->svg, "Write the throughput-TPOT Pareto frontier per variant to this SVG file");
  sub.add_option("--validate", o->validate, "Compare predictions with measured runs in this JSON file (docs/planner.md)");
  sub.add_option("--sbatch", o->sbatch,
                 "Write a Slurm batch script for the top pick to FILE (- prints it instead of the table): "
                 "#SBATCH --nodes/--ntasks-per-node/--gpus-per-task and `srun --mpi=pmix trellis run ...` "
                 "(docs/launch.md)");
  sub.add_flag("--json", o->json, "Print JSON");
  CLI::App* app = &sub;  // outlives the action: the CLI app runs it after parsing
  return [o, app](Session& s) {
    o->command_line = "trellis plan";
    for (const CLI::Option* opt : app->get_options()) {
      if (opt->count() == 0 || opt->get_name() == "--help") continue;
      const std::string name = opt->get_name(false, true);
      if (opt->get_expected_min() == 0) {
        o->command_line += " " + name;
        continue;
      }
      for (const auto& v : opt->results()) o->command_line += " " + name + " " + sim::shell_quote(v);
    }
    return run_plan(s, *o);
  };
}

}  // namespace trellis::launchers
