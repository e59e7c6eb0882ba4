// Measured vs predicted. The error is signed (predicted - measured) / measured per metric;
// the summary uses |error| over both metrics, so a model that gets throughput right by
// getting latency wrong does not pass.
#include "trellis/sim/validate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "trellis/core/error.hpp"
#include "trellis/sim/calibration.hpp"
#include "trellis/topology/discovery.hpp"

namespace trellis::sim {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& origin, const std::string& field, const std::string& what) {
  throw_error(ErrorCode::kCorruptInput, "measurements file {}: field '{}' {}", origin, field, what);
}

double number(const json& r, const char* key, const std::string& path, const std::string& origin, bool required) {
  auto it = r.find(key);
  if (it == r.end()) {
    if (required) bad(origin, path + key, "is missing");
    return 0;
  }
  if (!it->is_number() || !(it->get<double>() > 0)) bad(origin, path + key, "must be a number > 0");
  return it->get<double>();
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// A one-host CPU cluster re-divided among `ranks` ranks: every run of a sweep on one machine
// puts all its ranks on that host, so a 1x1 run has the whole host and a 2x2 run a quarter.
ClusterView with_ranks_per_host(ClusterView c, int ranks) {
  const double f = static_cast<double>(c.devices_per_host) / ranks;
  c.device.dense_flops_bf16 *= f;
  c.device.dense_flops_fp32 *= f;
  c.device.memory_bandwidth *= f;
  c.device.memory_bytes *= f;
  const LinkCost shm = c.intra.size() > 1 ? c.intra[1] : c.intra.front();
  c.intra.assign(static_cast<std::size_t>(ranks * ranks), shm);
  for (int i = 0; i < ranks; ++i) c.intra[static_cast<std::size_t>(i * ranks + i)].kind = LinkKind::kSameProcess;
  c.devices_per_host = ranks;
  return c;
}

}  // namespace

