// Mixture of experts and MLA in the planner: parameter counts of the catalog MoE models
// against their published totals, what a rank holds and streams under expert parallelism,
// the all-to-all (only for MoE, only when ep > 1, dearer across hosts), MLA's latent KV
// cache, config.json fields read or refused by name, and DeepSeek-V3 planned on 16 H100s.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/planner.hpp"
#include "trellis/sim/units.hpp"

namespace trellis::sim {
namespace {

// Published totals: DeepSeek-V3 technical report (671 B, 37 B activated; the hub's 685 B adds
// the 14 B MTP module, not counted here), Mistral's Mixtral 8x22B announcement (141 B, 39 B
// active), Qwen3 technical report / model cards (235 B / 22 B, 30.5 B / 3.3 B).
TEST(Moe, CatalogParameterCountsWithinTwoPercentOfThePublishedTotals) {
  struct Published {
    const char* model;
    double total, active;
  };
  for (const Published& p : {Published{"deepseek-v3", 671e9, 37e9}, Published{"mixtral-8x22b", 141e9, 39e9},
                             Published{"qwen3-235b-a22b", 235e9, 22e9}, Published{"qwen3-30b-a3b", 30.5e9, 3.3e9}}) {
    const ModelSpec m = load_model(p.model);
    EXPECT_TRUE(m.is_moe()) << p.model;
    EXPECT_NEAR(m.total_params() / p.total, 1.0, 0.02) << p.model << " total " << m.total_params() / 1e9;
    EXPECT_NEAR(m.active_params() / p.active, 1.0, 0.02) << p.model << " active " << m.active_params() / 1e9;
    EXPECT_NE(m.source.find("config.json"), std::string::npos) << p.model;
  }
  const ModelSpec ds = load_model("DeepSeek-V3");
  EXPECT_EQ(ds.moe_layers_in(0, ds.layers), 58);  // first_k_dense_replace 3
  EXPECT_FALSE(ds.is_moe_layer(2));
  EXPECT_TRUE(ds.is_moe_layer(3));
  EXPECT_TRUE(ds.is_mla());
  // A dense model's active parameters are all of them.
  const ModelSpec llama = load_model("llama-3.1-70b");
  EXPECT_DOUBLE_EQ(llama.active_params(), llama.total_params());
}

TEST(Moe, MlaCachesTheLatentOncePerTokenPerLayer) {
  const ModelSpec ds = load_model("deepseek-v3");
  EXPECT_DOUBLE_EQ(ds.kv_bytes_per_token_layer(1), 512 + 64);
  EXPECT_DOUBLE_EQ(ds.kv_bytes_per_token_layer(2), 2.0 * (512 + 64));
  // On a rank: every TP rank keeps the whole latent (it is one "head" for all query heads).
  const ClusterView c = make_cluster_view(testing::gpu_cluster(4, 8, "H200"));
  ModelInputs in = testing::inputs(ds, c, 1, 8, 1, Variant::kStandard, 4);
  in.work = with_precision(in.work, Precision::kFp8);
  in.work.batch = 4;
  in.layout.ep = 8;
  const Prediction p = predict(in);
  const double tokens = 4.0 * (in.work.prompt_len + in.work.gen_len);
  EXPECT_DOUBLE_EQ(p.memory.kv_cache, tokens * ds.layers * (512 + 64) * 1.0);
}

TEST(Moe, ExpertsTouchedFollowsTheDraws) {
  EXPECT_DOUBLE_EQ(experts_touched(8, 2, 1), 2);
  EXPECT_NEAR(experts_touched(256, 8, 4096), 256, 1e-6);
  EXPECT_LT(experts_touched(256, 8, 4), experts_touched(256, 8, 16));
  // Against a simulation: each token draws top_k distinct experts uniformly (fixed seed).
  std::mt19937 rng(7);
  const int e = 64, k = 6, tokens = 12, trials = 4000;
  double sum = 0;
  std::vector<int> ids(e);
  for (int trial = 0; trial < trials; ++trial) {
    std::set<int> hit;
    for (int tok = 0; tok < tokens; ++tok) {
      for (int i = 0; i < e; ++i) ids[i] = i;
      std::shuffle(ids.begin(), ids.end(), rng);
      hit.insert(ids.begin(), ids.begin() + k);
    }
    sum += hit.size();
  }
  EXPECT_NEAR(experts_touched(e, k, tokens), sum / trials, 0.01 * e);
}

// DeepSeek-V3 in fp8 on H200s, p = 1, t = 8 over `hosts` hosts.
struct DeepSeek {
  ModelSpec model = load_model("deepseek-v3");
  ClusterView cluster;
  explicit DeepSeek(int hosts = 4) : cluster(make_cluster_view(testing::gpu_cluster(hosts, 8, "H200"))) {}
  ModelInputs at(int ep, int batch = 16, int p = 1, int t = 8) const {
    ModelInputs in = testing::inputs(model, cluster, p, t, 1, Variant::kStandard, batch);
    in.work = with_precision(in.work, Precision::kFp8);
    in.work.batch = batch;
    in.layout.ep = ep;
    in.links.ep = ep_links(cluster, p, t, ep);
    return in;
  }
};

TEST(Moe, MemoryPerRankFallsWithExpertParallelism) {
  const DeepSeek ds;
  const Prediction one = predict(ds.at(1)), eight = predict(ds.at(8)), sixteen = predict(ds.at(16)),
                   thirty_two = predict(ds.at(32));
  // ep = 1 and ep = t hold the same share of the experts (1/t of each, or E/t whole ones).
  EXPECT_NEAR(one.memory.weights, eight.memory.weights, 1e-6 * one.memory.weights);
  EXPECT_LT(sixteen.memory.weights, eight.memory.weights);
  EXPECT_LT(thirty_two.memory.weights, sixteen.memory.weights);
  // Experts spread over 32 ranks instead of 8: the routed experts' bytes fall fourfold.
  const ModelSpec& m = ds.model;
  const double routed = 58.0 * m.moe.experts * m.expert_params();  // fp8: 1 byte each
  EXPECT_NEAR(eight.memory.weights - thirty_two.memory.weights, routed / 8 - routed / 32, 1e-6 * routed);
}

TEST(Moe, AllToAllOnlyForExpertsAndOnlyWithExpertParallelism) {
  const DeepSeek ds;
  EXPECT_EQ(predict(ds.at(1)).decode.ep_comm, 0);
  const Prediction ep8 = predict(ds.at(8));
  ASSERT_TRUE(ep8.feasible) << ep8.reason;
  EXPECT_GT(ep8.decode.ep_comm, 0);
  EXPECT_GT(ep8.prefill.ep_comm, ep8.decode.ep_comm);  // more tokens per all-to-all
  // A dense model has no all-to-all, and refuses ep > 1.
  const ModelSpec llama = load_model("llama-3.1-70b");
  ModelInputs in = testing::inputs(llama, ds.cluster, 1, 8, 1, Variant::kStandard, 16);
  EXPECT_EQ(predict(in).decode.ep_comm, 0);
  in.layout.ep = 8;
  const Prediction refused = predict(in);
  EXPECT_FALSE(refused.feasible);
  EXPECT_NE(refused.reason.find("no experts"), std::string::npos) << refused.reason;
}

TEST(Moe, ExpertParallelismAcrossHostsCostsMoreThanInside) {
  // 16 ranks of one EP group: one host of 16 GPUs vs two hosts of 8 (the NIC share per rank).
  const ClusterView one = make_cluster_view(testing::gpu_cluster(1, 16));
  const ClusterView two = make_cluster_view(testing::gpu_cluster(2, 8));
  const EpLinks in_host = ep_links(one, 1, 16, 16), across = ep_links(two, 1, 8, 16);
  EXPECT_EQ(in_host.hosts, 1);
  EXPECT_EQ(across.hosts, 2);
  EXPECT_EQ(across.per_domain, 8);
  const double bytes = 64 * 8 * 7168 * 2.0;  // 64 tokens, top-8, hidden 7168, bf16
  EXPECT_GT(alltoall_time(across, bytes), 2 * alltoall_time(in_host, bytes));
  // The formula: (ep-1)/ep of the bytes leave the rank; inside a host all over NVLink.
  EXPECT_NEAR(alltoall_time(in_host, bytes), in_host.intra.alpha_s + bytes * 15 / 16 / in_host.intra.bandwidth, 1e-12);
  // And in a prediction: p = 1, t = 8 replicas paired across the two hosts pay more per step
  // for their all-to-alls than p = 2 stages each with its EP group inside one host.
  const DeepSeek ds(2);
  const Prediction cross = predict(ds.at(16, 16, 1, 8)), inside = predict(ds.at(8, 16, 2, 8));
  EXPECT_GT(cross.decode.ep_comm, inside.decode.ep_comm * 1.5);
}

TEST(Moe, DecodeStreamsOnlyTheExpertsTheBatchTouches) {
  // Mixtral-8x22B (8 experts, top 2) on one host of 8 H100s: at batch 1 a step reads about
  // the active share of the weights; at batch 64 nearly every expert is hit.
  const ModelSpec m = load_model("mixtral-8x22b");
  const ClusterView c = make_cluster_view(testing::gpu_cluster(1, 8));
  auto read_share = [&](int batch) {
    ModelInputs in = testing::inputs(m, c, 1, 8, 1, Variant::kStandard, batch);
    const Prediction p = predict(in);
    EXPECT_TRUE(p.feasible) << p.reason;
    const double stream_all = p.memory.weights / (c.device.memory_bandwidth * in.efficiency.memory);
    return p.decode.compute_memory_bound / stream_all;
  };
  const double one = read_share(1), many = read_share(64);
  EXPECT_LT(one, 0.45);  // active / total = 39 / 141 = 0.28, plus the KV cache and launches
  EXPECT_GT(one, 0.2);
  EXPECT_GT(many, 0.9);
}

TEST(Moe, ShapeProblemsNameTheNumbers) {
  const DeepSeek ds;
  Prediction p = predict(ds.at(12));
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.reason.find("ep=12 is not a multiple of t=8"), std::string::npos) << p.reason;
  p = predict(ds.at(24));
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.reason.find("does not divide the 256 experts"), std::string::npos) << p.reason;
}

