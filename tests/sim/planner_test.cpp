// The planner end to end on hand-built clusters: enumeration covers every grid, ranking is
// by throughput under the SLO, infeasible inputs name the binding constraint, the appendix
// model is selectable, the chart is well-formed.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

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
  auto front = pareto_front(res.feasible(), Variant::kStandard);
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

TEST(Planner, OnlyTheTrainedVariantUnlessAskedAndOthersAreLabelled) {
  PlanRequest r = request("llama-3.1-70b", 1, 8);
  r.variants = {r.model.trained_variant};
  PlanResult plain = plan(r);
  ASSERT_FALSE(plain.ranked.empty());
  for (const auto& c : plain.ranked) {
    EXPECT_EQ(c.layout.variant, Variant::kStandard);
    EXPECT_FALSE(c.needs_trained_model);
  }
  r.variants = all_variants();
  PlanResult all = plan(r);
  int labelled = 0;
  for (const auto& c : all.ranked) {
    EXPECT_EQ(c.needs_trained_model, c.layout.variant != Variant::kStandard);
    labelled += c.needs_trained_model;
  }
  EXPECT_GT(labelled, 0);
  // A model trained as `parallel`: that is the variant planned, at t = 1 too, and standard
  // is the one that needs another model.
  PlanRequest q = request("llama-3.1-8b", 1, 8);
  q.model.trained_variant = Variant::kParallel;
  q.variants = {Variant::kStandard, Variant::kParallel};
  PlanResult par = plan(q);
  bool t1 = false;
  for (const auto& c : par.ranked) {
    EXPECT_EQ(c.needs_trained_model, c.layout.variant != Variant::kParallel);
    if (c.layout.t == 1) {
      t1 = true;
      EXPECT_EQ(c.layout.variant, Variant::kParallel);
    }
  }
  EXPECT_TRUE(t1);
}

TEST(Planner, ObjectivesRankDifferently) {
  PlanRequest r = request("llama-3.1-70b", 2, 8);
  r.variants = {Variant::kStandard};
  r.slo_ttft_s = kDefaultSloTtftS;
  r.slo_tpot_s = kDefaultSloTpotS;
  r.objective = Objective::kGoodput;
  PlanResult good = plan(r);
  ASSERT_FALSE(good.ranked.empty());
  for (const auto& c : good.ranked) {
    EXPECT_LE(c.prediction.ttft_s, kDefaultSloTtftS);
    EXPECT_LE(c.prediction.tpot_s, kDefaultSloTpotS);
  }
  for (std::size_t i = 1; i < good.ranked.size(); ++i)
    EXPECT_GE(good.ranked[i - 1].total_tokens_per_s, good.ranked[i].total_tokens_per_s);
  r.objective = Objective::kLatency;
  PlanResult fast = plan(r);
  ASSERT_EQ(fast.ranked.size(), good.ranked.size());  // same SLO, same set
  for (std::size_t i = 1; i < fast.ranked.size(); ++i)
    EXPECT_LE(fast.ranked[i - 1].request_latency_s, fast.ranked[i].request_latency_s);
  const Candidate& w = fast.ranked.front();
  EXPECT_NEAR(w.request_latency_s, w.prediction.ttft_s + r.work.gen_len * w.prediction.tpot_s, 1e-12);
  EXPECT_LT(w.request_latency_s, good.ranked.front().request_latency_s);
  EXPECT_LT(w.total_tokens_per_s, good.ranked.front().total_tokens_per_s);
  // Without SLOs and with whole prompts only (the planner before chunked prefill), the
  // throughput winner prefills its batch in one wave and needs a far longer wait for its
  // first token.
  r.slo_ttft_s.reset();
  r.slo_tpot_s.reset();
  r.objective = Objective::kThroughput;
  r.prefill_chunks = {0};
  PlanResult raw = plan(r);
  EXPECT_GT(raw.ranked.front().total_tokens_per_s, good.ranked.front().total_tokens_per_s);
  EXPECT_GT(raw.ranked.front().prediction.ttft_s, kDefaultSloTtftS);
  EXPECT_EQ(parse_objective("latency"), Objective::kLatency);
  try {
    parse_objective("fast");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("goodput, throughput, latency"), std::string::npos) << e.what();
  }
}

