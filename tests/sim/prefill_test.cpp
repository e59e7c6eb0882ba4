// Prefill and decode microbatching (issue 21 item 2): whole prompts as one wave with its own
// microbatch count, pipeline fill and drain; chunked prefill in the steady state of
// continuous batching, chunks riding with decode steps and inflating TPOT; decode microbatch
// counts beyond 2p; the chunk in the launch line; bad chunk values.
#include <gtest/gtest.h>

#include <algorithm>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/launch.hpp"
#include "trellis/sim/planner.hpp"

namespace trellis::sim {
namespace {

PlanRequest request(const std::string& model, int hosts, int gpus) {
  PlanRequest r;
  r.model = load_model(model);
  r.cluster = make_cluster_view(testing::gpu_cluster(hosts, gpus));
  r.variants = {r.model.trained_variant};
  return r;
}

// One layout of the request, predicted as plan() predicts it.
Candidate one(const PlanRequest& r, int d, int p, int t, int m, int batch, int chunk) {
  Layout l{p, t, m, Variant::kStandard, r.lp_fraction};
  l.prefill_chunk = chunk;
  return evaluate(r, d, l, batch, layout_links(r.cluster, p, t));
}

TEST(Prefill, ChunkingCutsTtftAtLargeBatchUnderTheDefaultObjective) {
  PlanRequest r = request("llama-3.1-70b", 2, 8);
  r.slo_ttft_s = kDefaultSloTtftS;
  r.slo_tpot_s = kDefaultSloTpotS;
  // The wave: 256 prompts prefilled together miss the 2 s TTFT SLO on 8 H100s ...
  const Candidate wave = one(r, 2, 1, 8, 1, 256, 0);
  ASSERT_TRUE(wave.prediction.feasible) << wave.prediction.reason;
  EXPECT_GT(wave.prediction.ttft_s, kDefaultSloTtftS);
  EXPECT_NE(wave.slo_miss.find("TTFT"), std::string::npos);
  // ... chunked, the same layout's requests get their first token well within it.
  const Candidate chunked = one(r, 2, 1, 8, 1, 256, 512);
  ASSERT_TRUE(chunked.prediction.feasible) << chunked.prediction.reason;
  EXPECT_LT(chunked.prediction.ttft_s, kDefaultSloTtftS);
  EXPECT_LT(chunked.prediction.ttft_s, wave.prediction.ttft_s / 4);
  EXPECT_EQ(chunked.prediction.prefill_iterations, 2);  // 1024-token prompts, 512 per iteration
  // The whole search: with whole prompts only, the TTFT SLO caps the batch; with chunks the
  // winner is chunked, runs a larger batch and serves more goodput.
  r.prefill_chunks = {0};
  const PlanResult whole = plan(r);
  r.prefill_chunks = default_prefill_chunks();
  const PlanResult both = plan(r);
  ASSERT_FALSE(whole.ranked.empty());
  ASSERT_FALSE(both.ranked.empty());
  const Candidate& w0 = whole.ranked.front();
  const Candidate& w1 = both.ranked.front();
  EXPECT_EQ(w0.layout.prefill_chunk, 0);
  EXPECT_GT(w1.layout.prefill_chunk, 0);
  EXPECT_GT(w1.batch, w0.batch);
  EXPECT_GT(w1.total_tokens_per_s, w0.total_tokens_per_s);
  EXPECT_LE(w1.prediction.ttft_s, kDefaultSloTtftS);
  EXPECT_LE(w1.prediction.tpot_s, kDefaultSloTpotS);
}

TEST(Prefill, TpotRisesWithChunkSizeAndTtftFalls) {
  PlanRequest r = request("llama-3.1-70b", 1, 8);
  const Candidate plain = one(r, 1, 1, 8, 1, 128, 0);
  ASSERT_TRUE(plain.prediction.feasible);
  double tpot = plain.prediction.tpot_s, ttft = 1e9, share = 2;
  for (int chunk : {256, 512, 1024}) {
    const Candidate c = one(r, 1, 1, 8, 1, 128, chunk);
    ASSERT_TRUE(c.prediction.feasible) << c.prediction.reason;
    const Prediction& p = c.prediction;
    // Interference: the chunks' prefill compute lands on the decoding sequences' steps, more
    // of it beyond the memory-bound step's slack the larger the chunk.
    EXPECT_GT(p.tpot_s, tpot) << "chunk " << chunk;
    EXPECT_GT(p.interference_s, 0);
    EXPECT_NEAR(p.tpot_s - p.interference_s, plain.prediction.tpot_s, 1e-12);
    EXPECT_GT(p.chunk_step_s, plain.prediction.tpot_s);
    // Fewer iterations per prompt: a shorter wait for the first token, fewer iterations
    // carrying a chunk.
    EXPECT_LT(p.ttft_s, ttft);
    EXPECT_LT(p.chunk_share, share);
    EXPECT_EQ(p.prefill_iterations, 1024 / chunk);
    EXPECT_NE(p.dominant.find("prompt chunks of"), std::string::npos) << p.dominant;
    tpot = p.tpot_s, ttft = p.ttft_s, share = p.chunk_share;
  }
  // The share of iterations carrying a chunk follows from the arrivals: each of the 128
  // sequences of the group brings a new prompt every K + gen - 1 iterations, whose prefill
  // takes K of them: 128 x 2 / (2 + 511) chunks per iteration at chunk 512.
  const Candidate c512 = one(r, 1, 1, 8, 1, 128, 512);
  EXPECT_NEAR(c512.prediction.chunk_share, 128.0 * 2 / (2 + 511), 1e-12);
}

TEST(Prefill, WaveHasItsOwnMicrobatchesAndNoFillDrainBubbleAtOneStage) {
  PlanRequest r = request("llama-3.1-70b", 1, 8);
  const Candidate p1 = one(r, 1, 1, 8, 1, 64, 0);
  ASSERT_TRUE(p1.prediction.feasible);
  EXPECT_EQ(p1.prediction.prefill_fill_drain_s, 0);
  EXPECT_EQ(p1.prediction.prefill.bubble, 0);
  EXPECT_GE(p1.prediction.prefill_microbatches, 1);
  const Candidate p4 = one(r, 1, 4, 2, 4, 64, 0);
  ASSERT_TRUE(p4.prediction.feasible);
  EXPECT_GT(p4.prediction.prefill_fill_drain_s, 0);
  EXPECT_LT(p4.prediction.prefill_fill_drain_s, p4.prediction.ttft_s);
  // The wave's microbatch count is chosen for TTFT, not tied to the decode count: every
  // other count predicts a TTFT at least as long.
  for (int m : {1, 2, 4, 8, 16, 32, 64}) {
    Layout l{4, 2, 4, Variant::kStandard, r.lp_fraction};
    l.prefill_microbatches = m;
    const Candidate c = evaluate(r, 1, l, 64, layout_links(r.cluster, 4, 2));
    ASSERT_TRUE(c.prediction.feasible);
    EXPECT_EQ(c.prediction.prefill_microbatches, m);
    EXPECT_GE(c.prediction.ttft_s, p4.prediction.ttft_s - 1e-12) << m;
    EXPECT_EQ(c.prediction.tpot_s, p4.prediction.tpot_s);  // decode does not change
  }
  EXPECT_NE(p4.prediction.prefill_microbatches, p4.layout.microbatches);
}

TEST(Prefill, MoreDecodeMicrobatchesThanTwicePWinWhenHostWorkMakesTheLoopLong) {
  // A small model with a slow engine step (20 ms per iteration, the kind of figure a
  // calibration measures on a CPU-bound scheduler): the loop is many stage cycles long, and
  // only more than 2p microbatches in flight keep the stages busy.
  PlanRequest r = request("llama-3.1-8b", 1, 2);
  r.replicas = false;
  r.objective = Objective::kThroughput;
  r.batches = {256};
  r.prefill_chunks = {0};
  r.host.step_overhead_s = 20e-3;
  const PlanResult res = plan(r);
  ASSERT_FALSE(res.ranked.empty());
  bool beyond = false;
  for (const auto& c : res.ranked) beyond = beyond || c.layout.microbatches > 2 * c.layout.p;
  EXPECT_TRUE(beyond) << "no candidate with m > 2p was searched";
  const Candidate& w = res.ranked.front();
  EXPECT_GT(w.layout.microbatches, 2 * w.layout.p);
  // ... and beats the best the old cap allowed on the same grid.
  const Candidate capped = one(r, 1, w.layout.p, w.layout.t, 2 * w.layout.p, 256, 0);
  ASSERT_TRUE(capped.prediction.feasible);
  EXPECT_GT(w.total_tokens_per_s, capped.total_tokens_per_s);
  EXPECT_LT(w.prediction.tpot_s, capped.prediction.tpot_s);
  // Without the slow step, the loop is short and m = 2p is enough: no more are chosen.
  r.host.step_overhead_s = 0;
  const PlanResult fast = plan(r);
  ASSERT_FALSE(fast.ranked.empty());
  EXPECT_LE(fast.ranked.front().layout.microbatches, 2 * fast.ranked.front().layout.p);
}

TEST(Prefill, PipelineBeatsTpAcrossHostsAtLargeBatchAndNotAtSmall) {
  // SiPipe (Table 4, Fig. 8) and vLLM's guidance: across nodes, PP over the fabric serves
  // more at large batch; a TP group spanning hosts wins only at small batch.
  PlanRequest r = request("llama-3.1-405b", 2, 8);
  r.replicas = false;
  r.objective = Objective::kThroughput;
  r.batches = {128};
  const PlanResult big = plan(r);
  ASSERT_FALSE(big.ranked.empty());
  EXPECT_EQ(big.ranked.front().layout.p, 2);
  EXPECT_EQ(big.ranked.front().layout.t, 8);
  r.batches = {4};
  const PlanResult small = plan(r);
  ASSERT_FALSE(small.ranked.empty());
  EXPECT_EQ(small.ranked.front().layout.t, 16);
}

TEST(Prefill, LaunchLineCarriesTheChunk) {
  PlanRequest r = request("llama-3.1-70b", 2, 8);
  r.slo_ttft_s = kDefaultSloTtftS;
  r.slo_tpot_s = kDefaultSloTpotS;
  const PlanResult res = plan(r);
  ASSERT_FALSE(res.ranked.empty());
  const Candidate& w = res.ranked.front();
  ASSERT_GT(w.layout.prefill_chunk, 0);
  const Launch l = launch_commands(r, w, {"node0", "node1"}, "");
  const std::string flag = " --prefill-chunk " + std::to_string(w.layout.prefill_chunk);
  EXPECT_NE(l.replicas.front().serve.find(flag), std::string::npos) << l.replicas.front().serve;
  EXPECT_NE(l.replicas.front().run.find(flag), std::string::npos) << l.replicas.front().run;
  EXPECT_NE(sbatch_script(r, w, "", "trellis plan", 0).find(flag), std::string::npos);
  // Whole prompts: no flag (the engine's default).
  const Candidate whole = one(r, 2, 1, 8, 1, 16, 0);
  EXPECT_EQ(launch_commands(r, whole, {"node0", "node1"}, "").replicas.front().serve.find("--prefill-chunk"),
            std::string::npos);
}

TEST(Prefill, ChunksAsLongAsThePromptAreOneOptionAndNegativeOnesAreRefused) {
  PlanRequest r = request("llama-3.1-8b", 1, 8);
  r.work.prompt_len = 512;
  r.prefill_chunks = {0, 512, 1024, 2048};
  const PlanResult res = plan(r);
  for (const Candidate* c : res.feasible()) EXPECT_TRUE(c->layout.prefill_chunk == 0 || c->layout.prefill_chunk == 512);
  r.prefill_chunks = {256, -1};
  try {
    plan(r);
    FAIL() << "a negative chunk was planned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("prefill chunk -1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trellis::sim