const char* kDeepSeekConfig = R"({
  "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
  "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
  "tie_word_embeddings": false, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
  "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512,
  "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
  "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
  "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1, "ep_size": 1, "aux_loss_alpha": 0.001,
  "seq_aux": true})";

TEST(Moe, ConfigJsonIsReadLikeTheCatalog) {
  const ModelSpec m = parse_model_config(kDeepSeekConfig, "ds/config.json");
  const ModelSpec cat = load_model("deepseek-v3");
  EXPECT_DOUBLE_EQ(m.total_params(), cat.total_params());
  EXPECT_DOUBLE_EQ(m.active_params(), cat.active_params());
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token_layer(1), 576);
  EXPECT_EQ(m.moe.shared_intermediate, 2048);
  // Qwen's layer pattern: decoder_sparse_step 2 makes every second layer MoE, mlp_only_layers
  // keeps listed ones dense; Mixtral's experts are intermediate_size wide.
  const std::string base = R"("num_hidden_layers": 8, "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2)";
  const ModelSpec q = parse_model_config("{" + base + R"(, "moe_intermediate_size": 32, "decoder_sparse_step": 2,
      "mlp_only_layers": [3]})", "q.json");
  EXPECT_EQ(q.moe_layers_in(0, 8), 3);  // layers 1, 5, 7 (3 kept dense)
  EXPECT_TRUE(q.is_moe_layer(1));
  EXPECT_FALSE(q.is_moe_layer(3));
  EXPECT_EQ(parse_model_config("{" + base + "}", "mixtral.json").moe.expert_intermediate, 128);
}