std::vector<Measurement> parse_measurements(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw_error(ErrorCode::kCorruptInput, "measurements file {}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object() || j.value("schema", std::string()) != "trellis.measurements.v1")
    bad(origin, "schema", "must be \"trellis.measurements.v1\"");
  if (!j.contains("runs") || !j["runs"].is_array()) bad(origin, "runs", "must be an array");
  std::vector<Measurement> out;
  for (std::size_t i = 0; i < j["runs"].size(); ++i) {
    const json& r = j["runs"][i];
    const std::string p = "runs[" + std::to_string(i) + "].";
    if (!r.is_object()) bad(origin, p, "must be an object");
    Measurement m;
    m.p = static_cast<int>(number(r, "pp", p, origin, true));
    m.t = static_cast<int>(number(r, "tp", p, origin, true));
    m.batch = static_cast<int>(number(r, "batch", p, origin, true));
    m.ranks_per_host = static_cast<int>(number(r, "ranks_per_host", p, origin, false));
    m.shared_cores = static_cast<int>(number(r, "shared_cores", p, origin, false));
    m.microbatches = r.contains("microbatches") ? static_cast<int>(number(r, "microbatches", p, origin, true)) : 1;
    m.prompt_len = static_cast<int>(number(r, "prompt_len", p, origin, false));
    m.gen_len = static_cast<int>(number(r, "gen_len", p, origin, false));
    m.tokens_per_s = number(r, "tokens_per_s", p, origin, true);
    m.tpot_s = number(r, "tpot_ms", p, origin, true) * 1e-3;
    m.ttft_s = number(r, "ttft_ms", p, origin, false) * 1e-3;
    for (const auto& [key, scale, dst] : {std::tuple{"tokens_per_s_reps", 1.0, &m.tokens_per_s_reps},
                                          std::tuple{"tpot_ms_reps", 1e-3, &m.tpot_s_reps}}) {
      if (!r.contains(key)) continue;
      if (!r[key].is_array()) bad(origin, p + key, "must be an array of numbers > 0");
      for (std::size_t k = 0; k < r[key].size(); ++k) {
        const json& v = r[key][k];
        if (!v.is_number() || !(v.get<double>() > 0))
          bad(origin, p + key + "[" + std::to_string(k) + "]", "must be a number > 0");
        dst->push_back(v.get<double>() * scale);
      }
    }
    if (r.contains("background_cpu_share_reps")) {
      const json& o = r["background_cpu_share_reps"];
      if (!o.is_array()) bad(origin, p + "background_cpu_share_reps", "must be an array of numbers in [0, 1]");
      for (std::size_t k = 0; k < o.size(); ++k) {
        if (o[k].is_null()) continue;  // a repetition recorded before the field existed
        if (!o[k].is_number() || o[k].get<double>() < 0 || o[k].get<double>() > 1)
          bad(origin, p + "background_cpu_share_reps[" + std::to_string(k) + "]", "must be a number in [0, 1]");
        m.background_cpu_share_reps.push_back(o[k].get<double>());
      }
    }
    if (r.contains("variant")) {
      if (!r["variant"].is_string()) bad(origin, p + "variant", "must be a string");
      try {
        m.variant = parse_variant(r["variant"].get<std::string>());
      } catch (const Error& e) {
        bad(origin, p + "variant", e.what());
      }
    }
    if (r.contains("layer_split")) {
      const json& s = r["layer_split"];
      if (!s.is_string() || (s.get<std::string>() != "even" && s.get<std::string>() != "auto"))
        bad(origin, p + "layer_split", "must be \"even\" or \"auto\" (how trellis run split the layers)");
      m.head_aware_split = s.get<std::string>() == "auto";
    }
    if (r.contains("cluster")) {
      if (!r["cluster"].is_string()) bad(origin, p + "cluster", "must be a synthetic spec string");
      m.cluster = r["cluster"].get<std::string>();
    }
    out.push_back(m);
  }
  return out;
}

std::vector<Measurement> load_measurements(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error(ErrorCode::kNotFound, "cannot open measurements file {}", path);
  std::stringstream s;
  s << in.rdbuf();
  return parse_measurements(s.str(), path);
}

ValidationReport validate(const PlanRequest& request, const std::vector<Measurement>& runs,
                          const Calibration* calibration) {
  ValidationReport rep;
  std::vector<double> errors;
  std::map<std::string, std::vector<std::size_t>> groups;
  for (const auto& m : runs) {
    PlanRequest r = request;
    if (!m.cluster.empty())
      r.cluster = make_cluster_view(topology::parse_synthetic(m.cluster), r.cluster.device.name, calibration,
                                    m.ranks_per_host);
    if (m.cluster.empty() && r.cluster.device.kind == DeviceKind::kCpu && r.cluster.hosts == 1)
      r.cluster = with_ranks_per_host(r.cluster, m.p * m.t);
    // Runs of a sweep on one machine share its cores, emulated hosts included.
    if (r.cpu.enabled && (m.shared_cores > 0 || (m.cluster.empty() && r.cluster.hosts == 1))) {
      r.cpu.one_machine = true;
      if (m.shared_cores > 0) r.cpu.cores = m.shared_cores;
    }
    if (m.prompt_len > 0) r.work.prompt_len = m.prompt_len;
    if (m.gen_len > 0) r.work.gen_len = m.gen_len;
    Layout l{m.p, m.t, m.microbatches, m.variant, r.lp_fraction};
    // The measured runs prefilled whole prompts in the engine's microbatch groups, one wave
    // per group: predict that wave, not the planner's fastest split of it.
    l.prefill_microbatches = m.microbatches;
    l.head_aware_split = m.head_aware_split;
    if (m.p * m.t > r.cluster.ranks())
      throw_error(ErrorCode::kInvalidArgument, "measured layout p={} t={} needs more ranks than the cluster's {}", m.p,
                  m.t, r.cluster.ranks());
    Candidate c = evaluate(r, 1, l, m.batch, layout_links(r.cluster, m.p, m.t));
    ValidationRow row{m, c.prediction, 0, 0};
    if (c.prediction.feasible) {
      // `trellis run` reports generated tokens over the wall time of the whole generation
      // (prefill included), which is the planner's tokens_per_s.
      row.tokens_error = (c.prediction.tokens_per_s - m.tokens_per_s) / m.tokens_per_s;
      row.tpot_error = (c.prediction.tpot_s - m.tpot_s) / m.tpot_s;
      errors.push_back(std::abs(row.tokens_error));
      errors.push_back(std::abs(row.tpot_error));
    } else {
      rep.notes.push_back(fmt::format("p={} t={} batch {}: the model calls it infeasible ({})", m.p, m.t, m.batch,
                                      c.prediction.reason));
    }
    groups[fmt::format("batch {} prompt {} gen {} on {}", m.batch, r.work.prompt_len, r.work.gen_len,
                       m.cluster.empty() ? "the request's cluster" : m.cluster)]
        .push_back(rep.rows.size());
    rep.rows.push_back(std::move(row));
  }
  rep.median_abs_error = quantile(errors, 0.5);
  rep.p90_abs_error = quantile(errors, 0.9);
  std::vector<double> noise;
  for (const auto& m : runs)
    for (const auto& [reps, med] : {std::pair{&m.tokens_per_s_reps, m.tokens_per_s}, {&m.tpot_s_reps, m.tpot_s}}) {
      for (double x : *reps) noise.push_back(std::abs(x - med) / med);
      rep.repetitions = std::max(rep.repetitions, static_cast<int>(reps->size()));
    }
  rep.median_rep_deviation = quantile(noise, 0.5);
  rep.p90_rep_deviation = quantile(noise, 0.9);
  std::vector<double> others;
  for (const auto& m : runs) others.insert(others.end(), m.background_cpu_share_reps.begin(), m.background_cpu_share_reps.end());
  if (!others.empty()) {
    rep.median_background_share = quantile(others, 0.5);
    rep.p90_background_share = quantile(others, 0.9);
  }
  for (const auto& [name, idx] : groups) {
    if (idx.size() < 2) continue;
    std::size_t best_measured = idx[0], best_predicted = idx[0];
    for (std::size_t i : idx) {
      if (rep.rows[i].measured.tokens_per_s > rep.rows[best_measured].measured.tokens_per_s) best_measured = i;
      if (rep.rows[i].predicted.tokens_per_s > rep.rows[best_predicted].predicted.tokens_per_s)
        best_predicted = i;
    }
    ++rep.top_pick_groups;
    const double got = rep.rows[best_predicted].measured.tokens_per_s, best = rep.rows[best_measured].measured.tokens_per_s;
    if (got >= 0.95 * best) ++rep.top_pick_ok;
    else
      rep.notes.push_back(fmt::format("{}: predicted best p={} t={} {} measured {:.1f} tokens/s, {:.0f}% below the "
                                      "measured best", name, rep.rows[best_predicted].measured.p,
                                      rep.rows[best_predicted].measured.t,
                                      to_string(rep.rows[best_predicted].measured.variant), got, 100 * (1 - got / best)));
  }
  return rep;
}

std::string format_validation(const ValidationReport& rep) {
  // Measured TTFT (when the file has it) beside the prediction: not in the error summary
  // (the targets are on tokens/s and TPOT), but it tells a prefill error from a decode one.
  const bool ttft = std::any_of(rep.rows.begin(), rep.rows.end(), [](const auto& r) { return r.measured.ttft_s > 0; });
  std::string s = fmt::format("{:>3} {:>3} {:<9} {:>5} {:>12} {:>12} {:>7} {:>9} {:>9} {:>7}{}  {}\n", "p", "t", "variant",
                              "batch", "meas tok/s", "pred tok/s", "err", "meas TPOT", "pred TPOT", "err",
                              ttft ? fmt::format(" {:>9} {:>9}", "meas TTFT", "pred TTFT") : std::string(), "cluster");
  for (const auto& r : rep.rows) {
    const auto& m = r.measured;
    s += fmt::format("{:>3} {:>3} {:<9} {:>5} {:>12.1f} {:>12.1f} {:>+6.0f}% {:>7.2f}ms {:>7.2f}ms {:>+6.0f}%{}  {}\n", m.p,
                     m.t, to_string(m.variant), m.batch, m.tokens_per_s, r.predicted.tokens_per_s,
                     100 * r.tokens_error, m.tpot_s * 1e3, r.predicted.tpot_s * 1e3, 100 * r.tpot_error,
                     ttft ? fmt::format(" {:>7.1f}ms {:>7.1f}ms", m.ttft_s * 1e3, r.predicted.ttft_s * 1e3) : std::string(),
                     m.cluster.empty() ? "-" : m.cluster);
  }
  s += fmt::format("median |error| {:.1f}% (target <= 15%), p90 |error| {:.1f}% (target <= 30%)\n",
                   100 * rep.median_abs_error, 100 * rep.p90_abs_error);
  if (rep.repetitions > 1)
    s += fmt::format("measurement noise: single repetitions (up to {}) lie {:.1f}% (median) and {:.1f}% (p90) from "
                     "their row's median\n",
                     rep.repetitions, 100 * rep.median_rep_deviation, 100 * rep.p90_rep_deviation);
  if (rep.median_background_share >= 0)
    s += fmt::format("niced background processes (builds) took {:.1f}% (median) and {:.1f}% (p90) of the machine's CPU "
                     "during the runs\n",
                     100 * rep.median_background_share, 100 * rep.p90_background_share);
  s += fmt::format("top pick within 5% of the measured best in {} of {} workloads\n", rep.top_pick_ok,
                   rep.top_pick_groups);
  for (const auto& n : rep.notes) s += "note: " + n + "\n";
  return s;
}

}  // namespace trellis::sim
