// The planner end to end on hand-built clusters: enumeration covers every grid, ranking is
// by throughput under the SLO, infeasible inputs name the binding constraint, the appendix
// model is selectable, the chart is well-formed.
#include <gtest/gtest.h>

#include <set>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/planner.hpp"

namespace trellis::sim {
namespace {

PlanRequest request(const std::string& model, int hosts, int gpus) {
  PlanRequest r;
  r.model = load_model(model);
  r.cluster = make_cluster_view(testing::gpu_cluster(hosts, gpus));
  return r;
}

TEST(Planner, RanksEveryGridOfLlama70BOnTwoByEightH100) {
  PlanRequest r = request("llama-3.1-70b", 2, 8);
  PlanResult res = plan(r);
  ASSERT_FALSE(res.ranked.empty()) << res.binding_constraint;
  std::set<std::pair<int, int>> grids;
  EXPECT_FALSE(res.bounds.empty());
  for (const auto& c : res.ranked) {
    EXPECT_NE(c.layout.variant, Variant::kNoComm);  // a bound with wrong outputs is never a pick
    EXPECT_EQ(c.replicas * c.layout.p * c.layout.t, 16);
    grids.insert({c.layout.p, c.layout.t});
  }
  for (std::size_t i = 1; i < res.ranked.size(); ++i)
    EXPECT_GE(res.ranked[i - 1].total_tokens_per_s, res.ranked[i].total_tokens_per_s);
  EXPECT_TRUE(grids.count({2, 8}));
  EXPECT_TRUE(grids.count({1, 8}));
  // t=16 is infeasible (8 KV heads... divisible; but 64 heads / 16 = 4: feasible) and p=16 too.
  EXPECT_FALSE(res.why.empty());
  // Something was rejected for memory: a single H100 cannot hold 70B in bf16.
  bool memory = false;
  for (const auto& c : res.rejected) memory = memory || c.prediction.reason.rfind("memory", 0) == 0;
  EXPECT_TRUE(memory);
}

TEST(Planner, SloFiltersAndNamesTheBindingConstraint) {
  PlanRequest r = request("llama-3.1-70b", 2, 8);
  r.slo_tpot_s = 20e-3;
  PlanResult ok = plan(r);
  ASSERT_FALSE(ok.ranked.empty());
  for (const auto& c : ok.ranked) EXPECT_LE(c.prediction.tpot_s, 20e-3);
  r.slo_tpot_s = 0.1e-3;
  PlanResult none = plan(r);
  EXPECT_TRUE(none.ranked.empty());
  EXPECT_NE(none.binding_constraint.find("latency SLO"), std::string::npos) << none.binding_constraint;
}

TEST(Planner, NothingFitsNamesMemory) {
  PlanRequest r = request("llama-3.1-405b", 1, 2);
  PlanResult res = plan(r);
  EXPECT_TRUE(res.ranked.empty());
  EXPECT_NE(res.binding_constraint.find("device memory"), std::string::npos) << res.binding_constraint;
}

TEST(Planner, AppendixModelIsSelectable) {
  PlanRequest r = request("llama-3.1-70b", 2, 8);
  r.kind = ModelKind::kAppendix;
  r.variants = {Variant::kStandard};
  PlanResult res = plan(r);
  ASSERT_FALSE(res.ranked.empty());
  EXPECT_NE(res.ranked.front().prediction.dominant.find("appendix"), std::string::npos);
}

TEST(Planner, ParetoFrontIsMonotoneAndSvgWellFormed) {
  PlanRequest r = request("llama-3.1-8b", 1, 8);
  PlanResult res = plan(r);
  auto front = pareto_front(res.feasible, Variant::kStandard);
  ASSERT_GE(front.size(), 2u);
  for (std::size_t i = 1; i < front.size(); ++i) {
    EXPECT_GE(front[i]->prediction.tpot_s, front[i - 1]->prediction.tpot_s);
    EXPECT_GT(front[i]->total_tokens_per_s, front[i - 1]->total_tokens_per_s);
  }
  const std::string svg = pareto_svg(res, "llama <8b>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("llama &lt;8b&gt;"), std::string::npos);
  EXPECT_NE(svg.find("ladder"), std::string::npos);
}

TEST(Planner, GpusBeyondTheClusterIsAnError) {
  PlanRequest r = request("llama-3.1-8b", 1, 2);
  r.devices = 4;
  EXPECT_THROW(plan(r), Error);
}

}  // namespace
}  // namespace trellis::sim
