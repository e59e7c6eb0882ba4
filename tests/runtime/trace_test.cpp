// Trace events, their packing for the gather, the Chrome trace file, and the summary maths.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "trellis/runtime/trace/metrics.hpp"

using namespace trellis::runtime;

TEST(Trace, TotalsPackAndChromeFile) {
  Tracer t(true);
  t.record(Lane::kForward, TraceCat::kForward, "forward", 1000, 5000, 3, 2);
  t.record(Lane::kForward, TraceCat::kRecv, "recv hidden", 5000, 6000, 3, 1);
  t.record(Lane::kSampler, TraceCat::kSample, "sample", 6000, 9000, 3);
  EXPECT_EQ(t.total_ns(Lane::kForward, TraceCat::kForward), 4000);
  EXPECT_EQ(t.total_ns(Lane::kSampler, TraceCat::kSample), 3000);
  auto evs = unpack_events(pack_events(t.events()));
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_STREQ(evs[1].name, "recv hidden");
  EXPECT_EQ(evs[1].cat, TraceCat::kRecv);
  EXPECT_EQ(evs[2].lane, Lane::kSampler);
  EXPECT_EQ(evs[0].arg, 2);

  Tracer quiet(false);
  quiet.record(Lane::kForward, TraceCat::kForward, "forward", 0, 10);
  EXPECT_TRUE(quiet.events().empty());
  EXPECT_EQ(quiet.total_ns(Lane::kForward, TraceCat::kForward), 10);

  auto path = fmt::format("/tmp/trellis-trace-test-{}.json", ::getpid());
  std::vector<RankLabel> labels = {{0, 0, 0, "h"}, {1, 1, 0, "h"}};
  std::vector<std::vector<TraceEvent>> per_rank = {evs, {}};
  write_chrome_trace(path, labels, per_rank);
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f);
  int complete = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_GE(e["ts"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(j["traceEvents"][0]["args"]["name"], "rank 0 · stage 0 · tp 0 · h");
  ::unlink(path.c_str());
}

TEST(Metrics, LatencyAndSummary) {
  auto s = latency_stats({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.p50, 2);
  EXPECT_DOUBLE_EQ(s.p99, 4);
  EXPECT_EQ(latency_stats({}).n, 0);

  std::vector<Request> reqs(3);
  for (int i = 0; i < 3; ++i) {
    reqs[static_cast<std::size_t>(i)].id = i;
    reqs[static_cast<std::size_t>(i)].name = fmt::format("q{}", i);
    reqs[static_cast<std::size_t>(i)].prompt = {1, 2};
  }
  std::vector<RequestResult> res(3);
  res[0] = {0, RequestStatus::kFinished, "max_tokens", {5, 6, 7}, 10, 11, 13};
  res[1] = {1, RequestStatus::kFinished, "stop", {5}, 10, 12, 12};
  res[2] = {2, RequestStatus::kFailed, "top_p must be in (0, 1]", {}, -1, -1, -1};
  RunSummary sum;
  sum.wall_s = 4;
  summarize_requests(sum, reqs, res, 10);
  EXPECT_EQ(sum.finished, 2);
  EXPECT_EQ(sum.failed, 1);
  EXPECT_EQ(sum.generated_tokens, 4);
  EXPECT_DOUBLE_EQ(sum.throughput, 1.0);
  EXPECT_DOUBLE_EQ(sum.ttft.mean, 1.5);
  EXPECT_EQ(sum.tpot.n, 1);
  EXPECT_DOUBLE_EQ(sum.tpot.mean, 1.0);
  auto text = to_text(sum);
  EXPECT_NE(text.find("request q2: top_p"), std::string::npos);
  auto j = nlohmann::json::parse(to_json_text(sum));
  EXPECT_EQ(j["generated_tokens"], 4);

  Tracer t(false);
  t.record(Lane::kForward, TraceCat::kForward, "forward", 0, 2'000'000'000);
  t.record(Lane::kForward, TraceCat::kAllReduce, "all-reduce", 0, 500'000'000);
  t.record(Lane::kForward, TraceCat::kRecv, "recv hidden", 0, 1'000'000'000);
  auto sh = rank_shares(t, 4.0);
  EXPECT_DOUBLE_EQ(sh.busy_s, 1.5);
  EXPECT_DOUBLE_EQ(sh.comm_s, 1.5);
  EXPECT_DOUBLE_EQ(sh.wait_s, 1.0);
}

// The warm-up's spans are dropped before the run (Tracer::reset), and the start-up phases
// appear in both summaries, apart from TTFT.
TEST(Metrics, StartupReportedAndTracerReset) {
  Tracer t(true);
  t.record(Lane::kForward, TraceCat::kAllReduce, "all-reduce", 0, 1000);
  t.reset();
  EXPECT_EQ(t.total_ns(Lane::kForward, TraceCat::kAllReduce), 0);
  EXPECT_TRUE(t.events().empty());
  t.record(Lane::kForward, TraceCat::kAllReduce, "all-reduce", 0, 500);
  EXPECT_EQ(t.total_ns(Lane::kForward, TraceCat::kAllReduce), 500);

  RunSummary sum;
  sum.startup = {0.25, 1.5, 0.125, 0.1, 256};
  auto j = nlohmann::json::parse(to_json_text(sum));
  EXPECT_DOUBLE_EQ(j["startup"]["connect_s"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["startup"]["load_s"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["startup"]["warmup_s"].get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(j["startup"]["warmup_prefill_s"].get<double>(), 0.1);
  EXPECT_EQ(j["startup"]["warmup_tokens"].get<int>(), 256);
  EXPECT_NE(to_text(sum).find("warm-up 125.00 ms (256 tokens)"), std::string::npos) << to_text(sum);
}
