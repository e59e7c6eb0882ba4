// `trellis plan`: predicts every (replicas, p, t, microbatches, variant, batch) layout of a
// model on a cluster before anyone books it, ranks them by throughput under the SLO and
// says why the winner wins. The cluster comes from the topology layer (synthetic spec,
// hwloc XML files, or this machine); the numbers from sim's catalogs or a calibration file.
// `--sbatch FILE` writes a Slurm batch script that runs the top pick with srun --mpi=pmix.
#include <spdlog/spdlog.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/sim/calibration.hpp"
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
  double slo_tpot_ms = 0, slo_ttft_ms = 0;
  std::string batch = "1,4,16,64,256";
  std::string variants = "all";
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

// "2x8xH100-NDR" -> a synthetic spec. Known fabrics: ndr, hdr, roce100/200/400, tcp.
std::string expand_shorthand(const std::string& text) {
  auto parts = split(text, 'x');
  const std::string valid = "use a synthetic spec (key=value,..., see `trellis topo --help`) or HOSTSxGPUSxGPU[-FABRIC] "
                            "such as 2x8xH100-NDR, with FABRIC one of ndr, hdr, roce100, roce200, roce400, tcp and GPU one of " +
                            sim::device_names();
  if (parts.size() != 3) throw_error(ErrorCode::kNotFound, "unknown cluster '{}'; {}", text, valid);
  std::string gpu = parts[2], nics;
  const std::map<std::string, std::string> fabrics = {{"ndr", "400g-ib"},     {"hdr", "200g-ib"},
                                                      {"roce100", "100g-roce"}, {"roce200", "200g-roce"},
                                                      {"roce400", "400g-roce"}, {"tcp", "100g-eth"}};
  for (const auto& [suffix, nic] : fabrics) {
    const std::string s = "-" + suffix;
    if (to_lower(gpu).size() > s.size() && to_lower(gpu).ends_with(s)) {
      gpu = gpu.substr(0, gpu.size() - s.size());
      nics = (suffix == "tcp" ? "1x" : parts[1] + "x") + nic;
    }
  }
  if (nics.empty()) nics = parts[1] + "x400g-ib";
  try {
    gpu = sim::find_device(gpu).name;
    parse_int(parts[0], "hosts");
    parse_int(parts[1], "gpus");
  } catch (const Error& e) {
    throw_error(ErrorCode::kNotFound, "unknown cluster '{}' ({}); {}", text, e.what(), valid);
  }
  if (gpu == "cpu") return fmt::format("hosts={}", parts[0]);
  return fmt::format("hosts={},gpus={},gpu={},nics={}", parts[0], parts[1], gpu == "H200" ? "H200-SXM" : gpu, nics);
}

topology::Topology load_cluster(const PlanOptions& o, std::string& device_override) {
  if (!o.cluster.empty() && !o.topo_files.empty())
    throw_error(ErrorCode::kInvalidArgument, "--cluster and --topo-file: give one of them");
  if (!o.topo_files.empty()) return topology::load_xml_hosts(o.topo_files);
  if (o.cluster.empty()) {
    topology::Topology t;
    t.hosts.push_back(topology::discover_local_host());
    t.fabric = topology::derive_fabric(t.hosts);
    return t;
  }
  std::string spec = o.cluster.find('=') == std::string::npos ? expand_shorthand(o.cluster) : o.cluster;
  // The topology's synthetic GPUs are a subset of sim's catalog; B200 is modelled on an
  // H100-SXM host shape with B200 figures.
  if (spec.find("gpu=B200") != std::string::npos) {
    spec.replace(spec.find("gpu=B200"), 8, "gpu=H100-SXM,nvlink-bw=900GB");
    if (device_override.empty()) device_override = "B200";
  }
  return topology::parse_synthetic(spec);
}