TEST(Planner, ImpossibleSloListsTheClosestMissesWithHowFar) {
  PlanRequest r = request("llama-3.1-70b", 2, 8);
  r.variants = {Variant::kStandard};
  r.slo_tpot_s = 5e-3;
  PlanResult res = plan(r);
  ASSERT_TRUE(res.ranked.empty());
  ASSERT_GE(res.closest.size(), 3u);
  std::set<std::tuple<int, int, int>> grids;
  for (std::size_t i = 0; i < res.closest.size(); ++i) {
    const Candidate& c = res.closest[i];
    EXPECT_TRUE(c.prediction.feasible);
    EXPECT_GT(c.miss, 1);
    EXPECT_NEAR(c.miss, c.prediction.tpot_s / 5e-3, 1e-9);
    EXPECT_NE(c.slo_miss.find("%)"), std::string::npos) << c.slo_miss;
    if (i > 0) {
      EXPECT_GE(c.miss, res.closest[i - 1].miss);
    }
    EXPECT_TRUE(grids.insert({c.replicas, c.layout.p, c.layout.t}).second) << "one row per grid";
  }
  // Every rejected layout that fits misses by at least as much as the first listed.
  for (const auto& c : res.rejected) {
    if (c.prediction.feasible) {
      EXPECT_GE(c.miss, res.closest.front().miss);
    }
  }
  // Nothing fits in memory: the closest by memory, needed / usable.
  PlanRequest big = request("llama-3.1-405b", 1, 2);
  PlanResult none = plan(big);
  ASSERT_FALSE(none.closest.empty());
  EXPECT_FALSE(none.closest.front().prediction.feasible);
  EXPECT_NEAR(none.closest.front().miss,
              none.closest.front().prediction.memory.total() / none.closest.front().prediction.capacity, 1e-9);
}

TEST(Planner, ExplainsACrossHostTpWinner) {
  // 405B on 2 x 8 H100 as one engine, by throughput at small batch: t=16 over InfiniBand
  // beats p=2 x t=8 (each rank reads 1/16 of the weights once per step, not 1/16 per
  // microbatch). At batch 128 the pipeline wins (prefill_test.cpp).
  PlanRequest r = request("llama-3.1-405b", 2, 8);
  r.variants = {Variant::kStandard};
  r.replicas = false;
  r.objective = Objective::kThroughput;
  r.batches = {16, 32};
  PlanResult res = plan(r);
  ASSERT_FALSE(res.ranked.empty());
  const Candidate& w = res.ranked.front();
  ASSERT_EQ(w.layout.t, 16);
  EXPECT_EQ(w.tp_hosts, 2);
  ASSERT_TRUE(res.tp_across_hosts.has_value());
  const TpAcrossHosts& x = *res.tp_across_hosts;
  EXPECT_EQ(x.hosts, 2);
  EXPECT_EQ(x.link, "ib-ndr");
  EXPECT_DOUBLE_EQ(x.link_bandwidth, 50e9);
  EXPECT_GT(x.inter_s, 0);
  EXPECT_LT(x.inter_s, x.step_s);
  EXPECT_NEAR(x.inter_s, w.prediction.decode.tp_comm_inter * w.layout.microbatches, 1e-12);
  ASSERT_TRUE(x.alternative.has_value());
  EXPECT_EQ(x.alternative->tp_hosts, 1);
  EXPECT_EQ(x.alternative->layout.t, 8);
  EXPECT_NEAR(x.gain, w.total_tokens_per_s / x.alternative->total_tokens_per_s - 1, 1e-12);
  EXPECT_GE(x.gain, 0);
  EXPECT_NE(x.line.find("t=16 spans 2 hosts"), std::string::npos) << x.line;
  EXPECT_NE(x.line.find("ib-ndr at 50.0 GB/s"), std::string::npos) << x.line;
  EXPECT_NE(x.line.find("d=1 p=2 t=8"), std::string::npos) << x.line;
  // A winner inside one host needs no such line.
  PlanRequest small = request("llama-3.1-8b", 2, 8);
  small.variants = {Variant::kStandard};
  PlanResult s = plan(small);
  ASSERT_FALSE(s.ranked.empty());
  EXPECT_EQ(s.ranked.front().tp_hosts, 1);
  EXPECT_FALSE(s.tp_across_hosts.has_value());
}

TEST(Planner, PrecisionIsAPlanDimension) {
  PlanRequest r = request("llama-3.1-70b", 1, 8);
  r.variants = {Variant::kStandard};
  r.precisions = {Precision::kBf16, Precision::kFp8};
  PlanResult res = plan(r);
  std::set<Precision> seen;
  for (const auto& c : res.ranked) seen.insert(c.precision);
  EXPECT_EQ(seen.size(), 2u);
  // A 70B model in fp8 (71 GB) fits one H100: t=1 is feasible only there.
  bool fp8_t1 = false, bf16_t1 = false;
  for (const auto& c : res.ranked) {
    if (c.layout.t == 1 && c.layout.p == 1) (c.precision == Precision::kFp8 ? fp8_t1 : bf16_t1) = true;
  }
  EXPECT_TRUE(fp8_t1);
  EXPECT_FALSE(bf16_t1);
  EXPECT_EQ(res.ranked.front().precision, Precision::kFp8);  // decode is memory-bound: fp8 wins
}

TEST(Planner, GpusBeyondTheClusterIsAnError) {
  PlanRequest r = request("llama-3.1-8b", 1, 2);
  r.devices = 4;
  EXPECT_THROW(plan(r), Error);
}

}  // namespace
}  // namespace trellis::sim
