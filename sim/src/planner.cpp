// Enumeration and ranking. Links are derived once per (replica size, t) and shared by every
// microbatch count, variant and batch of that grid, which keeps a 1,024-device search well
// under a second.
#include "trellis/sim/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "trellis/core/error.hpp"
#include "trellis/core/process.hpp"
#include "trellis/sim/appendix.hpp"
#include "trellis/sim/units.hpp"

namespace trellis::sim {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Decode microbatch counts worth trying: powers of two and p times powers of two, up to the
// batch. No cap at 2p: when host work between steps (sampling, input preparation, the
// engine's step) makes the loop longer than 2p stage cycles, more microbatches are what
// hides it, at the price of reading the stage's weights once more per microbatch. The
// geometric set keeps the search at O(log batch) counts per grid.
// The appendix model keeps its own set, powers of two up to 2p and p itself: its equations
// have no closed loop, so more microbatches only ever help it (eq. 5: T = (b/m) / t_stage
// per microbatch), and uncapped it would pick one sequence per microbatch.
std::vector<int> microbatch_options(int p, int batch, ModelKind kind) {
  std::set<int> m;
  const int cap = kind == ModelKind::kAppendix ? std::min(batch, 2 * p) : batch;
  for (int k = 1; k <= cap; k *= 2) m.insert(k);
  for (int k = p; k <= cap; k *= 2) m.insert(k);
  return {m.begin(), m.end()};
}

// The chunk sizes of the request as distinct options: chunks of at least the prompt's length
// all prefill a prompt in one iteration and predict alike, so only the first of them is kept.
std::vector<int> chunk_options(const PlanRequest& r) {
  if (r.kind == ModelKind::kAppendix) return {0};
  std::vector<int> out;
  std::set<int> effective;
  for (int c : r.prefill_chunks) {
    if (c < 0) throw_error(ErrorCode::kInvalidArgument, "prefill chunk {}: must be >= 0 tokens (0: whole prompts)", c);
    if (effective.insert(c == 0 ? 0 : std::min(c, r.work.prompt_len)).second) out.push_back(c);
  }
  if (out.empty()) out.push_back(0);
  return out;
}

std::string chunk_words(const Layout& l) {
  return l.prefill_chunk > 0 ? fmt::format(" chunk {}", l.prefill_chunk) : std::string();
}

// Expert-parallel degrees the search tries for a grid of d replicas of p x t. Possible: 1
// (every expert split over t) and a x t for each a dividing d whose a x t divides the
// experts (stage s of a neighbouring replicas share their experts). a = 1 (ep = t) is left
// out: it holds the same bytes per rank as ep = 1 and the model charges it the imbalance and
// the all-to-alls on top, so it never wins. Between two degrees on the same side of a domain
// boundary the model's terms move one way each (wider: fewer experts and weight bytes per
// rank, more of the all-to-all on the fabric), so the search keeps the ends of each side: the
// narrowest and the widest group inside one host or NVLink domain, and across domains
// (docs/planner.md, "MoE and MLA"). Dense models and the appendix model: 1 only.
std::vector<std::pair<int, EpLinks>> ep_options(const PlanRequest& r, int d, int p, int t) {
  std::vector<std::pair<int, EpLinks>> out = {{1, EpLinks{}}};
  if (!r.model.is_moe() || r.kind == ModelKind::kAppendix || r.model.heads % t != 0) return out;
  std::vector<std::pair<int, EpLinks>> inside, across;
  for (int a : divisors(d))
    if (a > 1 && r.model.moe.experts % (a * t) == 0) {
      EpLinks g = ep_links(r.cluster, p, t, a * t);
      (g.hosts > 1 ? across : inside).emplace_back(a * t, g);
    }
  auto keep = [&](const std::pair<int, EpLinks>& e) {
    for (const auto& o : out)
      if (o.first == e.first) return;
    out.push_back(e);
  };
  if (!inside.empty()) keep(inside.front()), keep(inside.back());
  if (!across.empty()) keep(across.front()), keep(across.back());
  return out;
}

std::string describe_ep_link(const EpLinks& g) {
  if (g.ranks <= 1) return "-";
  if (g.hosts > 1) return fmt::format("{}+{}x{}", g.intra.name, g.hosts, g.inter.name);
  return g.intra.name;
}

ModelInputs inputs(const PlanRequest& r, const Layout& l, int batch, const LayoutLinks& links) {
  ModelInputs in;
  in.model = &r.model;
  in.device = &r.cluster.device;
  in.work = r.work;
  in.work.batch = batch;
  in.layout = l;
  in.links = links;
  in.techniques = r.techniques;
  in.host = r.host;
  in.efficiency = r.efficiency;
  in.cpu = r.cpu;
  in.ranks_per_host = std::min(l.p * l.t, r.cluster.devices_per_host);
  in.compute_scale = r.compute_scale;
  in.memory_scale = r.memory_scale;
  in.expert_imbalance = r.expert_imbalance;
  return in;
}

std::string describe_tp_link(const LayoutLinks& l) {
  if (l.tp.ranks <= 1) return "-";
  if (l.tp.hosts > 1) return fmt::format("{}+{}x{}", l.tp.intra.name, l.tp.hosts, l.tp.inter.name);
  return l.tp.intra.name;
}

void check_calibrated_range(const ModelInputs& in, Prediction& p) {
  const double msg = in.work.batch * static_cast<double>(in.work.prompt_len) * in.model->hidden * in.work.act_bytes;
  auto check = [&](const LinkCost& l) {
    if (l.calibrated && l.max_calibrated_bytes > 0 && msg > l.max_calibrated_bytes)
      p.warnings.push_back(fmt::format("prefill messages of {:.1f} MiB exceed the calibrated range of {} (max {:.1f} MiB)",
                                       msg / (1 << 20), l.name, l.max_calibrated_bytes / (1 << 20)));
  };
  if (in.layout.t > 1) check(in.links.tp.intra);
  for (const auto& b : in.links.boundaries) check(b);
}

}  // namespace