std::vector<sim::Variant> parse_variants(const std::string& text) {
  if (text == "all") return sim::all_variants();
  std::vector<sim::Variant> v;
  for (const auto& s : split(text, ',')) v.push_back(sim::parse_variant(std::string(trim(s))));
  return v;
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
                               int* cores_per_host = nullptr) {
  sim::PlanRequest r;
  r.model = sim::load_model(o.model);
  std::string device = o.gpu;
  topology::Topology topo = load_cluster(o, device);
  if (cores_per_host) {
    *cores_per_host = 0;
    for (const auto& h : topo.hosts)
      *cores_per_host = *cores_per_host == 0 ? h.core_count() : std::min(*cores_per_host, h.core_count());
  }
  if (o.no_nvlink) topo = topology::without_nvlink(std::move(topo));
  if (!o.calibration.empty()) cal = sim::Calibration::load(o.calibration);
  r.cluster = sim::make_cluster_view(topo, device, cal ? &*cal : nullptr, o.ranks_per_host);
  const bool f32 = o.dtype == "f32" || (o.dtype == "auto" && r.cluster.device.kind == sim::DeviceKind::kCpu);
  if (o.dtype != "auto" && o.dtype != "f32" && o.dtype != "bf16")
    throw_error(ErrorCode::kInvalidArgument, "--dtype '{}': valid: auto, bf16, f32", o.dtype);
  r.work.weight_bytes = r.work.kv_bytes = r.work.act_bytes = f32 ? 4 : 2;
  r.work.prompt_len = o.prompt_len;
  r.work.gen_len = o.gen_len;
  r.devices = o.gpus;
  r.batches.clear();
  for (auto b : parse_int_list(o.batch, "--batch")) {
    if (b < 1) throw_error(ErrorCode::kInvalidArgument, "--batch: {} is not >= 1", b);
    r.batches.push_back(static_cast<int>(b));
  }
  r.variants = parse_variants(o.variants);
  if (o.slo_tpot_ms > 0) r.slo_tpot_s = o.slo_tpot_ms * 1e-3;
  if (o.slo_ttft_ms > 0) r.slo_ttft_s = o.slo_ttft_ms * 1e-3;
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
                      {"batch", c.batch}, {"feasible", p.feasible}};
  if (!p.feasible) {
    j["reason"] = p.reason;
    return j;
  }
  j.update({{"tokens_per_s", c.total_tokens_per_s}, {"decode_tokens_per_s", p.decode_tokens_per_s * c.replicas},
            {"tpot_ms", p.tpot_s * 1e3}, {"ttft_ms", p.ttft_s * 1e3},
            {"memory_per_device_GiB", p.memory.total() / sim::kGiB}, {"tp_link", c.tp_link},
            {"dominant", p.dominant}, {"warnings", p.warnings}});
  if (!c.slo_miss.empty()) j["slo_miss"] = c.slo_miss;
  const auto& d = p.decode;
  j["decode_breakdown_ms"] = {{"compute", d.compute * 1e3}, {"memory_bound", d.compute_memory_bound * 1e3},
                              {"tp_comm", d.tp_comm * 1e3}, {"tp_comm_hidden", d.tp_comm_hidden * 1e3},
                              {"logits_gather", d.logits_gather * 1e3}, {"boundary", d.boundary * 1e3},
                              {"sampling", d.sampling * 1e3}, {"input_prep", d.input_prep * 1e3},
                              {"bubble", d.bubble * 1e3}};
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

void print_text(const sim::PlanRequest& r, const sim::PlanResult& res, const PlanOptions& o, double ms) {
  const double params = r.model.total_params();
  std::cout << fmt::format("model    {} ({} parameters, {} layers, {} heads / {} KV heads)\n", r.model.name,
                           params >= 1e9 ? fmt::format("{:.1f} B", params / 1e9) : fmt::format("{:.1f} M", params / 1e6),
                           r.model.layers, r.model.heads, r.model.kv_heads);
  std::cout << fmt::format("cluster  {}\n", r.cluster.description);
  std::cout << fmt::format("workload prompt {} + generate {} tokens, {} per element, SiPipe techniques {}, {} model\n",
                           r.work.prompt_len, r.work.gen_len, r.work.act_bytes >= 4 ? "f32" : "bf16",
                           o.no_sipipe ? "off" : "on", o.sim_model);
  if (r.slo_tpot_s || r.slo_ttft_s)
    std::cout << fmt::format("SLO      TPOT <= {} ms, TTFT <= {} ms\n", o.slo_tpot_ms > 0 ? fmt::format("{:g}", o.slo_tpot_ms) : "-",
                             o.slo_ttft_ms > 0 ? fmt::format("{:g}", o.slo_ttft_ms) : "-");
  std::cout << fmt::format("searched {} layouts in {:.1f} ms: {} within the SLO, {} rejected\n\n", res.evaluated, ms,
                           res.ranked.size(), res.rejected.size());
  for (const auto& w : res.warnings) std::cout << "warning: " << w << "\n";
  if (res.ranked.empty()) {
    std::cout << "no feasible configuration: binding constraint is " << res.binding_constraint << "\n";
    return;
  }
  std::cout << fmt::format("{:>3} {:>9} {:>3} {:<9} {:>5} {:>10} {:>9} {:>9} {:>9} {:>8}  {}\n", "#", "d x p x t", "m",
                           "variant", "batch", "tokens/s", "tok/s/dev", "TPOT ms", "TTFT ms", "mem GiB", "TP link");
  const int n = r.devices > 0 ? r.devices : r.cluster.ranks();
  for (int i = 0; i < std::min<int>(o.top, static_cast<int>(res.ranked.size())); ++i) {
    const auto& c = res.ranked[static_cast<std::size_t>(i)];
    const auto& p = c.prediction;
    std::cout << fmt::format("{:>3} {:>9} {:>3} {:<9} {:>5} {:>10.0f} {:>9.1f} {:>9.2f} {:>9.1f} {:>8.1f}  {}{}\n", i + 1,
                             layout_name(c), c.layout.microbatches, sim::to_string(c.layout.variant), c.batch,
                             c.total_tokens_per_s, c.total_tokens_per_s / n, p.tpot_s * 1e3, p.ttft_s * 1e3,
                             p.memory.total() / sim::kGiB, c.tp_link,
                             c.layout.variant == sim::Variant::kNoComm ? " (bound: outputs wrong)" : "");
  }
  std::cout << "\nwhy #1: " << res.why << "\n";
  std::cout << "rejected:";
  for (const auto& [k, v] : rejection_counts(res)) std::cout << fmt::format(" {} x {};", v, k);
  std::cout << (res.rejected.empty() ? " none\n" : "\n");
  for (const auto& w : res.ranked.front().prediction.warnings) std::cout << "warning: " << w << "\n";
}

