// Published comparisons through the planner's model (published.hpp). Each side is predicted
// with sim::evaluate on its own cluster, exactly as `trellis plan` would predict that layout;
// nothing here is fitted to the published figures.
#include "trellis/sim/published.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/sim/cluster_spec.hpp"
#include "trellis/sim/planner.hpp"
#include "trellis/topology/discovery.hpp"

namespace trellis::sim {
namespace {

using nlohmann::json;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Names the file, the entry and the field in every message about the file.
struct Where {
  const std::string& origin;
  std::string entry;  // "entry 'id'" or "comparisons[3]"

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    // "is missing", "must be ..." read on from the field's name; anything else after a colon.
    const bool phrase = what.starts_with("is ") || what.starts_with("must ") || what.starts_with("give ");
    throw_error(ErrorCode::kCorruptInput, "published results file {}: {}{}{}{}", origin, entry,
                field.empty() ? "" : " field '" + field + "'", phrase ? " " : ": ", what);
  }

  const json* find(const json& o, const std::string& key) const {
    auto it = o.find(key);
    return it == o.end() ? nullptr : &*it;
  }

  std::string text(const json& o, const std::string& key, const std::string& path, bool required) const {
    const json* v = find(o, key);
    if (!v) {
      if (required) bad(path + key, "is missing");
      return {};
    }
    if (!v->is_string() || (required && v->get<std::string>().empty())) bad(path + key, "must be a non-empty string");
    return v->get<std::string>();
  }

  std::optional<double> number(const json& o, const std::string& key, const std::string& path) const {
    const json* v = find(o, key);
    if (!v) return std::nullopt;
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>()))
      bad(path + key, fmt::format("must be a number > 0 (got {})", v->dump()));
    return v->get<double>();
  }

  int integer(const json& o, const std::string& key, const std::string& path, int fallback, int min = 1) const {
    const json* v = find(o, key);
    if (!v) return fallback;
    if (!v->is_number_integer() || v->get<long long>() < min || v->get<long long>() > 1'000'000)
      bad(path + key, fmt::format("must be an integer >= {} (got {})", min, v->dump()));
    return static_cast<int>(v->get<long long>());
  }

  bool boolean(const json& o, const std::string& key, const std::string& path, bool fallback) const {
    const json* v = find(o, key);
    if (!v) return fallback;
    if (!v->is_boolean()) bad(path + key, fmt::format("must be true or false (got {})", v->dump()));
    return v->get<bool>();
  }
};

PublishedMetric parse_metric(const Where& w, const std::string& s) {
  for (auto m : {PublishedMetric::kTokensPerS, PublishedMetric::kMaxTokensPerS, PublishedMetric::kTtftMs,
                 PublishedMetric::kTpotMs})
    if (s == to_string(m)) return m;
  w.bad("metric", fmt::format("'{}' is not one of tokens_per_s, max_tokens_per_s, ttft_ms, tpot_ms", s));
}

// "sipipe" (all three), "none", or a comma list of the techniques that are on.
PipelineTechniques parse_techniques(const Where& w, const std::string& field, const std::string& s) {
  if (s == "sipipe") return PipelineTechniques{};
  PipelineTechniques t{false, false, false};
  if (s == "none") return t;
  for (const auto& part : split(s, ',')) {
    const std::string name(trim(part));
    if (name == "cpu_sampling") t.cpu_sampling = true;
    else if (name == "token_safe") t.token_safe = true;
    else if (name == "structure_aware") t.structure_aware = true;
    else
      w.bad(field, fmt::format("'{}' is not sipipe, none or a list of cpu_sampling, token_safe, structure_aware",
                               name));
  }
  return t;
}

ClusterView resolve_cluster(const Where& w, const std::string& field, const std::string& spec) {
  try {
    ClusterSpec cs = parse_cluster_spec(spec);
    ClusterView v = make_cluster_view(topology::parse_synthetic(cs.synthetic), cs.device);
    if (cs.nvlink_domain > 0) set_nvlink_domain(v, cs.nvlink_domain);
    return v;
  } catch (const Error& e) {
    w.bad(field, e.what());
  }
}