Prediction predict_appendix(const ModelInputs& in, int hosts_spanned) {
  Prediction out = predict(in);  // memory and shape checks from the refined model
  if (!out.feasible) return out;
  const ModelSpec& m = *in.model;
  ModelInputs one = in;
  one.layout.t = 1;
  const double b = std::ceil(static_cast<double>(in.work.batch) / in.layout.microbatches);
  const bool f32 = in.work.act_bytes >= 4;
  auto layer_time = [&](double tokens, double ctx) {
    // A MoE layer computes and (roughly) reads its active experts only.
    const double flops = 2 * m.active_layer_params() * tokens + 4 * tokens * ctx * m.heads * m.head_dim;
    const double bytes = m.active_layer_params() * in.work.weight_bytes +
                         b * ctx * m.kv_bytes_per_token_layer(in.work.kv_bytes);
    return roofline_time(*in.device, in.efficiency, flops, bytes, f32);
  };
  appendix::Symbols x;
  x.L = m.layers;
  x.p = in.layout.p;
  x.t = in.layout.t;
  x.b = b;
  x.m = in.layout.microbatches;
  x.n = hosts_spanned;
  x.h = m.hidden * in.work.act_bytes;  // so that s*b*h is in bytes
  x.alpha = in.links.tp.intra.alpha_s;
  x.B1 = in.links.tp.intra.bandwidth;
  x.B2 = in.links.tp.hosts > 1 ? in.links.tp.inter.bandwidth : in.links.tp.intra.bandwidth;
  for (std::size_t i = 0; i < in.links.boundaries.size(); ++i)
    if (in.links.boundary_crosses_host[i]) x.B2 = in.links.boundaries[i].bandwidth;
  // Decode: one new token per sequence (s = 1) attending over the cache.
  x.s = 1;
  x.C = layer_time(b, in.work.prompt_len + in.work.gen_len / 2.0);
  const appendix::Prediction d = appendix::predict(x);
  x.s = in.work.prompt_len;
  x.C = layer_time(b * in.work.prompt_len, in.work.prompt_len / 2.0);
  const appendix::Prediction pf = appendix::predict(x);
  out.tpot_s = d.delay;
  out.decode_tokens_per_s = d.throughput;
  out.ttft_s = pf.delay;
  out.tokens_per_s = in.work.batch * static_cast<double>(in.work.gen_len) / (out.ttft_s + in.work.gen_len * out.tpot_s);
  out.decode = Breakdown{};
  out.dominant = "appendix model (SiPipe eq. 1-10): no per-term breakdown";
  return out;
}

