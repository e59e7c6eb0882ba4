// `trellis plan`: predicts every (replicas, p, t, microbatches, variant, precision, batch)
// layout of a model on a cluster before anyone books it, ranks them by the objective (default:
// goodput under chat-serving SLOs) and says why the winner wins; prints the mpirun command
// and hostfile that run the top pick. Plans the model as trained unless --variants asks for
// more. The cluster comes from the topology layer (synthetic spec, hwloc XML files, or this
// machine) plus the planner's own NVLink domains (GB200 NVL72); the numbers from sim's
// catalogs or a calibration file. `--sbatch FILE` writes a Slurm batch script that runs the
// top pick with srun --mpi=pmix.
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
#include "commands.hpp"
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


std::string layout_name(const sim::Candidate& c) {
  return fmt::format("{}x{}x{}", c.replicas, c.layout.p, c.layout.t);
}

nlohmann::json candidate_json(const sim::Candidate& c) {
  const auto& p = c.prediction;
  nlohmann::json j = {{"replicas", c.replicas}, {"pp", c.layout.p}, {"tp", c.layout.t},
                      {"microbatches", c.layout.microbatches}, {"prefill_chunk", c.layout.prefill_chunk},
                      {"variant", sim::to_string(c.layout.variant)},
                      {"precision", sim::to_string(c.precision)}, {"ep", c.layout.ep}, {"batch", c.batch}, {"feasible", p.feasible},
                      {"needs_trained_model", c.needs_trained_model},
                      {"layers_per_stage", p.layers_per_stage}};
  if (!p.feasible) {
    j["reason"] = p.reason;
    if (c.miss > 0) j["miss"] = c.miss;
    return j;
  }
  j.update({{"tokens_per_s", c.total_tokens_per_s}, {"decode_tokens_per_s", p.decode_tokens_per_s * c.replicas},
            {"tpot_ms", p.tpot_s * 1e3}, {"ttft_ms", p.ttft_s * 1e3}, {"request_latency_s", c.request_latency_s},
            {"memory_per_device_GiB", p.memory.total() / sim::kGiB}, {"tp_link", c.tp_link}, {"ep_link", c.ep_link},
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
                              {"bubble", d.bubble * 1e3}, {"host_gap", d.host_gap * 1e3},
                              {"ep_alltoall", d.ep_comm * 1e3}};
  // Whole prompts: the wave's microbatches and its fill and drain; chunked: the iterations
  // until the first token, the share of iterations carrying a chunk, what they add to TPOT.
  j["prefill"] = {{"chunk", c.layout.prefill_chunk}, {"microbatches", p.prefill_microbatches},
                  {"iterations", p.prefill_iterations}, {"fill_drain_ms", p.prefill_fill_drain_s * 1e3},
                  {"chunk_share", p.chunk_share}, {"chunk_step_ms", p.chunk_step_s * 1e3},
                  {"tpot_interference_ms", p.interference_s * 1e3}};
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

// The chunk column: "whole" for whole prompts (the wave), else the chunk in tokens.
std::string chunk_cell(int chunk) { return chunk > 0 ? std::to_string(chunk) : std::string("whole"); }

// One table row; `last` is the text after the TP link column.
// `ep`: the model has experts: an ep column, and the EP group's link after the TP link.
std::string row(int i, const sim::Candidate& c, int devices, bool precision, const std::string& last,
                bool ep = false) {
  const auto& p = c.prediction;
  return fmt::format("{:>3} {:>9} {:>3}{} {:<9}{} {:>5} {:>5} {:>10.0f} {:>9.1f} {:>9.2f} {:>9.1f} {:>8.1f}  {}{}{}\n", i,
                     layout_name(c), c.layout.microbatches, ep ? fmt::format(" {:>3}", c.layout.ep) : std::string(),
                     sim::to_string(c.layout.variant),
                     precision ? fmt::format(" {:<4}", sim::to_string(c.precision)) : std::string(), c.batch,
                     chunk_cell(c.layout.prefill_chunk), c.total_tokens_per_s, c.total_tokens_per_s / devices, p.tpot_s * 1e3, p.ttft_s * 1e3,
                     p.memory.total() / sim::kGiB, c.tp_link,
                     ep && c.layout.ep > 1 ? ", EP " + c.ep_link : std::string(), last);
}

std::string header(bool precision, const char* last, bool ep = false) {
  return fmt::format("{:>3} {:>9} {:>3}{} {:<9}{} {:>5} {:>5} {:>10} {:>9} {:>9} {:>9} {:>8}  {}\n", "#", "d x p x t",
                     "m", ep ? fmt::format(" {:>3}", "ep") : std::string(), "variant", precision ? fmt::format(" {:<4}", "prec") : std::string(), "batch", "chunk",
                     "tokens/s",
                     "tok/s/dev", "TPOT ms", "TTFT ms", "mem GiB", last);
}

std::string label(const sim::Candidate& c) {
  if (c.layout.variant == sim::Variant::kNoComm) return " (bound: outputs wrong)";
  if (c.needs_trained_model) return " (needs a model trained for it)";
  return {};
}

// Experts and latent attention, in one line under the model's.
std::string moe_line(const sim::PlanRequest& r) {
  const sim::ModelSpec& m = r.model;
  std::string s;
  if (m.is_moe())
    s = fmt::format("{:.1f} B active per token: {} of {} layers MoE, {} routed experts (top {}, width {}){}; ep = "
                    "experts spread over ep ranks (1: each expert split over t), load imbalance {:g} assumed",
                    m.active_params() / 1e9, m.moe_layers_in(0, m.layers), m.layers, m.moe.experts, m.moe.top_k,
                    m.moe.expert_intermediate,
                    m.moe.shared_intermediate > 0 ? fmt::format(" + shared width {}", m.moe.shared_intermediate)
                                                  : std::string(),
                    r.expert_imbalance);
  if (m.is_mla())
    s += fmt::format("{}MLA: KV cache {} + {} elements per token per layer (latent + RoPE key), absorbed weights",
                     s.empty() ? "" : "; ", m.mla.kv_lora_rank, m.mla.qk_rope_head_dim);
  return s;
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
  if (r.model.is_moe() || r.model.is_mla()) std::cout << "         " << moe_line(r) << "\n";
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
  if (r.swift) std::cout << "swift    " << sim::describe_swift(*r.swift) << "\n";
  std::cout << "objective " << objective_line(r) << "\n";
  if (r.slo_tpot_s || r.slo_ttft_s) std::cout << slo_line(r, o);
  std::cout << fmt::format("searched {} layouts in {:.1f} ms: {} within the SLO, {} rejected\n\n", res.evaluated, ms,
                           res.ranked.size(), res.rejected.size());
  for (const auto& w : res.warnings) std::cout << "warning: " << w << "\n";
  const bool precision = show_precision(r);
  const bool moe = r.model.is_moe();
  const int n = r.devices > 0 ? r.devices : r.cluster.ranks();
  if (res.ranked.empty()) {
    std::cout << "no feasible configuration: binding constraint is " << res.binding_constraint << "\n";
    if (!res.closest.empty()) {
      const bool fits = res.closest.front().prediction.feasible;
      std::cout << "\nclosest misses, one per grid (how far each misses):\n"
                << (fits ? header(precision, moe ? "TP link (, EP link), misses by" : "TP link, misses by", moe)
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
          std::cout << row(i + 1, c, n, precision, ", " + c.slo_miss + label(c), moe);
        }
      }
    }
    return;
  }
  std::cout << header(precision, moe ? "TP link (, EP link)" : "TP link", moe);
  for (int i = 0; i < std::min<int>(o.top, static_cast<int>(res.ranked.size())); ++i) {
    const auto& c = res.ranked[static_cast<std::size_t>(i)];
    std::cout << row(i + 1, c, n, precision, label(c), moe);
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
  if (o.validate_published) return run_validate_published(o.published, o.json);
  if (o.model.empty()) {  // a usage error (exit 2), as when the parser required it
    spdlog::error("--model is required (a catalog model or a config.json), except with --validate-published");
    return 2;
  }
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
    if (r.swift)
      j["swift"] = {{"m", r.swift->m}, {"alpha", r.swift->alpha}, {"r", r.swift->r},
                    {"speedup", sim::swift_speedup(*r.swift)}, {"source", "estimate: Eq. (6), SWIFT paper appendix B.3"},
                    {"measured", false}, {"description", sim::describe_swift(*r.swift)}};
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
  sub.add_option("--model", o->model,
                 "Catalog model (" + sim::model_names() + ") or a config.json path (required unless "
                 "--validate-published)");
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
  sub.add_option("--prefill-chunk", o->prefill_chunk,
                 "Prefill chunk sizes to plan, tokens per iteration (a plan dimension; default 0,256,512,1024,2048): "
                 "0 = whole prompts (a batch's prompts prefilled together, one wave), C > 0 = continuous batching "
                 "with each prompt prefilled C tokens per iteration beside the others' decode steps (trellis "
                 "run/serve --prefill-chunk C)");
  sub.add_option("--top", o->top, "Rows to print")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_flag("--no-sipipe", o->no_sipipe, "Model a pipeline without SiPipe's CPU sampling, token-safe inputs and SAT");
  sub.add_option("--layer-split", o->layer_split,
                 "Layers per stage as trellis run would split them: even (its default) or auto (the last stage "
                 "takes fewer layers for its LM head; the launch line then says --layer-split auto)")
      ->check(CLI::IsMember({"even", "auto"}))
      ->capture_default_str();
  sub.add_flag("--no-nvlink", o->no_nvlink, "Treat NVLink as absent (interconnect study)");
  sub.add_option("--expert-imbalance", o->expert_imbalance,
                 "MoE models: routed tokens on the busiest expert-parallel rank over the mean (>= 1; an assumption, "
                 "docs/planner.md 'MoE and MLA')")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 100.0));
  sub.add_flag("--no-replicas", o->no_replicas, "Only layouts with p x t = all devices (no data-parallel replicas)");
  sub.add_flag("--swift", o->swift,
               fmt::format("Model SWIFT self-speculative decoding: every layout's decode time per token divided by "
                           "the SWIFT paper's Eq. (6) speedup (an estimate; prefill unchanged). Defaults M={:g}, "
                           "alpha={:g}, r={:g} (docs/swift.md)",
                           sim::kSwiftDefaultM, sim::kSwiftDefaultAlpha, sim::kSwiftDefaultR));
  sub.add_option("--swift-m", o->swift_m, "SWIFT's mean generated length M, tokens per full forward (>= 1; implies --swift)");
  sub.add_option("--swift-alpha", o->swift_alpha, "SWIFT's token acceptance rate alpha, in (0, 1] (implies --swift)");
  sub.add_option("--swift-r", o->swift_r, "SWIFT's layer skip ratio r, in [0, 1) (implies --swift)");
  sub.add_option("--svg", o->svg, "Write the throughput-TPOT Pareto frontier per variant to this SVG file");
  sub.add_option("--validate", o->validate, "Compare predictions with measured runs in this JSON file (docs/planner.md)");
  CLI::Option* published =
      sub.add_option("--validate-published", o->published,
                     "Predict the published comparisons (engine docs, vendor blogs, papers) in FILE, default "
                     "sim/data/published_results.json, and print each published ratio beside the predicted one, "
                     "direction and error (docs/planner.md, 'Validation against published results'); --json too")
          ->expected(0, 1);
  sub.add_option("--sbatch", o->sbatch,
                 "Write a Slurm batch script for the top pick to FILE (- prints it instead of the table): "
                 "#SBATCH --nodes/--ntasks-per-node/--gpus-per-task and `srun --mpi=pmix trellis run ...` "
                 "(docs/launch.md)");
  sub.add_flag("--json", o->json, "Print JSON");
  CLI::App* app = &sub;  // outlives the action: the CLI app runs it after parsing
  return [o, app, published](Session& s) {
    o->validate_published = published->count() > 0;
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
