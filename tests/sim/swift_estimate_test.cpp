// SWIFT in the planner (sim/swift_estimate.hpp): Eq. (6) reproduces the expected speedups of
// the paper's Table 4, a plan's TPOT shrinks by exactly that factor while TTFT stays, and out
// of range values are refused with the flag named.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/planner.hpp"
#include "trellis/sim/swift_estimate.hpp"

namespace trellis::sim {
namespace {

struct Table4Row {
  const char* what;
  double m, alpha, r, expected;
};

// Table 4 (appendix C.1): M, alpha and E(Spd.) per model and task; r from appendix B.2 (0.45
// for the 13B models, 0.5 for 70B).
constexpr Table4Row kTable4[] = {
    {"LLaMA-2-13B CNN/DM", 4.34, 0.99, 0.45, 1.52},      {"LLaMA-2-13B GSM8K", 3.13, 0.98, 0.45, 1.43},
    {"LLaMA-2-13B TinyStories", 8.21, 1.00, 0.45, 1.65}, {"LLaMA-2-13B-Chat CNN/DM", 3.54, 0.90, 0.45, 1.39},
    {"LLaMA-2-13B-Chat GSM8K", 2.95, 0.92, 0.45, 1.36},  {"LLaMA-2-13B-Chat TinyStories", 7.42, 0.99, 0.45, 1.62},
    {"LLaMA-2-70B CNN/DM", 3.85, 0.99, 0.5, 1.58},       {"LLaMA-2-70B GSM8K", 2.99, 0.98, 0.5, 1.48},
    {"LLaMA-2-70B TinyStories", 6.17, 0.99, 0.5, 1.71},
};

TEST(SwiftEstimate, ReproducesTable4) {
  for (const auto& row : kTable4)
    EXPECT_NEAR(swift_speedup({row.m, row.alpha, row.r}), row.expected, 0.02) << row.what;
}

TEST(SwiftEstimate, EdgeCases) {
  EXPECT_DOUBLE_EQ(swift_speedup({1.0, 0.5, 0.3}), 1.0);  // nothing accepted: plain decoding
  EXPECT_DOUBLE_EQ(swift_speedup({4.0, 1.0, 0.0}), 1.0);  // a draft as dear as the model gains nothing
  EXPECT_NEAR(swift_speedup({kSwiftDefaultM, kSwiftDefaultAlpha, kSwiftDefaultR}),
              kSwiftDefaultM * kSwiftDefaultAlpha / ((kSwiftDefaultM - 1) * (1 - kSwiftDefaultR) + kSwiftDefaultAlpha),
              1e-12);
  const std::string line = describe_swift(SwiftEstimate{});
  EXPECT_NE(line.find("SWIFT decode: estimate from Eq. (6) with M=2.19, α=0.87, r=0.20 (not measured on this cluster)"),
            std::string::npos)
      << line;
}

void expect_refused(SwiftEstimate e, const std::string& flag) {
  try {
    (void)swift_speedup(e);
    ADD_FAILURE() << "accepted M=" << e.m << " alpha=" << e.alpha << " r=" << e.r;
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find(flag), std::string::npos) << err.what();
  }
}

TEST(SwiftEstimate, RefusesOutOfRangeNamingTheFlag) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_refused({0.99, 0.9, 0.2}, "--swift-m");
  expect_refused({nan, 0.9, 0.2}, "--swift-m");
  expect_refused({std::numeric_limits<double>::infinity(), 0.9, 0.2}, "--swift-m");
  expect_refused({2, 0, 0.2}, "--swift-alpha");
  expect_refused({2, 1.01, 0.2}, "--swift-alpha");
  expect_refused({2, nan, 0.2}, "--swift-alpha");
  expect_refused({2, 0.9, -0.1}, "--swift-r");
  expect_refused({2, 0.9, 1.0}, "--swift-r");
  expect_refused({2, 0.9, nan}, "--swift-r");
  EXPECT_NO_THROW(check_swift_estimate({1, 1, 0}));
}

PlanRequest request() {
  PlanRequest r;
  r.model = load_model("llama-3.1-8b");
  r.cluster = make_cluster_view(testing::gpu_cluster(1, 8));
  r.batches = {1, 16};
  return r;
}

TEST(SwiftEstimate, PlanTpotShrinksByExactlyTheFactor) {
  PlanRequest plain = request();
  PlanRequest swift = request();
  swift.swift = SwiftEstimate{3.0, 0.95, 0.4};
  const double k = swift_speedup(*swift.swift);
  ASSERT_GT(k, 1.3);
  for (int chunk : {0, 512}) {
    Layout l;
    l.t = 2;
    l.prefill_chunk = chunk;
    const LayoutLinks links = layout_links(plain.cluster, 1, 2);
    for (int batch : {1, 16}) {
      const Candidate a = evaluate(plain, 1, l, batch, links);
      const Candidate b = evaluate(swift, 1, l, batch, links);
      ASSERT_TRUE(a.prediction.feasible && b.prediction.feasible) << a.prediction.reason;
      EXPECT_NEAR(b.prediction.tpot_s, a.prediction.tpot_s / k, 1e-15) << "chunk " << chunk << " batch " << batch;
      EXPECT_NEAR(b.prediction.decode_tokens_per_s, a.prediction.decode_tokens_per_s * k,
                  1e-9 * a.prediction.decode_tokens_per_s);
      EXPECT_DOUBLE_EQ(b.prediction.ttft_s, a.prediction.ttft_s);  // prefill unchanged
      const double gen = plain.work.gen_len;
      EXPECT_NEAR(b.prediction.tokens_per_s, batch * gen / (a.prediction.ttft_s + gen * a.prediction.tpot_s / k),
                  1e-9 * b.prediction.tokens_per_s);
      EXPECT_GT(b.total_tokens_per_s, a.total_tokens_per_s);
      EXPECT_NEAR(b.request_latency_s, a.prediction.ttft_s + gen * a.prediction.tpot_s / k, 1e-12);
    }
  }
}

TEST(SwiftEstimate, PlanRefusesABadEstimate) {
  PlanRequest r = request();
  r.swift = SwiftEstimate{2.0, 0.0, 0.2};
  EXPECT_THROW(plan(r), Error);
}

TEST(SwiftEstimate, PlanRanksTheSameLayoutsFaster) {
  PlanRequest plain = request();
  PlanRequest swift = request();
  swift.swift = SwiftEstimate{};
  const PlanResult a = plan(plain), b = plan(swift);
  ASSERT_FALSE(a.ranked.empty());
  ASSERT_FALSE(b.ranked.empty());
  EXPECT_EQ(a.evaluated, b.evaluated);
  EXPECT_GE(b.ranked.front().total_tokens_per_s, a.ranked.front().total_tokens_per_s);
}

}  // namespace
}  // namespace trellis::sim