namespace {
// evaluate() on inputs already built: plan() builds them once per grid and batch and only
// changes the layout, rather than copying the links for every candidate.
Candidate evaluate_inputs(const PlanRequest& r, int replicas, const ModelInputs& in) {
  const Layout& layout = in.layout;
  const LayoutLinks& links = in.links;
  Candidate c;
  c.replicas = replicas;
  c.layout = layout;
  c.batch = in.work.batch;
  c.precision = r.work.act_bytes >= 4 ? Precision::kF32 : r.work.fp8_linear ? Precision::kFp8 : Precision::kBf16;
  c.needs_trained_model = layout.variant != r.model.trained_variant;
  c.prediction = r.kind == ModelKind::kAppendix ? predict_appendix(in, links.tp.hosts) : predict(in);
  if (r.swift && c.prediction.feasible) apply_swift(*r.swift, in.work, c.prediction);
  c.total_tokens_per_s = replicas * c.prediction.tokens_per_s;
  c.tp_link = describe_tp_link(links);
  c.tp_hosts = links.tp.ranks > 1 ? links.tp.hosts : 1;
  c.ep_link = describe_ep_link(links.ep);
  c.ep_hosts = links.ep.ranks > 1 ? links.ep.hosts : 1;
  for (bool x : links.boundary_crosses_host) c.boundary_crosses_host = c.boundary_crosses_host || x;
  const Prediction& p = c.prediction;
  if (!p.feasible) {
    c.miss = p.capacity > 0 && p.memory.total() > p.capacity ? p.memory.total() / p.capacity : 0;
    return c;
  }
  c.request_latency_s = p.ttft_s + r.work.gen_len * p.tpot_s;
  check_calibrated_range(in, c.prediction);
  std::string tpot, ttft;
  if (r.slo_tpot_s && p.tpot_s > *r.slo_tpot_s) {
    tpot = fmt::format("TPOT {:.2f} ms > SLO {:.2f} ms (+{:.0f}%)", p.tpot_s * 1e3, *r.slo_tpot_s * 1e3,
                       100 * (p.tpot_s / *r.slo_tpot_s - 1));
    c.miss = std::max(c.miss, p.tpot_s / *r.slo_tpot_s);
  }
  if (r.slo_ttft_s && p.ttft_s > *r.slo_ttft_s) {
    ttft = fmt::format("TTFT {:.1f} ms > SLO {:.1f} ms (+{:.0f}%)", p.ttft_s * 1e3, *r.slo_ttft_s * 1e3,
                       100 * (p.ttft_s / *r.slo_ttft_s - 1));
    c.miss = std::max(c.miss, p.ttft_s / *r.slo_ttft_s);
  }
  c.slo_miss = tpot.empty() ? ttft : ttft.empty() ? tpot : tpot + ", " + ttft;
  return c;
}
}  // namespace

Candidate evaluate(const PlanRequest& r, int replicas, const Layout& layout, int batch, const LayoutLinks& links) {
  return evaluate_inputs(r, replicas, inputs(r, layout, batch, links));
}

std::string_view to_string(Objective o) {
  switch (o) {
    case Objective::kGoodput: return "goodput";
    case Objective::kThroughput: return "throughput";
    case Objective::kLatency: return "latency";
  }
  return "?";
}