PublishedSide parse_side(const Where& w, const json& o, const std::string& key, bool resolve) {
  const std::string path = key + ".";
  if (!o.is_object()) w.bad(key, "must be an object");
  PublishedSide s;
  s.label = w.text(o, "label", path, true);
  s.cluster = w.text(o, "cluster", path, true);
  s.p = w.integer(o, "pp", path, 1);
  s.t = w.integer(o, "tp", path, 1);
  s.replicas = w.integer(o, "replicas", path, 1);
  s.microbatches = w.integer(o, "microbatches", path, 0, 0);
  s.batch = w.integer(o, "batch", path, 0, 0);
  s.value = w.number(o, "value", path);
  if (const std::string v = w.text(o, "variant", path, false); !v.empty()) {
    try {
      s.variant = parse_variant(v);
    } catch (const Error& e) {
      w.bad(path + "variant", e.what());
    }
  }
  if (const auto f = w.number(o, "lp_fraction", path)) {
    if (*f > 1) w.bad(path + "lp_fraction", fmt::format("must be a share of the layers in (0, 1] (got {:g})", *f));
    s.lp_fraction = *f;
  }
  if (const std::string d = w.text(o, "dtype", path, false); !d.empty()) {
    try {
      s.precision = parse_precision(d);
    } catch (const Error& e) {
      w.bad(path + "dtype", e.what());
    }
  }
  if (const std::string t = w.text(o, "techniques", path, false); !t.empty()) {
    s.techniques = parse_techniques(w, path + "techniques", t);
    s.techniques_text = t;
  }
  if (!resolve) return s;
  s.view = resolve_cluster(w, path + "cluster", s.cluster);
  const int need = s.replicas * s.p * s.t;
  if (need > s.view.ranks())
    w.bad(path + "pp", fmt::format("replicas x pp x tp = {} devices, but cluster '{}' has {}", need, s.cluster,
                                   s.view.ranks()));
  if (s.precision == Precision::kFp8 && !s.view.device.has_fp8())
    w.bad(path + "dtype", fmt::format("fp8 on {}, which has no FP8 tensor cores (devices that have them: {})",
                                      s.view.device.name, fp8_device_names()));
  if (s.precision == Precision::kF32 && s.view.device.kind == DeviceKind::kGpu)
    w.bad(path + "dtype", "f32 is the CPU path; GPUs are planned in bf16 or fp8");
  return s;
}

// The published ratio: a.value / b.value, or the given figure or range (checked against the
// values when both are there, so a typo in either shows).
void parse_ratio(const Where& w, const json& o, PublishedComparison& c) {
  const auto given = w.number(o, "published_ratio", "");
  const auto lo = w.number(o, "published_ratio_min", "");
  const auto hi = w.number(o, "published_ratio_max", "");
  if (given && (lo || hi)) w.bad("published_ratio", "give either published_ratio or published_ratio_min/max");
  if (c.a.value && c.b.value) {
    const double r = *c.a.value / *c.b.value;
    if (lo || hi) w.bad("published_ratio_min", "a.value and b.value give one ratio; a range does not apply");
    if (given && std::abs(r / *given - 1) > 0.01)
      w.bad("published_ratio", fmt::format("is {:g} but a.value / b.value = {:g} / {:g} = {:.4g}", *given,
                                           *c.a.value, *c.b.value, r));
    c.ratio_min = c.ratio_max = r;
  } else if (given) {
    c.ratio_min = c.ratio_max = *given;
  } else if (lo || hi) {
    c.ratio_min = lo.value_or(0);
    c.ratio_max = hi.value_or(kInf);
    if (c.ratio_min > c.ratio_max) w.bad("published_ratio_min", "is above published_ratio_max");
  } else {
    w.bad("published_ratio", "is missing (or give a.value and b.value, or published_ratio_min/max)");
  }
  if (c.ratio_min < 1 && c.ratio_max > 1)
    w.bad("published_ratio_min", fmt::format("the range {} spans 1: the comparison has no direction",
                                             published_ratio_text(c)));
}