// Quotes a word for a POSIX shell when it needs it.
std::string shell_quote(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,/:@%") ==
                        std::string::npos)
    return w;
  std::string out = "'";
  for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
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

// A Slurm batch script for one candidate: one job step of p x t tasks started by
// `srun --mpi=pmix` (each replica is one task of a job array), as many tasks per node as
// the plan put ranks on a host, one GPU per task on GPU clusters.
std::string sbatch_script(const sim::PlanRequest& r, const sim::Candidate& c, const PlanOptions& o, int cores_per_host) {
  const int ranks = c.layout.p * c.layout.t;
  const int per_host = std::max(1, std::min(r.cluster.devices_per_host, ranks));
  const int nodes = (ranks + per_host - 1) / per_host;
  const bool gpu = r.cluster.device.kind == sim::DeviceKind::kGpu;
  const int cpus_per_task = cores_per_host > 0 ? std::max(1, cores_per_host / std::max(1, r.cluster.devices_per_host)) : 0;
  const std::string checkpoint = checkpoint_of(o.model);
  // A catalog name, or the checkpoint directory's name: what Slurm lists the job as.
  std::string name = checkpoint.empty() ? r.model.name : std::filesystem::path(checkpoint).filename().string();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_') ch = '-';
  const auto& p = c.prediction;
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# trellis plan's pick for {} on {}:\n", checkpoint.empty() ? r.model.name : checkpoint,
                   r.cluster.description);
  s += fmt::format("#   {} replica(s) x pp {} x tp {}, variant {}, batch {} per replica, {} microbatch(es);\n", c.replicas,
                   c.layout.p, c.layout.t, sim::to_string(c.layout.variant), c.batch, c.layout.microbatches);
  s += fmt::format("#   predicted {:.0f} tokens/s in all, TPOT {:.2f} ms, TTFT {:.1f} ms, {:.1f} GiB per {}.\n",
                   c.total_tokens_per_s, p.tpot_s * 1e3, p.ttft_s * 1e3, p.memory.total() / sim::kGiB,
                   gpu ? "GPU" : "rank");
  s += fmt::format("# Written by: {}\n", o.command_line);
  s += "# Submit: sbatch THIS_FILE";
  s += checkpoint.empty() ? fmt::format(" with TRELLIS_MODEL=<{}'s checkpoint: a directory with config.json and "
                                        "safetensors, or a .gguf>",
                                        r.model.name)
                          : " (TRELLIS_MODEL=... to load another checkpoint)";
  s += "; TRELLIS=... picks the binary. docs/launch.md\n";
  s += fmt::format("#SBATCH --job-name=trellis-{}-{}\n", name, layout_name(c));
  s += fmt::format("#SBATCH --nodes={}\n", nodes);
  if (ranks % per_host != 0) s += fmt::format("#SBATCH --ntasks={}\n", ranks);
  s += fmt::format("#SBATCH --ntasks-per-node={}\n", per_host);
  if (gpu) s += "#SBATCH --gpus-per-task=1\n";
  if (cpus_per_task > 0) s += fmt::format("#SBATCH --cpus-per-task={}\n", cpus_per_task);
  if (c.replicas > 1) {
    s += fmt::format("# One array task per data-parallel replica ({}); give each its own prompts (--prompts).\n",
                     c.replicas);
    s += fmt::format("#SBATCH --array=0-{}\n", c.replicas - 1);
  }
  s += "#SBATCH --output=trellis-%j.out\n";
  s += "set -euo pipefail\n";
  s += "TRELLIS=${TRELLIS:-trellis}\n";
  s += fmt::format("MODEL=${{TRELLIS_MODEL:-{}}}\n", shell_quote(checkpoint));
  s += fmt::format("[ -n \"$MODEL\" ] && [ -e \"$MODEL\" ] || {{ echo \"set TRELLIS_MODEL to {}'s checkpoint "
                   "(directory with config.json + safetensors, or a .gguf); got '$MODEL'\" >&2; exit 2; }}\n",
                   name);
  s += "# srun starts the tasks on the nodes Slurm gave; PMIx (--mpi=pmix) gives each its MPI rank.\n";
  s += fmt::format("srun --mpi=pmix \"$TRELLIS\" run --model \"$MODEL\" --pp {} --tp {}", c.layout.p, c.layout.t);
  if (c.layout.variant != sim::Variant::kStandard) s += fmt::format(" --variant {}", sim::to_string(c.layout.variant));
  s += fmt::format(" --max-seqs {} \\\n  --workload n={},in={},out={} --out \"trellis-$SLURM_JOB_ID.jsonl\"\n",
                   c.batch, c.batch, r.work.prompt_len, r.work.gen_len);
  return s;
}