Objective parse_objective(std::string_view name) {
  for (Objective o : {Objective::kGoodput, Objective::kThroughput, Objective::kLatency})
    if (name == to_string(o)) return o;
  throw_error(ErrorCode::kInvalidArgument, "unknown objective '{}'; valid: goodput, throughput, latency", name);
}

bool ranks_before(Objective o, const Candidate& a, const Candidate& b) {
  if (o == Objective::kLatency && a.request_latency_s != b.request_latency_s)
    return a.request_latency_s < b.request_latency_s;
  if (a.total_tokens_per_s != b.total_tokens_per_s) return a.total_tokens_per_s > b.total_tokens_per_s;
  return a.prediction.tpot_s < b.prediction.tpot_s;
}

namespace {

// What stopped every layout: the memory shortfall closest to fitting, or the SLO closest
// to being met, or the shape constraint.
std::string binding_constraint(const PlanResult& res) {
  const Candidate* best_mem = nullptr;
  const Candidate* best_slo = nullptr;
  std::map<std::string, int> shapes;
  for (const auto& c : res.rejected) {
    const auto& p = c.prediction;
    if (!p.feasible && p.reason.rfind("memory", 0) == 0) {
      if (!best_mem || c.miss < best_mem->miss) best_mem = &c;
    } else if (!p.feasible) {
      ++shapes[p.reason];
    } else if (c.layout.variant != Variant::kNoComm && (!best_slo || c.miss < best_slo->miss)) {
      best_slo = &c;
    }
  }
  if (best_slo)
    return fmt::format("the latency SLO: the closest layout (d={} p={} t={} m={} {} batch {}{}) has {}",
                       best_slo->replicas, best_slo->layout.p, best_slo->layout.t, best_slo->layout.microbatches,
                       to_string(best_slo->layout.variant), best_slo->batch, chunk_words(best_slo->layout),
                       best_slo->slo_miss);
  if (best_mem)
    return fmt::format("device memory: the closest layout (d={} p={} t={} batch {}) {}", best_mem->replicas,
                       best_mem->layout.p, best_mem->layout.t, best_mem->batch, best_mem->prediction.reason);
  if (!shapes.empty()) return "model shape: " + shapes.begin()->first;
  return "no layouts to evaluate (no devices?)";
}

std::string why_line(const PlanResult& res, Objective objective) {
  if (res.ranked.empty()) return {};
  const Candidate& w = res.ranked.front();
  std::string vs;
  for (const auto& c : res.ranked)
    if (c.layout.p != w.layout.p || c.layout.t != w.layout.t) {
      vs = objective == Objective::kLatency
               ? fmt::format("; best other grid d={} p={} t={} serves a request in {:.2f} s ({:.0f}% longer)",
                             c.replicas, c.layout.p, c.layout.t, c.request_latency_s,
                             100 * (c.request_latency_s / w.request_latency_s - 1))
               : fmt::format("; best other grid d={} p={} t={} reaches {:.0f} tokens/s ({:.0f}% of the winner)",
                             c.replicas, c.layout.p, c.layout.t, c.total_tokens_per_s,
                             100 * c.total_tokens_per_s / w.total_tokens_per_s);
      break;
    }
  for (const auto& b : res.bounds)
    if (b.replicas == w.replicas && b.layout.p == w.layout.p && b.layout.t == w.layout.t &&
        b.layout.microbatches == w.layout.microbatches && b.layout.prefill_chunk == w.layout.prefill_chunk &&
        b.batch == w.batch) {
      vs += fmt::format("; it reaches {:.0f}% of its no-communication bound", 100 * w.total_tokens_per_s / b.total_tokens_per_s);
      break;
    }
  return w.prediction.dominant + vs;
}

std::string layout_words(const Candidate& c) {
  return fmt::format("d={} p={} t={} m={} batch {}{}", c.replicas, c.layout.p, c.layout.t, c.layout.microbatches,
                     c.batch, chunk_words(c.layout));
}

// The winner's TP group spans hosts: what the fabric costs it per decode step, and what it
// gains over the best layout whose TP stays in a host (which may miss the SLO, or not fit).
std::optional<TpAcrossHosts> explain_tp_across_hosts(const PlanRequest& r, const PlanResult& res) {
  if (res.ranked.empty() || r.kind == ModelKind::kAppendix) return std::nullopt;
  const Candidate& w = res.ranked.front();
  if (w.tp_hosts <= 1) return std::nullopt;
  TpAcrossHosts x;
  x.hosts = w.tp_hosts;
  x.domain = r.cluster.domain_word();
  const LayoutLinks links = layout_links(r.cluster, w.layout.p, w.layout.t);
  x.link = links.tp.inter.name;
  x.link_bandwidth = links.tp.inter.bandwidth;
  const int m = w.layout.microbatches;
  x.inter_s = w.prediction.decode.tp_comm_inter * m;
  x.step_s = w.prediction.tpot_s;
  auto inside = [](const Candidate& c) { return c.tp_hosts <= 1 && c.layout.variant != Variant::kNoComm; };
  for (const auto& c : res.ranked)
    if (inside(c)) {
      x.alternative = c;
      break;
    }
  if (!x.alternative)  // none within the SLO: the one that misses it least
    for (const Candidate* c : res.feasible())
      if (inside(*c) && (!x.alternative || c->miss < x.alternative->miss ||
                         (c->miss == x.alternative->miss && ranks_before(r.objective, *c, *x.alternative))))
        x.alternative = *c;
  const double compute = w.prediction.decode.compute * m;
  std::string line = fmt::format(
      "TP across {}s: t={} spans {} {}s, so each all-reduce also crosses {} at {:.1f} GB/s per rank (its share of "
      "the {}'s NICs): {:.2f} ms of each {:.2f} ms decode step ({:.0f}%); in exchange each rank holds and computes "
      "1/{} of every layer ({:.2f} ms of compute per step",
      x.domain, w.layout.t, x.hosts, x.domain, x.link, x.link_bandwidth / 1e9, x.domain, x.inter_s * 1e3,
      x.step_s * 1e3, 100 * x.inter_s / x.step_s, w.layout.t, compute * 1e3);
  if (!x.alternative) {
    line += fmt::format("); no layout with TP inside one {} fits in memory", x.domain);
  } else {
    const Candidate& a = *x.alternative;
    const double a_compute = a.prediction.decode.compute * a.layout.microbatches;
    const double a_bubble = a.prediction.decode.bubble * a.layout.microbatches;
    line += fmt::format(" vs {:.2f} ms{} on the best layout with TP inside a {}, {}", a_compute * 1e3,
                        a_bubble > 0 ? fmt::format(" + {:.2f} ms pipeline bubble", a_bubble * 1e3) : std::string(),
                        x.domain, layout_words(a));
    if (!a.slo_miss.empty()) {
      line += fmt::format("), which misses the SLO: {}", a.slo_miss);
    } else if (r.objective == Objective::kLatency) {
      x.gain = a.request_latency_s / w.request_latency_s - 1;
      line += fmt::format(", which serves a request in {:.2f} s vs {:.2f} s here: {:.0f}% longer)",
                          a.request_latency_s, w.request_latency_s, 100 * x.gain);
    } else {
      x.gain = w.total_tokens_per_s / a.total_tokens_per_s - 1;
      line += fmt::format(", which reaches {:.0f} tokens/s (TPOT {:.2f} ms): this pick gains {:.0f}%)",
                          a.total_tokens_per_s, a.prediction.tpot_s * 1e3, 100 * x.gain);
    }
  }
  x.line = std::move(line);
  return x;
}

// When nothing is ranked: the layouts that come closest, least miss first. Layouts that fit
// but miss the SLO come before layouts that do not fit; shape problems are not listed.
std::vector<Candidate> closest_misses(const PlanResult& res, Objective o, std::size_t n) {
  std::vector<const Candidate*> slo, memory;
  for (const auto& c : res.rejected) {
    if (c.layout.variant == Variant::kNoComm) continue;
    if (c.prediction.feasible) slo.push_back(&c);
    else if (c.miss > 0) memory.push_back(&c);
  }
  auto order = [o](const Candidate* a, const Candidate* b) {
    if (a->miss != b->miss) return a->miss < b->miss;
    return ranks_before(o, *a, *b);
  };
  auto& pool = slo.empty() ? memory : slo;
  std::sort(pool.begin(), pool.end(), order);
  // One row per grid (d, p, t, variant, precision): its least miss.
  std::vector<Candidate> out;
  std::set<std::tuple<int, int, int, Variant, Precision>> seen;
  for (const Candidate* c : pool) {
    if (out.size() >= n) break;
    if (seen.insert({c->replicas, c->layout.p, c->layout.t, c->layout.variant, c->precision}).second)
      out.push_back(*c);
  }
  return out;
}

}  // namespace