PublishedComparison parse_entry(const json& e, std::size_t index, const std::string& origin,
                                std::set<std::string>& ids) {
  Where w{origin, fmt::format("comparisons[{}]", index)};
  if (!e.is_object()) w.bad("", "must be an object");
  PublishedComparison c;
  c.id = w.text(e, "id", "", true);
  w.entry = fmt::format("entry '{}'", c.id);
  if (!ids.insert(c.id).second) w.bad("id", "is used by an earlier entry");
  c.source = w.text(e, "source", "", true);
  c.url = w.text(e, "url", "", false);
  c.where = w.text(e, "where", "", true);
  c.engine = w.text(e, "engine", "", false);
  c.hardware = w.text(e, "hardware", "", true);
  c.note = w.text(e, "note", "", false);
  c.unsupported = w.text(e, "unsupported", "", false);
  c.model_name = w.text(e, "model", "", true);
  c.metric = parse_metric(w, w.text(e, "metric", "", true));
  c.prompt_len = w.integer(e, "prompt_len", "", 1024);
  c.gen_len = w.integer(e, "gen_len", "", 512);
  c.batch = w.integer(e, "batch", "", 1);
  c.max_batch = w.integer(e, "max_batch", "", 4096);
  c.batch_is_cap = w.boolean(e, "batch_is_cap", "", false);
  c.expect_direction_ok = w.boolean(e, "expect_direction_ok", "", true);
  c.expect_reason = w.text(e, "expect_reason", "", false);
  if (!c.expect_direction_ok && c.expect_reason.empty())
    w.bad("expect_reason", "is missing: a row expected to get the direction wrong says why");
  const bool resolve = c.unsupported.empty();
  for (const char* side : {"a", "b"})
    if (!e.contains(side)) w.bad(side, "is missing");
  c.a = parse_side(w, e["a"], "a", resolve);
  c.b = parse_side(w, e["b"], "b", resolve);
  parse_ratio(w, e, c);
  if (!resolve) return c;
  try {
    c.model = load_model(c.model_name);
  } catch (const Error& err) {
    w.bad("model", err.what());
  }
  return c;
}

// A candidate of one side at one batch.
Candidate evaluate_at(const PublishedComparison& c, const PublishedSide& s, int batch, int m) {
  PlanRequest r;
  r.model = c.model;
  r.cluster = s.view;
  r.work = with_precision(Workload{}, s.precision);
  r.work.prompt_len = c.prompt_len;
  r.work.gen_len = c.gen_len;
  r.techniques = s.techniques;
  r.objective = Objective::kThroughput;
  Layout layout;
  layout.p = s.p;
  layout.t = s.t;
  layout.microbatches = m;
  layout.variant = s.variant;
  layout.lp_fraction = s.lp_fraction;
  return evaluate(r, s.replicas, layout, batch, layout_links(s.view, s.p, s.t));
}

double metric_value(PublishedMetric m, const Candidate& k) {
  switch (m) {
    case PublishedMetric::kTokensPerS:
    case PublishedMetric::kMaxTokensPerS: return k.total_tokens_per_s;
    case PublishedMetric::kTtftMs: return k.prediction.ttft_s * 1e3;
    case PublishedMetric::kTpotMs: return k.prediction.tpot_s * 1e3;
  }
  return 0;
}

