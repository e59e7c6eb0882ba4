// Run summary: throughput, time to first token (TTFT), time per output token (TPOT), and per
// rank the share of the run its forward executor spent busy, communicating and waiting.
//
// TTFT of a request = first token time - run start (offline workload: every request arrives
// at the start). TPOT = (finish - first token) / (tokens - 1), for requests with >= 2 tokens.
// Throughput = generated tokens / wall time of the generation phase.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trellis/runtime/scheduler/scheduler.hpp"
#include "trellis/runtime/trace/trace.hpp"

namespace trellis::runtime {

struct LatencyStats {
  int n = 0;
  double mean = 0, p50 = 0, p99 = 0;  // seconds
};
// Nearest-rank percentiles; n = 0 gives zeros.
LatencyStats latency_stats(std::vector<double> values);

struct RankShares {
  int rank = 0, stage = 0, tp = 0;
  std::string host;
  double busy_s = 0;  // forward compute (+ input preparation / sampling done inline)
  double comm_s = 0;  // send, receive, all-reduce
  double wait_s = 0;  // idle: waiting for input, a scheduling output, the previous stage
  double wall_s = 0;
};
// Shares of one rank's forward lane from its tracer over `wall_s` seconds.
RankShares rank_shares(const Tracer& t, double wall_s);

// Start-up before the first request, per phase: the slowest rank's seconds (each rank times
// its own phases; the phases end at collective points, so ranks finish them together).
struct StartupTimes {
  double connect_s = 0;  // topology exchange, placement, links, TP groups
  double load_s = 0;     // this rank's shard of the weights, KV cache allocated and zeroed
  double warmup_s = 0;   // warm_up_stage(): a dummy prefill + decode step through the stage
  double warmup_prefill_s = 0;  // of which the prefill (the forward alone, no engine threads yet)
  int warmup_tokens = 0; // the warm-up prefill's tokens (0: no warm-up)
};

struct RunSummary {
  std::string layout;        // "pp=2 tp=2 (4 ranks on 1 host)"
  std::string workload;      // where the requests came from
  std::string techniques;    // "cpu-sampler tsem sat" or the ablation
  double wall_s = 0;
  int requests = 0, finished = 0, failed = 0;
  std::int64_t prompt_tokens = 0, generated_tokens = 0;
  double throughput = 0;     // generated tokens / s
  LatencyStats ttft, tpot;
  std::vector<RankShares> ranks;
  std::vector<std::string> failures;  // "request q3: top_p must be ..."
  std::vector<std::string> notes;     // waits on the KV budget and similar
  std::string trace_path;             // where the trace went, if anywhere
  StartupTimes startup;               // not part of wall_s, TTFT or TPOT
  std::optional<SwiftReport> swift;   // SWIFT's figures when the run could draft
};

// Fills the request-level fields from the scheduler's results (times relative to `start_s`).
void summarize_requests(RunSummary& s, const std::vector<Request>& requests, const std::vector<RequestResult>& results,
                        double start_s);
std::string to_text(const RunSummary& s);
std::string to_json_text(const RunSummary& s);

}  // namespace trellis::runtime
