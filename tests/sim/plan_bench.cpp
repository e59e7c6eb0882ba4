// How long one planner search takes: Llama-3.1-405B and 70B on synthetic clusters of 16 to
// 1,024 H100s (8 per host, NVLink, 8 x 400G InfiniBand), every variant and the default
// batch list. The target: a 1,024-GPU search in under a second on one core.
#include <benchmark/benchmark.h>

#include "../../tests/sim/sim_fixtures.hpp"
#include "trellis/sim/planner.hpp"

namespace {

// `cli_defaults`: the search `trellis plan` runs with no flags (the trained variant only,
// batches 1..256 in powers of two, the default SLOs); `fp8` adds fp8 beside bf16 (--dtype all).
void BM_Plan(benchmark::State& state, const char* model, bool appendix = false, bool cli_defaults = false,
             bool fp8 = false) {
  using namespace trellis::sim;
  const int gpus = static_cast<int>(state.range(0));
  PlanRequest r;
  r.model = load_model(model);
  r.cluster = make_cluster_view(testing::gpu_cluster(gpus / 8, 8));
  if (appendix) r.kind = ModelKind::kAppendix;
  if (cli_defaults) {
    r.variants = {r.model.trained_variant};
    r.batches = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    r.slo_ttft_s = kDefaultSloTtftS;
    r.slo_tpot_s = kDefaultSloTpotS;
  }
  if (fp8) r.precisions = {Precision::kBf16, Precision::kFp8};
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
// What `trellis plan` searches by default, up to 16,384 GPUs, and with fp8 beside bf16.
BENCHMARK_CAPTURE(BM_Plan, llama405b_cli_defaults, "llama-3.1-405b", false, true)
    ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Plan, llama405b_cli_defaults_fp8, "llama-3.1-405b", false, true, true)
    ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);
// Every variant, both precisions, the 9 batch sizes: the largest search the flags allow.
BENCHMARK_CAPTURE(BM_Plan, llama405b_all_variants_fp8, "llama-3.1-405b", false, false, true)
    ->Arg(1024)->Unit(benchmark::kMillisecond);
// A mixture of experts adds expert parallelism to the search (ep = 1 and a x t for every a
// dividing d that divides the 256 experts): DeepSeek-V3, the defaults with bf16 and fp8.
BENCHMARK_CAPTURE(BM_Plan, deepseek_v3_cli_defaults, "deepseek-v3", false, true)
    ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Plan, deepseek_v3_cli_defaults_fp8, "deepseek-v3", false, true, true)
    ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);
// The same search with the appendix model (the paper's equations) as the in-run reference.
BENCHMARK_CAPTURE(BM_Plan, llama70b_appendix, "llama-3.1-70b", true)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
