// The prefill side of the refined model: the wave of whole prompts (its own microbatch count,
// pipeline fill and drain) and chunked prefill in the steady state of continuous batching
// (chunks riding with decode steps, and the TPOT they take from the decoding sequences).
// docs/planner.md, "Chunked prefill", has the derivation of every line.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "cost_model_internal.hpp"

namespace trellis::sim {

StepWork decode_work(double seqs, double ctx) { return {seqs, seqs, ctx, seqs * ctx}; }

StepWork prefill_work(double seqs, double prompt) { return {seqs, seqs * prompt, prompt / 2, seqs * prompt}; }

StepWork mixed_work(double decode, double ctx, double chunks, double chunk, double prompt) {
  StepWork w;
  // Only a prompt's last chunk is sampled: 1 in K of the chunks in flight.
  w.seqs = decode + chunks * chunk / prompt;
  w.tokens = decode + chunks * chunk;
  // A prompt token at position x attends to x positions: over all chunks of a prompt, half
  // the prompt on average, whatever the chunk size.
  w.ctx = w.tokens > 0 ? (decode * ctx + chunks * chunk * prompt / 2) / w.tokens : 0;
  // A chunk reads the prefix before it from the cache ((prompt - chunk) / 2 on average over
  // a prompt's chunks) and writes its own positions.
  w.kv_positions = decode * ctx + chunks * (prompt + chunk) / 2;
  return w;
}

ChunkPlan chunk_plan(const Workload& w, int chunk, double seqs) {
  ChunkPlan c;
  const double prompt = w.prompt_len;
  if (chunk <= 0 || prompt <= 0) {
    c.tokens = prompt;
    return c;
  }
  c.iterations = static_cast<int>(std::ceil(prompt / std::min<double>(chunk, prompt)));
  c.tokens = prompt / c.iterations;
  // A sequence slot's life in its group: K chunk iterations (the last samples the first
  // token), then gen - 1 decode steps, then the next request takes the slot. Little's law:
  // prompts in their prefill at once = seqs x K / (K + gen - 1).
  const double life = c.iterations + std::max(0, w.gen_len - 1);
  c.in_prefill = seqs * c.iterations / life;
  c.share = std::min(1.0, c.in_prefill);
  c.per_iteration = std::min(seqs, std::max(1.0, c.in_prefill));
  return c;
}

namespace {

using detail::StageStep;

const StageStep& slowest(const std::vector<StageStep>& st) {
  return *std::max_element(st.begin(), st.end(), [](auto& x, auto& y) { return x.cycle < y.cycle; });
}

struct Wave {
  double ttft = 0, fill_drain = 0;
  Breakdown terms;
};

// `batch` prompts arriving together, in `m` microbatches of ceil(batch / m) prompts: the first
// goes around the loop once (through every stage: the fill), each later one leaves the
// slowest stage one cycle after the one before; the other stages idle while it fills and
// drains, the stages' own times less the slowest one's cycle (nothing when p = 1).
Wave wave(const ModelInputs& in, const std::vector<int>& split, int m) {
  const double b = std::ceil(static_cast<double>(in.work.batch) / m);
  const auto pre = detail::steps(in, split, prefill_work(b, in.work.prompt_len));
  const StageStep& slow = slowest(pre);
  Wave w;
  w.ttft = detail::loop_latency(in, pre, b) + (m - 1) * slow.cycle;
  double stages = 0;
  for (const auto& s : pre) stages += s.forward + s.send + s.meta;
  w.fill_drain = in.layout.p > 1 ? std::max(0.0, stages - slow.cycle) : 0.0;
  w.terms = slow.terms;
  w.terms.bubble = w.fill_drain;
  return w;
}

// Prefill microbatch counts worth trying: powers of two and p times powers of two, up to the
// batch. Fewer microbatches run bigger, more efficient forwards; more of them shorten the
// fill and drain: the shortest TTFT is somewhere between, and TTFT is all they change.
std::vector<int> wave_options(int p, int batch) {
  std::set<int> m;
  for (int k = 1; k <= batch; k *= 2) m.insert(k);
  for (int k = p; k <= batch; k *= 2) m.insert(k);
  return {m.begin(), m.end()};
}

void whole_prompts(const ModelInputs& in, const std::vector<int>& split, Prediction& out) {
  const int fixed = in.layout.prefill_microbatches;
  Wave best;
  int best_m = 0;
  for (int m : fixed > 0 ? std::vector<int>{fixed} : wave_options(in.layout.p, in.work.batch)) {
    Wave w = wave(in, split, m);
    if (best_m == 0 || w.ttft < best.ttft) {
      best = w;
      best_m = m;
    }
  }
  out.ttft_s = best.ttft;
  out.prefill = best.terms;
  out.prefill_microbatches = best_m;
  out.prefill_iterations = 1;
  out.prefill_fill_drain_s = best.fill_drain;
}

// Chunked prefill in the steady state: a share f of each group's iterations carries q chunks
// (chunk_plan) in the same forward as the group's other sequences' decode steps. Every stage's
// mean cycle and the loop's mean latency mix the two kinds of iteration; TPOT is the mean
// period. A new request waits half a period for its group's next iteration, then K iterations
// that each carry its chunk.
void chunked(const ModelInputs& in, const std::vector<int>& split, const std::vector<StageStep>& dec, double period,
             Prediction& out) {
  const Workload& w = in.work;
  const int m = in.layout.microbatches;
  const double b = std::ceil(static_cast<double>(w.batch) / m);
  const double ctx = w.prompt_len + w.gen_len / 2.0;
  const ChunkPlan cp = chunk_plan(w, in.layout.prefill_chunk, b);
  const StepWork mw = mixed_work(b - cp.per_iteration, ctx, cp.per_iteration, cp.tokens, w.prompt_len);
  const auto mix = detail::steps(in, split, mw);
  const double f = cp.share;
  const double loop_mix = detail::loop_latency(in, mix, mw.seqs);
  const double loop_mean = (1 - f) * detail::loop_latency(in, dec, b) + f * loop_mix;
  double mean_cycle = 0, chunk_period = loop_mix;
  for (std::size_t i = 0; i < dec.size(); ++i) {
    const double cbar = (1 - f) * dec[i].cycle + f * mix[i].cycle;
    mean_cycle = std::max(mean_cycle, cbar);
    // The chunk's group takes its mixed cycle on this stage, the m - 1 others their mean one.
    chunk_period = std::max(chunk_period, mix[i].cycle + (m - 1) * cbar);
  }
  out.tpot_s = std::max(loop_mean, m * mean_cycle);
  out.decode_tokens_per_s = w.batch / out.tpot_s;
  out.interference_s = std::max(0.0, out.tpot_s - period);
  out.chunk_share = f;
  out.chunk_step_s = chunk_period;
  out.prefill_iterations = cp.iterations;
  out.prefill_microbatches = 0;
  out.prefill = slowest(mix).terms;
  out.ttft_s = 0.5 * out.tpot_s + cp.iterations * chunk_period;
  out.dominant += fmt::format("; prompt chunks of {} tokens ride on {:.0f}% of iterations and add {:.0f}% to TPOT",
                              static_cast<int>(std::lround(cp.tokens)), 100 * f, 100 * out.interference_s / period);
}

}  // namespace

void assemble_prefill(const ModelInputs& in, const std::vector<int>& split, const std::vector<StageStep>& dec,
                      double period, Prediction& out) {
  if (in.layout.prefill_chunk > 0) chunked(in, split, dec, period, out);
  else whole_prompts(in, split, out);
}

}  // namespace trellis::sim