TEST(Moe, UnknownExpertOrLatentFieldsAreRefusedByName) {
  const std::string base = R"("num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "vocab_size": 100, "num_local_experts": 8, "num_experts_per_tok": 2)";
  for (const char* field : {"expert_capacity_factor", "moe_router_topk_scaling", "router_bias_update_rate",
                            "latent_dim"}) {
    try {
      parse_model_config("{" + base + ", \"" + field + "\": 1}", "moe.json");
      FAIL() << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + field + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("moe.json"), std::string::npos) << e.what();
    }
  }
  // Experts without top-k, or more experts per token than experts: malformed, named.
  try {
    parse_model_config(R"({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "vocab_size": 100, "n_routed_experts": 8})", "x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput);
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_model_config("{" + base + R"(, "num_experts_per_tok": 9})", "x.json"), Error);
  // MLA pieces without the compressed KV are not a shape the planner knows.
  EXPECT_THROW(parse_model_config(R"({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "vocab_size": 100, "qk_rope_head_dim": 64})", "x.json"), Error);
  // Zero or null means a dense model (some dense configs carry the keys).
  const ModelSpec dense = parse_model_config(R"({"num_hidden_layers": 2, "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100, "num_experts": 0,
      "kv_lora_rank": null})", "d.json");
  EXPECT_FALSE(dense.is_moe());
  EXPECT_FALSE(dense.is_mla());
}

TEST(Moe, DeepSeekV3OnSixteenH100sFitsInFp8WithExpertParallelismNotInBf16) {
  PlanRequest r;
  r.model = load_model("deepseek-v3");
  r.cluster = make_cluster_view(testing::gpu_cluster(2, 8));
  r.slo_ttft_s = kDefaultSloTtftS;
  r.slo_tpot_s = kDefaultSloTpotS;
  r.variants = {Variant::kStandard};
  r.batches = {1, 4, 16, 64};
  r.precisions = {Precision::kFp8};
  r.work = with_precision(r.work, Precision::kFp8);
  const PlanResult fp8 = plan(r);
  ASSERT_FALSE(fp8.ranked.empty()) << fp8.binding_constraint;
  bool ep = false;
  for (const auto& c : fp8.ranked) {
    ep = ep || c.layout.ep > 1;
    EXPECT_EQ(c.precision, Precision::kFp8);
    EXPECT_TRUE(c.layout.ep == 1 || c.layout.ep % c.layout.t == 0);
    EXPECT_EQ(c.replicas % std::max(1, c.layout.ep / c.layout.t), 0);
    if (c.layout.ep > 1) {
      EXPECT_NE(c.ep_link, "-");
    }
  }
  EXPECT_TRUE(ep);
  r.precisions = {Precision::kBf16};
  r.work = with_precision(r.work, Precision::kBf16);
  const PlanResult bf16 = plan(r);
  EXPECT_TRUE(bf16.ranked.empty());
  EXPECT_EQ(bf16.binding_constraint.rfind("device memory", 0), 0u) << bf16.binding_constraint;
}

}  // namespace
}  // namespace trellis::sim
