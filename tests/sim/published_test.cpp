// Validation against published results (sim/published.hpp): the shipped file parses, every
// comparison the planner can express is predicted, and each direction is what the file
// expects (a direction that is right today and flips fails here); the ratio and error
// arithmetic; and bad input names the entry and the field.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "trellis/core/error.hpp"
#include "trellis/sim/published.hpp"

namespace trellis::sim {
namespace {

const std::string kShipped = std::string(TRELLIS_SOURCE_DIR) + "/sim/data/published_results.json";

// One comparison of Llama-3.1-8B on one H100 against itself unless `a` or `extra` change it.
std::string entry(const std::string& id, const std::string& extra, const std::string& a = "",
                  const std::string& b = "") {
  const std::string side_a = a.empty() ? R"({"label": "A", "cluster": "1x1xH100"})" : a;
  const std::string side_b = b.empty() ? R"({"label": "B", "cluster": "1x1xH100"})" : b;
  return R"({"id": ")" + id + R"(", "source": "test", "where": "here", "hardware": "H100", "model": "llama-3.1-8b",
             "metric": "tokens_per_s", "batch": 4, "a": )" +
         side_a + R"(, "b": )" + side_b + (extra.empty() ? "" : ", " + extra) + "}";
}

std::string file(const std::string& entries) {
  return R"({"schema": "trellis.published.v1", "comparisons": [)" + entries + "]}";
}

// The message of the kCorruptInput error for `text`, or "no error".
std::string error_of(const std::string& text) {
  try {
    parse_published(text, "pub.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput) << e.what();
    return e.what();
  }
  return "no error";
}

TEST(Published, ShippedFileEveryRowPredictedAndEachDirectionAsExpected) {
  const auto comparisons = load_published(kShipped);
  std::set<std::string> sources;
  int supported = 0;
  for (const auto& c : comparisons) {
    sources.insert(c.source);
    supported += c.unsupported.empty();
  }
  EXPECT_GE(supported, 5) << "issue 21.7 asks for at least five published comparisons";
  EXPECT_GE(sources.size(), 3u);
  const PublishedReport rep = validate_published(comparisons);
  ASSERT_EQ(rep.rows.size(), comparisons.size());
  EXPECT_EQ(rep.evaluated, supported);
  for (const auto& row : rep.rows) {
    const auto& c = row.comparison;
    SCOPED_TRACE(c.id);
    if (!c.unsupported.empty()) {
      EXPECT_FALSE(row.evaluated);
      EXPECT_NE(row.not_evaluated.find(c.unsupported), std::string::npos);
      continue;
    }
    ASSERT_TRUE(row.evaluated) << row.not_evaluated;
    EXPECT_GT(row.a.value, 0);
    EXPECT_GT(row.b.value, 0);
    EXPECT_TRUE(std::isfinite(row.predicted_ratio) && row.predicted_ratio > 0);
    EXPECT_DOUBLE_EQ(row.predicted_ratio, row.a.value / row.b.value);
    // The file says which directions the model gets wrong today, with the reason; any
    // other direction flipping (or a known miss being fixed unnoticed) fails here.
    EXPECT_EQ(row.direction_ok, c.expect_direction_ok)
        << "predicted " << row.predicted_ratio << " against published " << published_ratio_text(c)
        << (c.expect_direction_ok ? "" : " (expected wrong: " + c.expect_reason + ")");
  }
  const std::string table = format_published(rep);
  for (const auto& c : comparisons) EXPECT_NE(table.find("| " + c.id + " |"), std::string::npos) << c.id;
}

TEST(Published, ErrorIsMeasuredFromThePublishedFigureOrTheNearestEndOfTheRange) {
  // Both sides identical: the predicted ratio is exactly 1, whatever the model predicts.
  const auto cs = parse_published(
      file(entry("point", R"("published_ratio": 2)") + "," +
           entry("range", R"("published_ratio_min": 1.5, "published_ratio_max": 3)") + "," +
           entry("below", R"("published_ratio_max": 0.8)") + "," +
           entry("values", "", R"({"label": "A", "cluster": "1x1xH100", "value": 30})",
                 R"({"label": "B", "cluster": "1x1xH100", "value": 20})")),
      "pub.json");
  ASSERT_EQ(cs.size(), 4u);
  EXPECT_DOUBLE_EQ(cs[3].ratio_min, 1.5);
  EXPECT_EQ(published_ratio_text(cs[1]), "1.50-3.00");
  EXPECT_EQ(published_ratio_text(cs[2]), "<= 0.800");
  const PublishedReport rep = validate_published(cs);
  ASSERT_EQ(rep.evaluated, 4);
  for (const auto& row : rep.rows) {
    EXPECT_DOUBLE_EQ(row.predicted_ratio, 1.0) << row.comparison.id;
    EXPECT_FALSE(row.direction_ok) << row.comparison.id << ": a ratio of 1 has no direction";
  }
  EXPECT_DOUBLE_EQ(rep.rows[0].error, 1.0 / 2 - 1);
  EXPECT_DOUBLE_EQ(rep.rows[1].error, 1.0 / 1.5 - 1);
  EXPECT_DOUBLE_EQ(rep.rows[2].error, 1.0 / 0.8 - 1);
  EXPECT_TRUE(rep.rows[2].within_30);
  EXPECT_FALSE(rep.rows[0].within_30);
  EXPECT_EQ(rep.directions_right, 0);
  EXPECT_DOUBLE_EQ(rep.rows[0].effect_share, 0);  // ln 1 / ln 2: none of the published effect

}

TEST(Published, MoreMemoryBandwidthIsFasterAndTheDirectionSaysSo) {
  // H200 (4.8 TB/s) against H100 (3.35 TB/s) for a memory-bound decode at batch 4.
  const auto cs = parse_published(
      file(entry("h200", R"("published_ratio": 1.3)", R"({"label": "H200", "cluster": "1x1xH200"})")), "pub.json");
  const PublishedReport rep = validate_published(cs);
  ASSERT_EQ(rep.evaluated, 1);
  EXPECT_GT(rep.rows[0].predicted_ratio, 1.1);
  EXPECT_TRUE(rep.rows[0].direction_ok);
  const double r = rep.rows[0].predicted_ratio;
  EXPECT_DOUBLE_EQ(rep.rows[0].effect_share, std::log(r) / std::log(1.3));
}

TEST(Published, MaxThroughputPicksTheBestBatchThatFits) {
  const auto cs = parse_published(
      file(R"({"id": "max", "source": "t", "where": "w", "hardware": "h", "model": "llama-3.1-70b",
               "metric": "max_tokens_per_s", "max_batch": 256, "published_ratio": 1.2,
               "a": {"label": "TP2", "cluster": "1x2xH100", "tp": 2}, "b": {"label": "TP1", "cluster": "1x1xH200"}})"),
      "pub.json");
  const PublishedPrediction best = predict_published_side(cs[0], cs[0].a);
  ASSERT_GT(best.batch, 0);
  EXPECT_LE(best.batch, 256);
  for (int b = 1; b <= 256; b *= 2) {
    PublishedComparison fixed = cs[0];
    fixed.metric = PublishedMetric::kTokensPerS;
    fixed.batch = b;
    try {
      EXPECT_LE(predict_published_side(fixed, fixed.a).value, best.value * (1 + 1e-12)) << "batch " << b;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();  // this batch does not fit
    }
  }
}

TEST(Published, ABatchCapHalvesUntilItFitsOtherwiseTheEntryIsNamed) {
  const std::string side = R"({"label": "P4", "cluster": "2x8xH100-NDR", "pp": 4, "tp": 4})";
  const std::string e = R"({"id": "cap", "source": "t", "where": "w", "hardware": "h", "model": "llama-3.1-405b",
      "metric": "tokens_per_s", "batch": 4096, "published_ratio": 1.1, "a": )" + side + ", \"b\": " + side;
  const auto capped = parse_published(file(e + R"(, "batch_is_cap": true})"), "pub.json");
  const PublishedPrediction p = predict_published_side(capped[0], capped[0].a);
  EXPECT_LT(p.batch, 4096);
  EXPECT_GE(p.batch, 4);
  const auto strict = parse_published(file(e + "}"), "pub.json");
  try {
    predict_published_side(strict[0], strict[0].a);
    ADD_FAILURE() << "405B at batch 4096 fits on 16 H100s";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(std::string(err.what()).find("'cap', side 'P4' at batch 4096"), std::string::npos) << err.what();
  }
}