PlanResult plan(const PlanRequest& r) {
  PlanResult res;
  const int n = r.devices > 0 ? r.devices : r.cluster.ranks();
  if (n > r.cluster.ranks())
    throw_error(ErrorCode::kInvalidArgument, "--gpus {}: the cluster has only {} devices", n, r.cluster.ranks());
  if (n < 1) throw_error(ErrorCode::kInvalidArgument, "--gpus must be >= 1");
  if (r.swift) check_swift_estimate(*r.swift);
  res.warnings = r.cluster.warnings;
  auto listed = [&](Variant v) { return std::find(r.variants.begin(), r.variants.end(), v) != r.variants.end(); };
  // Variants only change TP communication: with t = 1 they all cost the same, so one of them
  // stands for all (the one the model was trained as when listed), and the appendix model
  // has no variants at all (`standard` when listed).
  const Variant t1 = listed(r.model.trained_variant) ? r.model.trained_variant
                     : listed(Variant::kStandard)    ? Variant::kStandard
                                                     : r.variants.empty() ? Variant::kStandard : r.variants.front();
  const std::vector<int> chunks = chunk_options(r);
  // Precisions: each is a workload of its own element sizes.
  std::vector<PlanRequest> per_precision;
  if (r.precisions.empty()) per_precision.push_back(r);
  for (Precision pr : r.precisions) {
    per_precision.push_back(r);
    per_precision.back().work = with_precision(r.work, pr);
  }
  // The grids (d, p, t) are independent and every prediction is a pure function: they are
  // searched on several threads, each into its own lists, merged afterwards in grid order so
  // the result is the same as a sequential search.
  struct Grid {
    int d, p, t;
  };
  std::vector<Grid> grids;
  for (int d : divisors(n)) {
    if (d > 1 && !r.replicas) break;
    const int per = n / d;
    for (int t : divisors(per))
      if (per / t <= r.model.layers) grids.push_back({d, per / t, t});  // else a shape constraint, below
  }
  auto search = [&](const Grid& g, PlanResult& out) {
    const int d = g.d, p = g.p, t = g.t;
    const LayoutLinks grid_links = layout_links(r.cluster, p, t);
    for (const auto& [ep, ep_group] : ep_options(r, d, p, t)) {
      LayoutLinks links = grid_links;
      links.ep = ep_group;
      for (const PlanRequest& rp : per_precision)
        for (Variant v : r.variants) {
          if (t == 1 && v != t1) continue;
          if (r.kind == ModelKind::kAppendix && v != Variant::kStandard && listed(Variant::kStandard)) continue;
          for (int batch : r.batches) {
            // The wave of whole prompts does not depend on the decode microbatches: its best
            // prefill microbatch count, found once per batch, is reused for every m.
            int wave_m = 0;
            ModelInputs in = inputs(rp, Layout{p, t, 1, v, r.lp_fraction}, batch, links);
            in.layout.head_aware_split = r.head_aware_split;
            for (int m : microbatch_options(p, batch, r.kind))
              for (int chunk : chunks) {
                Layout l{p, t, m, v, r.lp_fraction};
                l.ep = ep;
                l.head_aware_split = r.head_aware_split;
                l.prefill_chunk = chunk;
                l.prefill_microbatches = chunk == 0 ? wave_m : 0;
                in.layout = l;
                Candidate c = evaluate_inputs(rp, d, in);
                ++out.evaluated;
                if (chunk == 0 && c.prediction.feasible) wave_m = c.prediction.prefill_microbatches;
                if (c.prediction.feasible && c.slo_miss.empty() && v == Variant::kNoComm)
                  out.bounds.push_back(std::move(c));  // an upper bound, never a pick
                else if (!c.prediction.feasible || !c.slo_miss.empty())
                  out.rejected.push_back(std::move(c));
                else
                  out.ranked.push_back(std::move(c));
              }
          }
        }
    }
  };
  std::vector<PlanResult> parts(grids.size());
  const int threads = static_cast<int>(std::min<std::size_t>(grids.size(), std::max<std::size_t>(1, allowed_cpus().size())));
  std::atomic<std::size_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  auto worker = [&](int w) {
    try {
      for (std::size_t i = next++; i < grids.size(); i = next++) search(grids[i], parts[i]);
    } catch (...) {
      errors[static_cast<std::size_t>(w)] = std::current_exception();
      next = grids.size();
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(worker, w);
  worker(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  auto append = [](std::vector<Candidate>& to, std::vector<Candidate>& from) {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  };
  std::size_t n_ranked = 0, n_rejected = 0, n_bounds = 0;
  for (const auto& part : parts) {
    n_ranked += part.ranked.size();
    n_rejected += part.rejected.size();
    n_bounds += part.bounds.size();
  }
  res.ranked.reserve(n_ranked);
  res.rejected.reserve(n_rejected);
  res.bounds.reserve(n_bounds);
  for (auto& part : parts) {
    res.evaluated += part.evaluated;
    append(res.ranked, part.ranked);
    append(res.rejected, part.rejected);
    append(res.bounds, part.bounds);
  }
  std::sort(res.ranked.begin(), res.ranked.end(),
            [&](const Candidate& a, const Candidate& b) { return ranks_before(r.objective, a, b); });
  if (res.ranked.empty()) {
    res.binding_constraint = binding_constraint(res);
    res.closest = closest_misses(res, r.objective, 10);
  }
  res.why = why_line(res, r.objective);
  res.tp_across_hosts = explain_tp_across_hosts(r, res);
  return res;
}

std::vector<const Candidate*> PlanResult::feasible() const {
  std::vector<const Candidate*> out;
  for (const auto* list : {&ranked, &bounds, &rejected})
    for (const auto& c : *list)
      if (c.prediction.feasible) out.push_back(&c);
  return out;
}

std::vector<const Candidate*> pareto_front(const std::vector<const Candidate*>& all, std::optional<Variant> variant) {
  std::vector<const Candidate*> pts;
  for (const Candidate* c : all)
    if (c->prediction.feasible && (!variant || c->layout.variant == *variant)) pts.push_back(c);
  std::sort(pts.begin(), pts.end(), [](const Candidate* a, const Candidate* b) {
    if (a->prediction.tpot_s != b->prediction.tpot_s) return a->prediction.tpot_s < b->prediction.tpot_s;
    return a->total_tokens_per_s > b->total_tokens_per_s;
  });
  std::vector<const Candidate*> front;
  double best = -1;
  for (const Candidate* c : pts)
    if (c->total_tokens_per_s > best) {
      front.push_back(c);
      best = c->total_tokens_per_s;
    }
  return front;
}

}  // namespace trellis::sim
