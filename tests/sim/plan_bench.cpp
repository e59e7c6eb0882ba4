// How long one planner search takes: Llama-3.1-405B and 70B on synthetic clusters of 16 to
// 1,024 H100s (8 per host, NVLink, 8 x 400G InfiniBand), every variant and the default
// batch list. The target: a 1,024-GPU search in under a second on one core.
#include <benchmark/benchmark.h>

#include "../../tests/sim/sim_fixtures.hpp"
#include "trellis/sim/planner.hpp"

namespace {

void BM_Plan(benchmark::State& state, const char* model, bool appendix = false) {
  using namespace trellis::sim;
  const int gpus = static_cast<int>(state.range(0));
  PlanRequest r;
  r.model = load_model(model);
  r.cluster = make_cluster_view(testing::gpu_cluster(gpus / 8, 8));
  if (appendix) r.kind = ModelKind::kAppendix;
  long evaluated = 0;
  for (auto _ : state) {
    PlanResult res = plan(r);
    evaluated = res.evaluated;
    benchmark::DoNotOptimize(res.ranked.data());
  }
  state.counters["layouts"] = static_cast<double>(evaluated);
}

BENCHMARK_CAPTURE(BM_Plan, llama70b, "llama-3.1-70b")->Arg(16)->Arg(128)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Plan, llama405b, "llama-3.1-405b")->Arg(16)->Arg(1024)->Unit(benchmark::kMillisecond);
// The same search with the appendix model (the paper's equations) as the in-run reference.
BENCHMARK_CAPTURE(BM_Plan, llama70b_appendix, "llama-3.1-70b", true)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
