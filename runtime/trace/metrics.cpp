#include "trellis/runtime/trace/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "trellis/core/strings.hpp"

namespace trellis::runtime {

LatencyStats latency_stats(std::vector<double> v) {
  LatencyStats s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  auto rank = [&](double q) {
    auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
  };
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  return s;
}

RankShares rank_shares(const Tracer& t, double wall_s) {
  RankShares r;
  auto sec = [&](Lane lane, TraceCat c) { return static_cast<double>(t.total_ns(lane, c)) * 1e-9; };
  const auto f = Lane::kForward;
  r.busy_s = sec(f, TraceCat::kForward) + sec(f, TraceCat::kPrep) + sec(f, TraceCat::kSample);
  r.comm_s = sec(f, TraceCat::kSend) + sec(f, TraceCat::kRecv) + sec(f, TraceCat::kAllReduce);
  // All-reduces run inside the forward span, so they are moved from busy to comm.
  r.busy_s = std::max(0.0, r.busy_s - sec(f, TraceCat::kAllReduce));
  r.wall_s = wall_s;
  r.wait_s = std::max(0.0, wall_s - r.busy_s - r.comm_s);
  return r;
}

void summarize_requests(RunSummary& s, const std::vector<Request>& requests, const std::vector<RequestResult>& results,
                        double start_s) {
  std::vector<double> ttft, tpot;
  s.requests = static_cast<int>(results.size());
  for (const auto& r : results) {
    const auto& q = requests[static_cast<std::size_t>(r.id)];
    if (r.status == RequestStatus::kFailed) {
      ++s.failed;
      s.failures.push_back(fmt::format("request {}: {}", q.name, r.reason));
      // Tokens of a request stopped part-way (Ctrl-C) were still generated work.
      s.generated_tokens += static_cast<std::int64_t>(r.output.size());
      continue;
    }
    if (r.status != RequestStatus::kFinished) continue;
    ++s.finished;
    s.prompt_tokens += static_cast<std::int64_t>(q.prompt.size());
    s.generated_tokens += static_cast<std::int64_t>(r.output.size());
    if (r.first_token_s >= 0) ttft.push_back(r.first_token_s - start_s);
    if (r.output.size() >= 2) tpot.push_back((r.finished_s - r.first_token_s) / static_cast<double>(r.output.size() - 1));
  }
  s.ttft = latency_stats(ttft);
  s.tpot = latency_stats(tpot);
  s.throughput = s.wall_s > 0 ? static_cast<double>(s.generated_tokens) / s.wall_s : 0;
}

std::string to_text(const RunSummary& s) {
  std::string o;
  o += fmt::format("trellis run: {} | {} | {}\n", s.layout, s.workload, s.techniques);
  o += fmt::format("requests: {} finished, {} failed of {}; {} prompt + {} generated tokens in {}\n", s.finished,
                   s.failed, s.requests, s.prompt_tokens, s.generated_tokens, format_seconds(s.wall_s));
  o += fmt::format("start-up (before the first request, not in TTFT): connect {}, load {}, warm-up {}{}\n",
                   format_seconds(s.startup.connect_s), format_seconds(s.startup.load_s),
                   format_seconds(s.startup.warmup_s),
                   s.startup.warmup_tokens > 0 ? fmt::format(" ({} tokens)", s.startup.warmup_tokens) : " (off)");
  o += fmt::format("throughput: {:.1f} tokens/s\n", s.throughput);
  auto lat = [](const LatencyStats& l) {
    return fmt::format("mean {}  p50 {}  p99 {}  (n={})", format_seconds(l.mean), format_seconds(l.p50),
                       format_seconds(l.p99), l.n);
  };
  o += fmt::format("TTFT: {}\n", lat(s.ttft));
  o += fmt::format("TPOT: {}\n", lat(s.tpot));
  o += fmt::format("{:>5} {:>6} {:>4}  {:>7} {:>7} {:>7}  {}\n", "rank", "stage", "tp", "busy", "comm", "wait", "host");
  for (const auto& r : s.ranks) {
    double w = r.wall_s > 0 ? r.wall_s : 1;
    o += fmt::format("{:>5} {:>6} {:>4}  {:>6.1f}% {:>6.1f}% {:>6.1f}%  {}\n", r.rank, r.stage, r.tp,
                     100 * r.busy_s / w, 100 * r.comm_s / w, 100 * r.wait_s / w, r.host);
  }
  constexpr std::size_t kShown = 10;
  for (std::size_t i = 0; i < s.failures.size() && i < kShown; ++i) o += fmt::format("failed: {}\n", s.failures[i]);
  if (s.failures.size() > kShown) o += fmt::format("failed: ... and {} more (all in --json)\n", s.failures.size() - kShown);
  if (s.swift && (s.swift->verify_passes > 0 || s.swift->opt_steps > 0)) {
    const auto& w = *s.swift;
    const double t = std::max(1e-12, w.opt_s + w.draft_s + w.verify_s);
    o += fmt::format("swift: M {:.2f} tokens/verify · acceptance {:.2f} ({} of {} drafts) · skip {} of {} sub-layers "
                     "({}{}) · matchness {:.3f}\n",
                     w.mean_generated_length(), w.acceptance_rate(), w.accepted, w.draft_steps, w.skipped,
                     w.sub_layers, w.skip_set,
                     w.ratio_lowered > 0 ? fmt::format("; r lowered {} times to {:.2f}", w.ratio_lowered, w.skip_ratio)
                                         : std::string(),
                     w.best_matchness);
    o += fmt::format("swift: time optimise {:.1f}% ({} steps{}) · draft {:.1f}% · verify {:.1f}% · speedup {:.2f}x over "
                     "a plain token of {} (calibrated){}\n",
                     100 * w.opt_s / t, w.opt_steps, w.stop_reason.empty() ? ", still running" : ", " + w.stop_reason,
                     100 * w.draft_s / t, 100 * w.verify_s / t, w.measured_speedup(), format_seconds(w.plain_step_s),
                     w.turned_off ? " · turned off: " + w.off_reason : "");
    if (w.reductions_saved > 0)
      o += fmt::format("swift: {} TP all-reduces saved by the drafts' skipped sub-layers\n", w.reductions_saved);
  }
  for (const auto& n : s.notes) o += fmt::format("note: {}\n", n);
  if (!s.trace_path.empty())
    o += fmt::format("trace: {} (open it at https://ui.perfetto.dev or chrome://tracing)\n", s.trace_path);
  return o;
}

std::string to_json_text(const RunSummary& s) {
  auto lat = [](const LatencyStats& l) {
    return nlohmann::json{{"n", l.n}, {"mean_s", l.mean}, {"p50_s", l.p50}, {"p99_s", l.p99}};
  };
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : s.ranks) {
    double w = r.wall_s > 0 ? r.wall_s : 1;
    ranks.push_back({{"rank", r.rank}, {"stage", r.stage}, {"tp", r.tp}, {"host", r.host},
                     {"busy_share", r.busy_s / w}, {"comm_share", r.comm_s / w}, {"wait_share", r.wait_s / w},
                     {"busy_s", r.busy_s}, {"comm_s", r.comm_s}, {"wait_s", r.wait_s}});
  }
  nlohmann::json j = {{"layout", s.layout},
                      {"workload", s.workload},
                      {"techniques", s.techniques},
                      {"wall_s", s.wall_s},
                      {"requests", s.requests},
                      {"finished", s.finished},
                      {"failed", s.failed},
                      {"prompt_tokens", s.prompt_tokens},
                      {"generated_tokens", s.generated_tokens},
                      {"throughput_tokens_per_s", s.throughput},
                      {"ttft", lat(s.ttft)},
                      {"tpot", lat(s.tpot)},
                      {"ranks", ranks},
                      {"failures", s.failures},
                      {"notes", s.notes},
                      {"startup", {{"connect_s", s.startup.connect_s},
                                   {"load_s", s.startup.load_s},
                                   {"warmup_s", s.startup.warmup_s},
                                   {"warmup_prefill_s", s.startup.warmup_prefill_s},
                                   {"warmup_tokens", s.startup.warmup_tokens}}}};
  if (!s.trace_path.empty()) j["trace"] = s.trace_path;
  if (s.swift) {
    const auto& w = *s.swift;
    nlohmann::json tl = nlohmann::json::array();
    for (const auto& p : w.timeline) tl.push_back({p.t_s, p.matchness, p.instance_speedup});
    j["swift"] = {{"mean_generated_length", w.mean_generated_length()},
                  {"acceptance_rate", w.acceptance_rate()},
                  {"draft_steps", w.draft_steps},
                  {"accepted", w.accepted},
                  {"accepted_alternatives", w.alternatives},
                  {"sublayers_skipped", w.sublayers_skipped},
                  {"all_reduces_saved", w.reductions_saved},
                  {"verify_passes", w.verify_passes},
                  {"committed_tokens", w.committed},
                  {"optimisation_steps", w.opt_steps},
                  {"optimisation_stop", w.stop_reason},
                  {"restarts", w.restarts},
                  {"skip_ratio", w.skip_ratio},
                  {"skip_ratio_lowered", w.ratio_lowered},
                  {"skip_set", w.skip_set},
                  {"skipped_sub_layers", w.skipped},
                  {"sub_layers", w.sub_layers},
                  {"best_matchness", w.best_matchness},
                  {"optimise_s", w.opt_s},
                  {"draft_s", w.draft_s},
                  {"verify_s", w.verify_s},
                  {"optimisation_share", w.optimisation_share()},
                  {"plain_step_s", w.plain_step_s},
                  {"measured_speedup", w.measured_speedup()},
                  {"turned_off", w.turned_off},
                  {"off_reason", w.off_reason},
                  {"timeline", tl}};
  }
  return j.dump(2);
}

}  // namespace trellis::runtime