std::string fixed(double v) {
  if (!std::isfinite(v)) return "inf";
  return fmt::format("{:.{}f}", v, v < 1.1 ? 3 : 2);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::string_view to_string(PublishedMetric m) {
  switch (m) {
    case PublishedMetric::kTokensPerS: return "tokens_per_s";
    case PublishedMetric::kMaxTokensPerS: return "max_tokens_per_s";
    case PublishedMetric::kTtftMs: return "ttft_ms";
    case PublishedMetric::kTpotMs: return "tpot_ms";
  }
  return "?";
}

std::string published_ratio_text(const PublishedComparison& c) {
  if (!c.is_range()) return fixed(c.ratio_min);
  if (std::isinf(c.ratio_max)) return c.ratio_min == 1 ? "> 1" : ">= " + fixed(c.ratio_min);
  if (c.ratio_min == 0) return c.ratio_max == 1 ? "< 1" : "<= " + fixed(c.ratio_max);
  return fixed(c.ratio_min) + "-" + fixed(c.ratio_max);
}

std::vector<PublishedComparison> parse_published(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw_error(ErrorCode::kCorruptInput, "published results file {}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object() || j.value("schema", std::string()) != "trellis.published.v1")
    throw_error(ErrorCode::kCorruptInput, "published results file {}: field 'schema' must be \"trellis.published.v1\"",
                origin);
  if (!j.contains("comparisons") || !j["comparisons"].is_array() || j["comparisons"].empty())
    throw_error(ErrorCode::kCorruptInput, "published results file {}: field 'comparisons' must be a non-empty array",
                origin);
  std::vector<PublishedComparison> out;
  std::set<std::string> ids;
  for (std::size_t i = 0; i < j["comparisons"].size(); ++i) out.push_back(parse_entry(j["comparisons"][i], i, origin, ids));
  return out;
}

std::vector<PublishedComparison> load_published(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw_error(ErrorCode::kNotFound, "published results file {}: cannot open", path);
  std::stringstream s;
  s << f.rdbuf();
  return parse_published(s.str(), path);
}

PublishedPrediction predict_published_side(const PublishedComparison& c, const PublishedSide& s) {
  if (!c.unsupported.empty())
    throw_error(ErrorCode::kInvalidArgument, "published comparison '{}' is not expressible: {}", c.id, c.unsupported);
  // One microbatch per stage unless the entry says otherwise; never more than the batch
  // (a batch of 1 through 8 stages is one microbatch: minimum latency).
  const int fixed_batch = s.batch > 0 ? s.batch : c.batch;
  const int m = s.microbatches > 0 ? s.microbatches
                : c.metric == PublishedMetric::kMaxTokensPerS ? s.p
                                                              : std::min(s.p, fixed_batch);
  PublishedPrediction out;
  out.microbatches = m;
  auto fill = [&](const Candidate& k) {
    out.value = metric_value(c.metric, k);
    out.batch = k.batch;
    out.dominant = k.prediction.dominant;
  };
  if (c.metric == PublishedMetric::kMaxTokensPerS) {
    std::string last;
    for (int b = std::max(1, m); b <= c.max_batch; b *= 2) {
      const Candidate k = evaluate_at(c, s, b, m);
      if (!k.prediction.feasible) {
        last = k.prediction.reason;
        continue;
      }
      if (k.total_tokens_per_s > out.value) fill(k);
    }
    if (out.batch == 0)
      throw_error(ErrorCode::kResourceExhausted, "published comparison '{}', side '{}': no batch fits: {}", c.id, s.label,
                  last);
    return out;
  }
  int batch = fixed_batch;
  for (;;) {
    const Candidate k = evaluate_at(c, s, batch, m);
    if (k.prediction.feasible) {
      fill(k);
      return out;
    }
    // An engine whose batch is a cap runs the sequences that fit; anything else is an error
    // of the entry (or of the model), reported with the planner's reason.
    if (!c.batch_is_cap || batch / 2 < std::max(1, m))
      throw_error(ErrorCode::kResourceExhausted, "published comparison '{}', side '{}' at batch {}: {}", c.id, s.label,
                  batch, k.prediction.reason);
    batch /= 2;
  }
}

PublishedReport validate_published(const std::vector<PublishedComparison>& comparisons) {
  PublishedReport rep;
  std::vector<double> errors;
  for (const auto& c : comparisons) {
    PublishedRow row;
    row.comparison = c;
    if (!c.unsupported.empty()) {
      row.not_evaluated = "not expressible: " + c.unsupported;
      ++rep.unsupported;
      rep.rows.push_back(std::move(row));
      continue;
    }
    try {
      row.a = predict_published_side(c, c.a);
      row.b = predict_published_side(c, c.b);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kResourceExhausted) throw;
      row.not_evaluated = e.what();
      rep.rows.push_back(std::move(row));
      continue;
    }
    row.evaluated = row.a.value > 0 && row.b.value > 0;
    if (!row.evaluated) {
      row.not_evaluated = "a prediction of 0";
      rep.rows.push_back(std::move(row));
      continue;
    }
    const double r = row.a.value / row.b.value;
    row.predicted_ratio = r;
    row.direction_ok = c.published_above_one() ? r > 1 : r < 1;
    if (r < c.ratio_min) row.error = r / c.ratio_min - 1;
    else if (r > c.ratio_max) row.error = r / c.ratio_max - 1;
    row.within_30 = std::abs(row.error) <= 0.30;
    const double ref = r < c.ratio_min ? c.ratio_min : r > c.ratio_max ? c.ratio_max : r;
    row.effect_share = ref == 1 ? std::nan("") : std::log(r) / std::log(ref);
    ++rep.evaluated;
    rep.directions_right += row.direction_ok;
    rep.within_30 += row.within_30;
    errors.push_back(std::abs(row.error));
    rep.rows.push_back(std::move(row));
  }
  rep.median_abs_error = median(errors);
  return rep;
}

std::string format_published(const PublishedReport& rep) {
  std::string s =
      "| id | comparison (model: a vs b) | metric, workload | source | published a/b | predicted a/b (a, b) | "
      "direction | error | effect |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& row : rep.rows) {
    const auto& c = row.comparison;
    std::string work = fmt::format("{}, {}+{}", to_string(c.metric), c.prompt_len, c.gen_len);
    if (c.metric != PublishedMetric::kMaxTokensPerS)
      work += fmt::format(", batch {}{}", c.batch, c.batch_is_cap ? " (cap)" : "");
    std::string predicted = "-", direction = "-", error = "-", effect = "-";
    if (!row.evaluated) {
      predicted = row.not_evaluated;
    } else {
      const char* unit = c.metric == PublishedMetric::kTtftMs || c.metric == PublishedMetric::kTpotMs ? " ms" : "";
      auto side = [&](const PublishedPrediction& p, const PublishedSide& sd) {
        std::string x = fmt::format("{:.{}f}{}", p.value, p.value < 100 ? 1 : 0, unit);
        const bool show_batch = c.metric == PublishedMetric::kMaxTokensPerS || p.batch != (sd.batch ? sd.batch : c.batch);
        if (show_batch) x += fmt::format(" @{}", p.batch);
        return x;
      };
      predicted = fmt::format("{} ({}, {})", fixed(row.predicted_ratio), side(row.a, c.a), side(row.b, c.b));
      direction = row.direction_ok ? "right" : "WRONG";
      if (!c.expect_direction_ok) direction += " (expected wrong)";
      error = row.error == 0 ? "0 (in range)" : fmt::format("{:+.0f}%", 100 * row.error);
      if (!row.within_30) error += " (>30%)";
      if (std::isfinite(row.effect_share)) effect = fmt::format("{:.0f}%", 100 * row.effect_share);
    }
    s += fmt::format("| {} | {}: {} vs {} | {} | {}, {} | {} | {} | {} | {} | {} |\n", c.id, c.model_name,
                     c.a.label, c.b.label, work, c.source, c.where, published_ratio_text(c), predicted, direction,
                     error, effect);
  }
  s += fmt::format(
      "\n{} comparisons: {} evaluated, {} not expressible by the planner, {} not evaluated otherwise; direction right "
      "in {} of {}; ratio within 30% in {} of {}; median |error| {:.0f}%\n",
      rep.rows.size(), rep.evaluated, rep.unsupported,
      static_cast<int>(rep.rows.size()) - rep.evaluated - rep.unsupported, rep.directions_right, rep.evaluated,
      rep.within_30, rep.evaluated, 100 * rep.median_abs_error);
  return s;
}

}  // namespace trellis::sim