TEST(Published, BadInputNamesTheEntryAndTheField) {
  auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg << "\nwanted: " << want;
  };
  has(error_of("{"), "published results file pub.json: not valid JSON");
  has(error_of(R"({"schema": "x", "comparisons": []})"), "field 'schema'");
  has(error_of(R"({"schema": "trellis.published.v1", "comparisons": []})"), "field 'comparisons' must be a non-empty");
  // Missing fields.
  has(error_of(file(R"({"source": "s"})")), "comparisons[0] field 'id' is missing");
  std::string no_hw = entry("x", R"("published_ratio": 2)");
  no_hw.replace(no_hw.find(R"("hardware": "H100",)"), 19, "");
  has(error_of(file(no_hw)), "entry 'x' field 'hardware' is missing");
  has(error_of(file(entry("x", ""))), "entry 'x' field 'published_ratio' is missing");
  has(error_of(file(entry("x", R"("published_ratio": 2)", R"({"label": "A"})"))), "entry 'x' field 'a.cluster' is missing");
  // Unknown names.
  std::string model = entry("m", R"("published_ratio": 2)");
  model.replace(model.find("llama-3.1-8b"), 12, "llama-9");
  has(error_of(file(model)), "entry 'm' field 'model': unknown model 'llama-9'");
  has(error_of(file(entry("g", R"("published_ratio": 2)", R"({"label": "A", "cluster": "1x1xTPU"})"))),
      "entry 'g' field 'a.cluster': unknown cluster '1x1xTPU'");
  has(error_of(file(entry("v", R"("published_ratio": 2)", R"({"label": "A", "cluster": "1x1xH100", "variant": "turbo"})"))),
      "entry 'v' field 'a.variant'");
  has(error_of(file(entry("f", R"("published_ratio": 2)", "", R"({"label": "B", "cluster": "1x1xA100", "dtype": "fp8"})"))),
      "entry 'f' field 'b.dtype': fp8 on A100-SXM, which has no FP8 tensor cores");
  std::string metric = entry("mt", R"("published_ratio": 2)");
  metric.replace(metric.find("\"tokens_per_s\""), 14, "\"speed\"");
  has(error_of(file(metric)), "entry 'mt' field 'metric': 'speed' is not one of tokens_per_s, max_tokens_per_s");
  // Non-numeric and out-of-range values.
  has(error_of(file(entry("n", R"("published_ratio": "fast")"))), "entry 'n' field 'published_ratio' must be a number > 0 (got \"fast\")");
  has(error_of(file(entry("t", R"("published_ratio": 2)", R"({"label": "A", "cluster": "1x1xH100", "tp": "8"})"))),
      "entry 't' field 'a.tp' must be an integer >= 1 (got \"8\")");
  has(error_of(file(entry("d", R"("published_ratio": 2)", R"({"label": "A", "cluster": "1x1xH100", "tp": 2})"))),
      "entry 'd' field 'a.pp': replicas x pp x tp = 2 devices, but cluster '1x1xH100' has 1");
  has(error_of(file(entry("l", R"("published_ratio": 2)",
                          R"({"label": "A", "cluster": "1x1xH100", "variant": "lp", "lp_fraction": 1.5})"))),
      "entry 'l' field 'a.lp_fraction' must be a share of the layers in (0, 1] (got 1.5)");
  // Ratios that contradict themselves or have no direction.
  has(error_of(file(entry("r", R"("published_ratio": 2)", R"({"label": "A", "cluster": "1x1xH100", "value": 30})",
                          R"({"label": "B", "cluster": "1x1xH100", "value": 20})"))),
      "entry 'r' field 'published_ratio' is 2 but a.value / b.value = 30 / 20 = 1.5");
  has(error_of(file(entry("s", R"("published_ratio_min": 0.9, "published_ratio_max": 1.2)"))),
      "entry 's' field 'published_ratio_min': the range 0.900-1.20 spans 1");
  has(error_of(file(entry("e", R"("published_ratio": 2, "expect_direction_ok": false)"))),
      "entry 'e' field 'expect_reason' is missing");
  has(error_of(file(entry("u", R"("published_ratio": 2)") + "," + entry("u", R"("published_ratio": 2)"))),
      "entry 'u' field 'id' is used by an earlier entry");
  // An unsupported entry is not resolved (its model may be outside the catalog) but must
  // still be complete.
  std::string unsupported = entry("x", R"("published_ratio": 2, "unsupported": "MoE")");
  unsupported.replace(unsupported.find("llama-3.1-8b"), 12, "deepseek-v3-x");
  EXPECT_EQ(error_of(file(unsupported)), "no error");
  try {
    load_published("/nonexistent/pub.json");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

}  // namespace
}  // namespace trellis::sim