int run_plan(Session&, const PlanOptions& o) {
  std::optional<sim::Calibration> cal;
  int cores_per_host = 0;
  sim::PlanRequest r = build_request(o, cal, &cores_per_host);
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
  const sim::Candidate* pick = o.sbatch.empty() ? nullptr : sbatch_pick(res);
  if (!o.sbatch.empty() && !res.ranked.empty()) {
    if (!pick) throw_error(ErrorCode::kNotFound, "--sbatch: every ranked layout is the nocomm bound (outputs wrong)");
    const std::string script = sbatch_script(r, *pick, o, cores_per_host);
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
  if (o.json) {
    nlohmann::json j = {{"model", r.model.name}, {"cluster", r.cluster.description}, {"evaluated", res.evaluated},
                        {"search_ms", ms}, {"binding_constraint", res.binding_constraint}, {"why", res.why},
                        {"warnings", res.warnings}};
    j["ranked"] = nlohmann::json::array();
    for (int i = 0; i < std::min<int>(o.top, static_cast<int>(res.ranked.size())); ++i)
      j["ranked"].push_back(candidate_json(res.ranked[static_cast<std::size_t>(i)]));
    j["rejected_counts"] = rejection_counts(res);
    if (pick) j["sbatch"] = {{"file", o.sbatch}, {"layout", candidate_json(*pick)}};
    std::cout << j.dump(2) << "\n";
  } else {
    print_text(r, res, o, ms);
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
                 "Synthetic spec (hosts=2,gpus=8,gpu=H100-SXM,nics=8x400g-ib; see `trellis topo --help`) or "
                 "HOSTSxGPUSxGPU[-FABRIC] like 2x8xH100-NDR. Default: this machine");
  sub.add_option("--topo-file", o->topo_files, "hwloc XML file per host, or NxFILE; repeatable");
  sub.add_option("--gpu", o->gpu, "Device catalog entry to use instead of the topology's model (" + sim::device_names() + ")");
  sub.add_option("--ranks-per-host", o->ranks_per_host, "CPU hosts: ranks per host (default: one per NUMA node)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--gpus", o->gpus, "Devices to use (default: all)")->check(CLI::NonNegativeNumber);
  sub.add_option("--slo-tpot-ms", o->slo_tpot_ms, "Largest acceptable time per output token");
  sub.add_option("--slo-ttft-ms", o->slo_ttft_ms, "Largest acceptable time to first token");
  sub.add_option("--batch", o->batch, "Concurrent sequences per replica, e.g. 1,4,16 or 1-256")->capture_default_str();
  sub.add_option("--prompt-len", o->prompt_len, "Prompt tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_option("--gen-len", o->gen_len, "Generated tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_option("--variants", o->variants, "all, or a list of standard,parallel,ladder,desync2,desync4,lp,nocomm")
      ->capture_default_str();
  sub.add_option("--calibration", o->calibration, "Calibration JSON from `trellis bench comm` (schema: docs/planner.md)");
  sub.add_option("--sim-model", o->sim_model, "refined (default) or appendix (SiPipe eq. 1-10 as written)");
  sub.add_option("--dtype", o->dtype, "auto (bf16 on GPUs, f32 on CPUs), bf16 or f32")->capture_default_str();
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
      for (const auto& v : opt->results()) o->command_line += " " + name + " " + shell_quote(v);
    }
    return run_plan(s, *o);
  };
}

}  // namespace trellis::launchers
