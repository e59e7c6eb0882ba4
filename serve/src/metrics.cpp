#include "trellis/serve/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace trellis::serve {
namespace {

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP trellis_{} {}\n# TYPE trellis_{} {}\n", name, help, name, type);
}

template <typename T>
void scalar(std::string& out, std::string_view name, std::string_view type, std::string_view help, T value) {
  header(out, name, type, help);
  out += fmt::format("trellis_{} {}\n", name, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double x) {
  const auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), x) - bounds_.begin());
  ++counts_[i];
  sum_ += x;
  ++count_;
}

void Histogram::render(std::string& out, std::string_view name) const {
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

// Buckets as vLLM uses them: TTFT from 1 ms to a minute, TPOT from 1 ms to several seconds.
ServeMetrics::ServeMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0}),
      tpot_({0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0}) {
  // Every outcome shows from the start, so a rate() over them never misses the first one.
  for (const char* o : {"stop", "length", "cancelled", "rejected", "failed"}) outcomes_[o] = 0;
}

void ServeMetrics::observe_ttft(double s) {
  std::lock_guard lock(mu_);
  ttft_.observe(s);
}

void ServeMetrics::observe_tpot(double s) {
  std::lock_guard lock(mu_);
  tpot_.observe(s);
}

void ServeMetrics::count_request(std::string_view outcome) {
  std::lock_guard lock(mu_);
  auto it = outcomes_.find(outcome);
  if (it == outcomes_.end()) it = outcomes_.emplace(std::string(outcome), 0).first;
  ++it->second;
}

void ServeMetrics::count_response(int status) {
  std::lock_guard lock(mu_);
  ++responses_[status];
}

std::string ServeMetrics::render(const runtime::LiveStats& s, int open_connections) const {
  std::string out;
  scalar(out, "requests_running", "gauge", "Requests generating in the engine now.", s.running);
  scalar(out, "requests_waiting", "gauge", "Requests queued for the engine, not yet running.", s.waiting);
  scalar(out, "prompt_tokens_total", "counter", "Prompt tokens of every request the engine accepted.",
         s.prompt_tokens);
  scalar(out, "generation_tokens_total", "counter", "Tokens the engine generated.", s.generated_tokens);
  scalar(out, "engine_iterations_total", "counter", "Engine iterations scheduled.", s.iterations);
  scalar(out, "kv_cache_used_tokens", "gauge", "KV-cache positions reserved by running requests.", s.kv_used_tokens);
  scalar(out, "kv_cache_budget_tokens", "gauge", "KV-cache positions every rank can hold.", s.kv_budget_tokens);
  const double usage = s.kv_budget_tokens > 0 ? static_cast<double>(s.kv_used_tokens) / s.kv_budget_tokens : 0.0;
  scalar(out, "kv_cache_usage_ratio", "gauge", "KV-cache positions used over the budget (0..1).", usage);
  scalar(out, "engine_ready", "gauge", "1 once every rank has loaded the model.", s.ready ? 1 : 0);
  scalar(out, "engine_draining", "gauge", "1 while the server refuses new requests to shut down.", s.draining ? 1 : 0);
  scalar(out, "engine_failed", "gauge", "1 when the engine failed.", s.failed ? 1 : 0);
  scalar(out, "http_connections", "gauge", "Open HTTP connections.", open_connections);
  if (s.swift) {
    scalar(out, "swift_verify_passes_total", "counter", "SWIFT: full-model forwards over a token tree.",
           s.swift->verify_passes);
    scalar(out, "swift_draft_tokens_total", "counter", "SWIFT: tokens drafted with the skip set.", s.swift->draft_steps);
    scalar(out, "swift_accepted_tokens_total", "counter", "SWIFT: drafted tokens the full model accepted.",
           s.swift->accepted);
    scalar(out, "swift_optimisation_steps_total", "counter", "SWIFT: skip-set optimisation steps.", s.swift->opt_steps);
    scalar(out, "swift_turned_off", "gauge", "1 when SWIFT's auto-off rule stopped drafting.",
           s.swift->turned_off ? 1 : 0);
  }
  struct Share {
    const char* name;
    double runtime::StageShare::*field;
    const char* help;
  };
  for (const Share sh : {Share{"stage_busy_ratio", &runtime::StageShare::busy, "Share of wall time each stage computed."},
                         Share{"stage_comm_ratio", &runtime::StageShare::comm, "Share of wall time each stage communicated."},
                         Share{"stage_wait_ratio", &runtime::StageShare::wait, "Share of wall time each stage waited."}}) {
    header(out, sh.name, "gauge", sh.help);
    for (const auto& st : s.stages) out += fmt::format("trellis_{}{{stage=\"{}\"}} {}\n", sh.name, st.stage, st.*sh.field);
  }
  std::lock_guard lock(mu_);
  header(out, "requests_total", "counter", "Generation requests by how they ended.");
  for (const auto& [o, n] : outcomes_) out += fmt::format("trellis_requests_total{{outcome=\"{}\"}} {}\n", o, n);
  header(out, "time_to_first_token_seconds", "histogram", "Request arrival to its first generated token.");
  ttft_.render(out, "trellis_time_to_first_token_seconds");
  header(out, "time_per_output_token_seconds", "histogram", "Per request, the mean gap between its later tokens.");
  tpot_.render(out, "trellis_time_per_output_token_seconds");
  header(out, "http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : responses_) out += fmt::format("trellis_http_responses_total{{code=\"{}\"}} {}\n", code, n);
  return out;
}

}  // namespace trellis::serve
