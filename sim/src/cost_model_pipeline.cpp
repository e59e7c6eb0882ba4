// The pipeline around the per-stage physics: memory per device, shape constraints, and the
// closed decode loop (a microbatch's next step needs the token it just sampled), from which
// TPOT, the bubble and the dominant term follow.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cost_model_internal.hpp"
#include "trellis/sim/units.hpp"

namespace trellis::sim {
namespace detail {

// One decode (or prefill) step of one microbatch on every stage. Stages with the same layer
// count, the same outgoing link and the same role (the last holds the LM head) cost the same:
// each distinct stage is computed once, which keeps a p = 80 prediction as cheap as p = 2.
std::vector<StageStep> steps(const ModelInputs& in, const std::vector<int>& split, const StepWork& w) {
  const PipelineTechniques& k = in.techniques;
  const int p = in.layout.p;
  const double seqs = w.seqs;
  const double prep = in.host.input_prep_s + in.host.input_prep_per_seq_s * seqs;
  std::vector<StageStep> out(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) {
    StageStep& s = out[static_cast<std::size_t>(i)];
    const int n = split[static_cast<std::size_t>(i)];
    if (i > 0 && i < p - 1) {
      const LinkCost& b = in.links.boundaries[static_cast<std::size_t>(i)];
      bool reused = false;
      for (int j = 0; j < i && !reused; ++j) {
        const LinkCost& bj = in.links.boundaries[static_cast<std::size_t>(j)];
        if (split[static_cast<std::size_t>(j)] == n && bj.alpha_s == b.alpha_s && bj.bandwidth == b.bandwidth) {
          s = out[static_cast<std::size_t>(j)];
          reused = true;
        }
      }
      if (reused) continue;
    }
    s.forward = detail::stage_forward(in, i, detail::first_layer_of_stage(split, i), n, w, &s.terms, &s.send, &s.meta);
    double busy = s.forward + (k.structure_aware ? 0 : s.send + s.meta);
    if (i == p - 1 && !k.cpu_sampling) {
      s.sampling = detail::sampling_time(in, seqs, false);
      busy += s.sampling;
    }
    s.cycle = k.token_safe ? std::max(busy, prep) : busy + prep;
    s.prep_exposed = s.cycle - busy;
    if (k.structure_aware && i < p - 1) s.cycle = std::max(s.cycle, s.send);
    if (i == p - 1 && k.cpu_sampling) s.cycle = std::max(s.cycle, detail::sampling_time(in, seqs, true));
    s.terms.boundary = s.send + s.meta;
    s.terms.sampling = s.sampling;
    s.terms.input_prep = s.prep_exposed;
  }
  return out;
}

// Time for one microbatch to go around the loop once: every stage's forward and send, the
// sampling, input preparation where it is not hidden, and the sampled tokens' way back.
double loop_latency(const ModelInputs& in, const std::vector<StageStep>& st, double seqs) {
  const PipelineTechniques& k = in.techniques;
  const double prep = in.host.input_prep_s + in.host.input_prep_per_seq_s * seqs;
  double t = 0;
  for (const auto& s : st) t += s.forward + s.send + s.meta;
  t += detail::sampling_time(in, seqs, k.cpu_sampling);
  // With token-safe execution only stage 0 waits for its inputs; later stages prepare while
  // the hidden state travels. Without it every stage prepares after it is released.
  t += k.token_safe ? prep : prep * static_cast<double>(st.size());
  // The engine's measured per-iteration cost (departure 12).
  t += in.host.step_overhead_s + in.host.step_overhead_per_seq_s * seqs;
  if (!in.links.boundaries.empty()) {
    double worst_alpha = 0;
    for (const auto& b : in.links.boundaries) worst_alpha = std::max(worst_alpha, b.alpha_s);
    t += worst_alpha;  // token ids back to the scheduler: a few bytes
  }
  return t;
}

}  // namespace detail

namespace {

std::string dominant_line(const Breakdown& b, double period, int m, const char* bound_by) {
  const double total = period / m;
  struct Term {
    const char* name;
    double v;
  };
  const double mem = b.compute_memory_bound, flop = b.compute - b.compute_memory_bound;
  const Term terms[] = {{"reading weights and KV cache (memory-bound compute)", mem},
                        {"arithmetic (compute-bound layers)", flop},
                        {"blocking TP all-reduces", b.tp_comm},
                        {"stage-to-stage transfers", b.boundary},
                        {"gathering vocab-parallel logits", b.logits_gather},
                        {"sampling on the last stage", b.sampling},
                        {"input preparation", b.input_prep},
                        {"pipeline bubble (fewer microbatches in flight than the pipeline's depth needs)", b.bubble},
                        {"host work between steps (sampling, input preparation, token return: the loop waits "
                         "for it)",
                         b.host_gap},
                        {"MoE all-to-alls (tokens to their experts and back)", b.ep_comm}};
  const Term* top = &terms[0];
  for (const auto& t : terms)
    if (t.v > top->v) top = &t;
  const Term* second = top == &terms[0] ? &terms[1] : &terms[0];
  for (const auto& t : terms)
    if (&t != top && t.v > second->v) second = &t;
  const bool tp_named = top == &terms[2] || second == &terms[2];
  return fmt::format("{} takes {:.0f}% of each decode step, {} {:.0f}% ({}){}{}", top->name, 100 * top->v / total,
                     second->name, 100 * second->v / total, bound_by,
                     tp_named ? std::string() : fmt::format("; TP all-reduces {:.0f}%", 100 * b.tp_comm / total),
                     b.tp_comm_hidden > 0 ? fmt::format(", {:.0f}% more hidden under compute",
                                                        100 * b.tp_comm_hidden / total)
                                          : std::string());
}

}  // namespace

std::string shape_problem(const ModelInputs& in) {
  const ModelSpec& m = *in.model;
  const Layout& l = in.layout;
  if (l.p < 1 || l.t < 1) return fmt::format("p={} t={}: degrees must be >= 1", l.p, l.t);
  if (m.layers < l.p) return fmt::format("p={} exceeds the {} layers of {}", l.p, m.layers, m.name);
  if (m.heads % l.t != 0) return fmt::format("t={} does not divide the {} attention heads", l.t, m.heads);
  if (!m.is_mla() && m.kv_heads % l.t != 0 && l.t % m.kv_heads != 0)
    return fmt::format("t={} neither divides nor is a multiple of the {} KV heads", l.t, m.kv_heads);
  if (m.moe_layers_in(0, m.layers) < m.layers && m.intermediate % l.t != 0)
    return fmt::format("t={} does not divide the MLP width {}", l.t, m.intermediate);
  if (std::string why = detail::moe_shape_problem(in); !why.empty()) return why;
  if (in.work.fp8_linear && !in.device->has_fp8())
    return fmt::format("fp8: {} has no FP8 tensor cores (devices that have: {})", in.device->name,
                       fp8_device_names());
  if (l.microbatches < 1 || l.microbatches > in.work.batch)
    return fmt::format("{} microbatches cannot split a batch of {}", l.microbatches, in.work.batch);
  if (l.prefill_chunk < 0) return fmt::format("prefill chunk {}: must be >= 0 tokens (0: whole prompts)", l.prefill_chunk);
  if (l.prefill_microbatches < 0 || l.prefill_microbatches > in.work.batch)
    return fmt::format("{} prefill microbatches cannot split a batch of {}", l.prefill_microbatches, in.work.batch);
  if (l.variant == Variant::kLayerParallel && m.layers / l.p < 2)
    return fmt::format("lp needs at least 2 layers per stage (p={} leaves {})", l.p, m.layers / l.p);
  if (static_cast<int>(in.links.boundaries.size()) != l.p - 1)
    return fmt::format("internal: {} stage boundaries for p={}", in.links.boundaries.size(), l.p);
  return {};
}

Memory memory_per_device(const ModelInputs& in, const std::vector<int>& split) {
  const ModelSpec& m = *in.model;
  const Workload& w = in.work;
  const int p = in.layout.p, t = in.layout.t;
  const double kv_token = detail::kv_bytes_per_token_layer_per_rank(in);  // MLA: the latent
  const double mlp_width = detail::mlp_activation_width(in);              // widest MLP or MoE block
  const double vocab_shard = static_cast<double>(m.vocab) * m.hidden / t;
  const double b = std::ceil(static_cast<double>(w.batch) / in.layout.microbatches);
  Memory best;
  for (int i = 0; i < p; ++i) {
    const int n = split[static_cast<std::size_t>(i)];
    Memory mem;
    // MoE layers hold their share of the experts (ep > 1: E/ep whole experts; else 1/t of each).
    double params = detail::stage_params_per_rank(in, detail::first_layer_of_stage(split, i), n);
    if (i == 0) params += vocab_shard;                                     // embedding
    if (i == p - 1) params += (m.tied_embeddings && p == 1) ? 0 : vocab_shard;  // LM head
    mem.weights = params * w.weight_bytes;
    mem.kv_cache = static_cast<double>(w.batch) * (w.prompt_len + w.gen_len) * n * kv_token;
    // Whole prompts: at most one engine chunk of them at once (or one prompt, if longer);
    // chunked: one iteration's decode rows and the chunks riding with them.
    const ChunkPlan cp = chunk_plan(w, in.layout.prefill_chunk, b);
    const double prefill_tokens =
        in.layout.prefill_chunk > 0
            ? b + cp.per_iteration * cp.tokens
            : std::min(b * w.prompt_len, std::max<double>(in.host.prefill_chunk_tokens, w.prompt_len));
    mem.activations = prefill_tokens * (4.0 * m.hidden + 2.0 * mlp_width) * w.act_bytes +
                      (i == p - 1 ? b * m.vocab / t * 4.0 : 0);
    mem.reserve = in.host.reserve_bytes;
    if (mem.total() > best.total()) best = mem;
  }
  return best;
}

void assemble(const ModelInputs& in, const std::vector<int>& split, Prediction& out) {
  const Workload& w = in.work;
  const int m = in.layout.microbatches;
  const double b = std::ceil(static_cast<double>(w.batch) / m);
  // Decode: the cache holds the prompt and, on average, half the generated tokens.
  const double ctx = w.prompt_len + w.gen_len / 2.0;
  const auto dec = detail::steps(in, split, decode_work(b, ctx));
  auto slow = std::max_element(dec.begin(), dec.end(), [](auto& x, auto& y) { return x.cycle < y.cycle; });
  const double loop = detail::loop_latency(in, dec, b);
  const double period = std::max(loop, m * slow->cycle);
  out.tpot_s = period;
  out.decode_tokens_per_s = w.batch / period;
  out.decode = slow->terms;
  // The bottleneck stage idles period - m x cycle. The pipeline's share of that is what the
  // stages' own forwards and sends leave idle (a loop through p stages with fewer than p
  // microbatches; nothing when p = 1); the rest is the loop waiting for host work between
  // steps (sampling, stage 0's input preparation, the engine's step, the tokens' way back).
  double stages = 0;
  for (const auto& s : dec) stages += s.forward + s.send + s.meta;
  const double idle = std::max(0.0, period - m * slow->cycle);
  const double pipeline = in.layout.p > 1 ? std::min(idle, std::max(0.0, stages - m * slow->cycle)) : 0.0;
  out.decode.bubble = pipeline / m;
  out.decode.host_gap = (idle - pipeline) / m;
  const char* bound = loop > m * slow->cycle ? "the loop latency bounds the step" : "the slowest stage bounds it";
  out.dominant = dominant_line(out.decode, period, m, bound);
  assemble_prefill(in, split, dec, period, out);
  out.tokens_per_s = w.batch * static_cast<double>(w.gen_len) / (out.ttft_s + w.gen_len * out.tpot_s);
}

}  // namespace trellis::sim
