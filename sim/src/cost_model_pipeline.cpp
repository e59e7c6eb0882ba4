// The pipeline around the per-stage physics: memory per device, shape constraints, and the
// closed decode loop (a microbatch's next step needs the token it just sampled), from which
// TPOT, the bubble and the dominant term follow.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cost_model_internal.hpp"
#include "trellis/sim/units.hpp"

namespace trellis::sim {
namespace {

struct StageStep {
  double forward = 0, send = 0, meta = 0, cycle = 0, prep_exposed = 0, sampling = 0;
  Breakdown terms;
};

// One decode (or prefill) step of one microbatch on every stage.
std::vector<StageStep> steps(const ModelInputs& in, const std::vector<int>& split, double seqs, double tokens,
                             double ctx, bool prefill) {
  const PipelineTechniques& k = in.techniques;
  const int p = in.layout.p;
  const double prep = in.host.input_prep_s + in.host.input_prep_per_seq_s * seqs;
  std::vector<StageStep> out(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) {
    StageStep& s = out[static_cast<std::size_t>(i)];
    s.forward = detail::stage_forward(in, i, split[static_cast<std::size_t>(i)], seqs, tokens, ctx, prefill,
                                      &s.terms, &s.send, &s.meta);
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
                         b.host_gap}};
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
  if (m.kv_heads % l.t != 0 && l.t % m.kv_heads != 0)
    return fmt::format("t={} neither divides nor is a multiple of the {} KV heads", l.t, m.kv_heads);
  if (m.intermediate % l.t != 0) return fmt::format("t={} does not divide the MLP width {}", l.t, m.intermediate);
  if (in.work.fp8_linear && !in.device->has_fp8())
    return fmt::format("fp8: {} has no FP8 tensor cores (devices that have: {})", in.device->name,
                       fp8_device_names());
  if (l.microbatches < 1 || l.microbatches > in.work.batch)
    return fmt::format("{} microbatches cannot split a batch of {}", l.microbatches, in.work.batch);
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
  const double kv_heads = std::max(1.0, static_cast<double>(m.kv_heads) / t);
  const double q = static_cast<double>(m.heads) * m.head_dim / t;
  const double layer = m.hidden * (2 * q + 2 * kv_heads * m.head_dim) + 3.0 * m.hidden * m.intermediate / t +
                       2.0 * m.hidden;
  const double vocab_shard = static_cast<double>(m.vocab) * m.hidden / t;
  const double b = std::ceil(static_cast<double>(w.batch) / in.layout.microbatches);
  Memory best;
  for (int i = 0; i < p; ++i) {
    const int n = split[static_cast<std::size_t>(i)];
    Memory mem;
    double params = n * layer;
    if (i == 0) params += vocab_shard;                                     // embedding
    if (i == p - 1) params += (m.tied_embeddings && p == 1) ? 0 : vocab_shard;  // LM head
    mem.weights = params * w.weight_bytes;
    mem.kv_cache = static_cast<double>(w.batch) * (w.prompt_len + w.gen_len) * n * 2.0 * kv_heads * m.head_dim *
                   w.kv_bytes;
    const double prefill_tokens = std::min(b * w.prompt_len, std::max<double>(in.host.prefill_chunk_tokens, w.prompt_len));
    mem.activations = prefill_tokens * (4.0 * m.hidden + 2.0 * m.intermediate / t) * w.act_bytes +
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
  const auto dec = steps(in, split, b, b, ctx, false);
  auto slow = std::max_element(dec.begin(), dec.end(), [](auto& x, auto& y) { return x.cycle < y.cycle; });
  const double loop = loop_latency(in, dec, b);
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
  // Prefill: microbatches of whole prompts flow through the pipeline once.
  const auto pre = steps(in, split, b, b * w.prompt_len, w.prompt_len / 2.0, true);
  auto pslow = std::max_element(pre.begin(), pre.end(), [](auto& x, auto& y) { return x.cycle < y.cycle; });
  out.prefill = pslow->terms;
  out.ttft_s = loop_latency(in, pre, b) + (m - 1) * pslow->cycle;
  out.tokens_per_s = w.batch * static_cast<double>(w.gen_len) / (out.ttft_s + w.gen_len * out.tpot_s);
}

}  // namespace trellis::sim
