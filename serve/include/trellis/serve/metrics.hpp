// The numbers behind GET /metrics, in Prometheus text exposition format 0.0.4.
//
// The server measures what only it sees: time to first token (request arrival to the first
// token event), time per output token (per request, the mean gap between its later tokens),
// requests by outcome and HTTP responses by status code. Everything the engine knows (queue
// depth, tokens, KV cache, iterations, per-stage time shares) comes from a LiveStats snapshot
// taken when the page is rendered.
//
// Metric names (all prefixed trellis_): requests_running, requests_waiting (gauges);
// requests_total{outcome} with outcome stop|length|cancelled|rejected|failed;
// prompt_tokens_total, generation_tokens_total, engine_iterations_total (counters);
// time_to_first_token_seconds, time_per_output_token_seconds (histograms);
// kv_cache_used_tokens, kv_cache_budget_tokens, kv_cache_usage_ratio,
// stage_busy_ratio{stage}, stage_comm_ratio{stage}, stage_wait_ratio{stage},
// engine_ready, engine_draining, engine_failed, http_connections (gauges);
// http_responses_total{code} (counter); with --swift: swift_verify_passes_total,
// swift_draft_tokens_total, swift_accepted_tokens_total, swift_optimisation_steps_total
// (counters), swift_turned_off (gauge).
//
// Threading: every member is safe to call from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/engine/live.hpp"

namespace trellis::serve {

// Cumulative-bucket histogram with fixed upper bounds (seconds). Not thread-safe by itself.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double x);
  std::uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  // Appends NAME_bucket{le=...}, NAME_sum and NAME_count lines.
  void render(std::string& out, std::string_view name) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket (not cumulative); last one is +Inf
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

class ServeMetrics {
 public:
  ServeMetrics();
  void observe_ttft(double seconds);
  void observe_tpot(double seconds);
  // One generation request ended: "stop", "length", "cancelled" (client gone, engine
  // cancelled), "rejected" (4xx: invalid, too long, queue full) or "failed" (5xx).
  void count_request(std::string_view outcome);
  void count_response(int status);
  std::string render(const runtime::LiveStats& stats, int open_connections) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, tpot_;
  std::map<std::string, std::uint64_t, std::less<>> outcomes_;
  std::map<int, std::uint64_t> responses_;
};

}  // namespace trellis::serve
