// Mixture of experts and MLA in the refined model: what one rank holds and computes of a MoE
// layer under expert parallelism, the all-to-all that carries tokens to their experts, and
// the latent KV cache. docs/planner.md, "MoE and MLA", derives each formula.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cost_model_internal.hpp"

namespace trellis::sim {

double experts_touched(int experts, int top_k, double tokens) {
  if (experts <= 0 || top_k <= 0 || tokens <= 0) return 0;
  // A token's top-k is k distinct experts, so a given expert is among them with probability
  // k/E; tokens route independently, so it stays idle with probability (1 - k/E)^tokens.
  const double idle = std::pow(1.0 - static_cast<double>(top_k) / experts, tokens);
  return experts * (1.0 - idle);
}

double alltoall_time(const EpLinks& g, double bytes) {
  if (g.ranks <= 1 || bytes <= 0) return 0;
  const double n = g.ranks, local = std::clamp(g.per_domain, 1, g.ranks);
  double t = 0;
  if (local > 1) t = g.intra.alpha_s + bytes * (local - 1) / n / g.intra.bandwidth;
  if (n > local) t = std::max(t, g.inter.alpha_s + bytes * (n - local) / n / g.inter.bandwidth);
  return t;
}

namespace detail {

double attention_params_per_rank(const ModelSpec& m, int t) {
  if (m.is_mla()) {
    // The down-projections (q_a, kv_a with their norms) are small and replicated on every TP
    // rank, as vLLM and SGLang hold them; q_b, kv_b and o are split by heads.
    const MlaShape& a = m.mla;
    const double down = (a.q_lora_rank > 0 ? static_cast<double>(m.hidden) * a.q_lora_rank + a.q_lora_rank : 0) +
                        static_cast<double>(m.hidden) * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank;
    return down + (m.attention_params() - down) / t;
  }
  const double kv_heads = std::max(1.0, static_cast<double>(m.kv_heads) / t);
  const double q = static_cast<double>(m.heads) * m.head_dim / t, kv = kv_heads * m.head_dim;
  return m.hidden * q + 2.0 * m.hidden * kv + q * m.hidden + (m.qkv_bias ? q + 2 * kv : 0);
}

double moe_block_params_per_rank(const ModelInputs& in) {
  const ModelSpec& m = *in.model;
  const int t = in.layout.t, ep = in.layout.ep;
  const double routed = ep > 1 ? static_cast<double>(m.moe.experts) / ep * m.expert_params()
                               : m.moe.experts * m.expert_params() / t;
  return routed + m.shared_expert_params() / t + m.router_params();
}

double stage_params_per_rank(const ModelInputs& in, int first, int n) {
  const ModelSpec& m = *in.model;
  const double n_moe = m.moe_layers_in(first, n);
  const double common = attention_params_per_rank(m, in.layout.t) + 2.0 * m.hidden;
  const double mlp = (n - n_moe) * m.dense_mlp_params() / in.layout.t +
                     (n_moe > 0 ? n_moe * moe_block_params_per_rank(in) : 0);
  return n * common + mlp;
}

double kv_bytes_per_token_layer_per_rank(const ModelInputs& in) {
  const ModelSpec& m = *in.model;
  // MLA's latent is one "head" shared by all query heads: every TP rank keeps all of it.
  if (m.is_mla()) return m.kv_bytes_per_token_layer(in.work.kv_bytes);
  const double kv_heads = std::max(1.0, static_cast<double>(m.kv_heads) / in.layout.t);
  return 2.0 * kv_heads * m.head_dim * in.work.kv_bytes;
}

double attention_core_width(const ModelSpec& m, int t) {
  // Attention-core FLOPs per token per context position are 4 x this width. GQA: q . k and
  // p . v over head_dim for each of the rank's heads. MLA with the absorbed weights (W_UK
  // folded into q, W_UV into o): q . [latent, rope key] over kv_lora_rank + rope and p . latent
  // over kv_lora_rank for each head, i.e. (2 kv_lora_rank + rope) / 2 per head.
  const double heads = static_cast<double>(m.heads) / t;
  if (m.is_mla()) return heads * (2.0 * m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) / 2;
  return heads * m.head_dim;
}

double mlp_activation_width(const ModelInputs& in) {
  const ModelSpec& m = *in.model;
  const int t = in.layout.t;
  double w = m.moe_layers_in(0, m.layers) < m.layers ? static_cast<double>(m.intermediate) / t : 0;
  if (m.is_moe()) {
    const double imb = in.layout.ep > 1 ? in.expert_imbalance : 1;
    // Routed rows (top_k per token, spread over the ranks) and the dispatch buffer for them.
    const double routed = m.moe.top_k * imb * (m.moe.expert_intermediate + (in.layout.ep > 1 ? m.hidden : 0)) / t;
    w = std::max(w, routed + static_cast<double>(m.moe.shared_intermediate) / t);
  }
  return w;
}

MoeWork moe_block_work(const ModelInputs& in, double tokens) {
  const ModelSpec& m = *in.model;
  const int t = in.layout.t, ep = in.layout.ep, e = m.moe.experts, k = m.moe.top_k;
  const double wb = in.work.weight_bytes, ab = in.work.act_bytes, h = m.hidden;
  MoeWork w;
  // Router (replicated) and shared experts (split over t like a dense MLP): every token.
  const double dense_params = m.router_params() + m.shared_expert_params() / t;
  double pairs = 0, touched = 0, expert_rank = 0;
  if (ep > 1) {
    // The a = ep/t replicas of the EP group run their microbatches in lock step: N = a x
    // tokens draw top-k each; this rank holds E/ep experts and gets 1/ep of the N x k
    // (token, expert) pairs, the busiest rank `imbalance` times that.
    const double imb = in.expert_imbalance, n = tokens * ep / t, local = static_cast<double>(e) / ep;
    pairs = imb * n * k / ep;
    touched = std::min(local, imb * local * experts_touched(e, k, n) / e);
    expert_rank = m.expert_params();
  } else {
    pairs = tokens * k;                   // every rank computes 1/t of every pair
    touched = experts_touched(e, k, tokens);
    expert_rank = m.expert_params() / t;
  }
  w.linear_flops = 2.0 * (tokens * dense_params + pairs * expert_rank);
  w.streamed_params = dense_params + touched * expert_rank;
  const double width = ep > 1 ? m.moe.expert_intermediate : static_cast<double>(m.moe.expert_intermediate) / t;
  w.bytes = w.streamed_params * wb +
            (tokens * (2.0 * h + 3.0 * m.moe.shared_intermediate / t) + pairs * (2.0 * h + 3.0 * width)) * ab;
  w.alltoall_bytes = ep > 1 ? in.expert_imbalance * tokens / t * k * h * ab : 0;
  return w;
}

std::string moe_shape_problem(const ModelInputs& in) {
  const ModelSpec& m = *in.model;
  const Layout& l = in.layout;
  if (l.ep < 1) return fmt::format("ep={}: must be >= 1", l.ep);
  if (!m.is_moe()) return l.ep > 1 ? fmt::format("ep={}: {} has no experts", l.ep, m.name) : std::string();
  if (l.ep > 1 && l.ep % l.t != 0) return fmt::format("ep={} is not a multiple of t={}", l.ep, l.t);
  if (m.moe.experts % l.ep != 0) return fmt::format("ep={} does not divide the {} experts", l.ep, m.moe.experts);
  if (l.ep == 1 && m.moe.expert_intermediate % l.t != 0)
    return fmt::format("t={} does not divide the expert width {} (ep=1 splits every expert over t)", l.t,
                       m.moe.expert_intermediate);
  if (m.moe.shared_intermediate % l.t != 0)
    return fmt::format("t={} does not divide the shared experts' width {}", l.t, m.moe.shared_intermediate);
  if (!(in.expert_imbalance >= 1)) return fmt::format("expert imbalance {} must be >= 1", in.expert_imbalance);
  return {};
}

}  // namespace detail
}  // namespace trellis::sim
