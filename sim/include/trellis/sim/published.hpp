// Validation against published results: comparisons between two configurations that other
// people measured and published (engine documentation, vendor blogs, papers), each run
// through the planner's model, so that the direction of every comparison and its ratio can
// be checked against the source. `trellis plan --validate-published [FILE]`; the shipped
// file is sim/data/published_results.json and docs/planner.md ("Validation against
// published results") has the table it produces.
//
// The file:
//
//   { "schema": "trellis.published.v1",
//     "comparisons": [ {
//       "id": "trtllm-405b-h200-vs-h100",            unique, used in messages
//       "source": "TensorRT-LLM docs, Performance Overview", "url": "https://...",
//       "where": "table 'Llama 3.1 405B', ISL/OSL 1000/1000",
//       "engine": "TensorRT-LLM (trtllm-bench, PyTorch backend)", "hardware": "8x H200 SXM vs 8x H100 SXM",
//       "model": "llama-3.1-405b",                    a catalog model
//       "metric": "max_tokens_per_s",                 tokens_per_s | max_tokens_per_s | ttft_ms | tpot_ms
//       "prompt_len": 1000, "gen_len": 1000,          default 1024 and 512
//       "batch": 4,                                   concurrent sequences (tokens_per_s, ttft_ms, tpot_ms)
//       "batch_is_cap": true,                         optional: the batch is the engine's cap; fewer run
//                                                     when they do not fit in memory (halved until they fit)
//       "max_batch": 4096,                            max_tokens_per_s: largest batch searched (powers of 2)
//       "a": { "label": "H200 TP8 FP8", "cluster": "1x8xH200", "pp": 1, "tp": 8,
//              "replicas": 1, "microbatches": 0 (0: pp), "variant": "standard", "dtype": "fp8",
//              "lp_fraction": 0.375 (variant lp: share of the layers in pairs, default 0.8),
//              "techniques": "sipipe" | "none" | "cpu_sampling,token_safe,structure_aware",
//              "batch": 4 (overrides the entry's), "value": 3330 },
//       "b": { ... },
//       "published_ratio": 1.141,                     a / b; or "published_ratio_min" and/or
//                                                     "published_ratio_max" for a range or a bound;
//                                                     derived from a.value / b.value when both given
//       "note": "assumptions", "unsupported": "why the planner cannot express it (not evaluated)",
//       "expect_direction_ok": true, "expect_reason": "..." } ] }
//
// The ratio is metric(a) / metric(b) in the metric's own units (for ttft_ms and tpot_ms a
// ratio above 1 means a is slower). A comparison's direction is whether that ratio is above
// or below 1; a published range must lie on one side of 1. The error of a prediction is
// predicted / published - 1, measured from the nearest end of a range (0 inside it).
//
// A malformed file throws kCorruptInput naming the file, the entry (by id or index) and the
// field; an unknown model, GPU or variant, or fp8 on a GPU without FP8 tensor cores, too.
// Pure functions over values; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trellis/sim/catalog.hpp"
#include "trellis/sim/cluster.hpp"
#include "trellis/sim/cost_model.hpp"

namespace trellis::sim {

enum class PublishedMetric {
  kTokensPerS,     // generated tokens/s of all replicas at the given batch (prefill included)
  kMaxTokensPerS,  // the highest tokens/s over batches 1, 2, 4, ... max_batch that fit: an
                   // engine under maximum load (TensorRT-LLM's throughput benchmark)
  kTtftMs,         // time to first token at the given batch
  kTpotMs,         // time per output token at the given batch
};
std::string_view to_string(PublishedMetric m);

// One of the two configurations of a comparison.
struct PublishedSide {
  std::string label;             // as the source names it ("vLLM P_4^2", "H200 TP8 FP8")
  std::string cluster;           // planner cluster spec ("1x8xH200", "2x8xH100-NDR")
  ClusterView view;              // the spec resolved
  int replicas = 1, p = 1, t = 1;
  int microbatches = 0;          // 0: p (one microbatch per stage in flight)
  Variant variant = Variant::kStandard;
  double lp_fraction = 0.8;      // lp: share of the layers in parallel pairs
  Precision precision = Precision::kBf16;
  PipelineTechniques techniques; // default: SiPipe's three on (the planner's default)
  std::string techniques_text = "sipipe";
  int batch = 0;                 // 0: the comparison's
  std::optional<double> value;   // the published figure, where the source gives one
};

struct PublishedComparison {
  std::string id, source, url, where, engine, hardware, note;
  std::string model_name;
  ModelSpec model;               // resolved (empty for an unsupported entry)
  PublishedMetric metric = PublishedMetric::kTokensPerS;
  int prompt_len = 1024, gen_len = 512;
  int batch = 1, max_batch = 4096;
  bool batch_is_cap = false;
  PublishedSide a, b;
  double ratio_min = 0, ratio_max = 0;  // published a / b; equal for one figure; max may be +inf
  std::string unsupported;       // non-empty: not evaluated, and why
  bool expect_direction_ok = true;
  std::string expect_reason;

  bool is_range() const { return ratio_min != ratio_max; }
  bool published_above_one() const { return ratio_min >= 1; }
};

// What the planner predicts for one side.
struct PublishedPrediction {
  double value = 0;    // in the metric's units (tokens/s or ms)
  int batch = 0;       // the batch it was predicted at (the best one for max_tokens_per_s)
  int microbatches = 0;
  std::string dominant;  // the term that bounds its decode step
};

struct PublishedRow {
  PublishedComparison comparison;
  bool evaluated = false;
  std::string not_evaluated;     // unsupported, or the side that did not fit and why
  PublishedPrediction a, b;
  double predicted_ratio = 0;
  bool direction_ok = false;
  double error = 0;              // predicted / published - 1 (nearest end of a range; 0 inside)
  bool within_30 = false;
  // How much of the published effect the prediction has: ln(predicted) / ln(published), the
  // published figure taken at the nearest end of a range (1 inside it); NaN where the
  // source gives only a direction. 0.1: a 2% gain predicted where 20% was published.
  double effect_share = 0;
};

struct PublishedReport {
  std::vector<PublishedRow> rows;
  int evaluated = 0, directions_right = 0, within_30 = 0, unsupported = 0;
  double median_abs_error = 0;   // over the evaluated rows
};

std::vector<PublishedComparison> parse_published(const std::string& json_text, const std::string& origin);
std::vector<PublishedComparison> load_published(const std::string& path);

// Predicts both sides of one comparison (throws kInvalidArgument if it is unsupported).
PublishedPrediction predict_published_side(const PublishedComparison& c, const PublishedSide& s);

// Predicts every supported comparison and compares the ratios.
PublishedReport validate_published(const std::vector<PublishedComparison>& comparisons);

// "1.14", "1.6-2.1", ">= 1.30", "> 1".
std::string published_ratio_text(const PublishedComparison& c);

// The table (Markdown, as docs/planner.md shows it) and a summary line.
std::string format_published(const PublishedReport& report);

}  // namespace trellis::sim
