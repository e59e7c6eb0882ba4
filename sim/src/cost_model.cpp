// The refined model. Everything here is arithmetic on the inputs; the structure follows one
// microbatch through the stages (see the header for the list of departures from the
// appendix and docs/planner.md for the derivation of each term).
#include "trellis/sim/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "cost_model_internal.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/units.hpp"
#include "trellis/topology/placement.hpp"

namespace trellis::sim {
namespace {


double log2_steps(int n) { return n <= 1 ? 0 : std::ceil(std::log2(static_cast<double>(n))); }

// Per-rank sizes of one decoder layer's modules for a TP degree.
struct Shard {
  double attn_params = 0;  // q, k, v, o (+ bias) held by one rank
  double mlp_params = 0;   // gate, up, down held by one rank
  double q_dim = 0;        // query width computed by one rank
  double kv_heads = 0;     // KV heads held by one rank (replicated when t > kv heads)
  double core_dim = 0;     // attention-core width: 4 x tokens x ctx x core_dim FLOPs (MLA: absorbed)
  double kv_token = 0;     // KV-cache elements of one token in one layer on one rank
};

Shard shard(const ModelSpec& m, int t) {
  Shard s;
  const double q = static_cast<double>(m.heads) * m.head_dim;
  s.kv_heads = std::max(1.0, static_cast<double>(m.kv_heads) / t);
  const double kv = s.kv_heads * m.head_dim;
  s.q_dim = q / t;
  s.attn_params = detail::attention_params_per_rank(m, t);
  s.mlp_params = 3.0 * m.hidden * m.intermediate / t;
  s.core_dim = detail::attention_core_width(m, t);
  // MLA caches one latent (+ RoPE key) per token for all heads: every TP rank holds all of it.
  s.kv_token = m.is_mla() ? m.kv_bytes_per_token_layer(1) : 2.0 * kv;
  return s;
}

struct Roof {
  double time = 0;
  double memory_bound_time = 0;
};

// `linear` FLOPs are the weight GEMMs (on the FP8 tensor cores when the workload says so),
// `other` the attention core and the rest (16-bit, or f32 on the CPU path).
[[gnu::always_inline]] inline Roof roof(const ModelInputs& in, double linear, double other, double bytes) {
  const bool f32 = in.work.act_bytes >= 4;
  const double peak = (f32 ? in.device->dense_flops_fp32 : in.device->dense_flops_bf16) * in.compute_scale;
  const bool fp8 = in.work.fp8_linear && in.device->dense_flops_fp8 > 0;
  const double linear_peak = fp8 ? in.device->dense_flops_fp8 * in.compute_scale : peak;
  const double tf = (linear / linear_peak + other / peak) / in.efficiency.compute;
  const double tb = bytes / (in.device->memory_bandwidth * in.memory_scale * in.efficiency.memory);
  const double t = std::max(tf, tb) + in.device->launch_overhead_s / 2;
  return {t, tb >= tf ? t : 0};
}

// A linear layer of `params` weights on `rows` rows on a CPU rank sharing the host's cores
// (departure 11), plus the layer's non-GEMM work (`flops`, `bytes`: attention scores and
// values, KV cache, activations) at the rank's share of the host's measured rates.
Roof cpu_roof(const ModelInputs& in, double params, double rows, double flops, double bytes) {
  const CpuSharing& c = in.cpu;
  const int k = cpu_busy_ranks(c, in.layout, in.ranks_per_host);
  const double cap = c.threads_per_rank > 0 ? std::min<double>(c.threads_per_rank, c.cores) : c.cores;
  const double cores = std::min(c.cores / k, cap);
  const double share = cores / c.cores;
  double linear = 0;
  // The lock step was measured inside one host (shared-memory all-reduce, whose waits poll);
  // a TP group spanning hosts waits in the kernel and does not read those points.
  const Layout& l = in.layout;
  const bool coupled_fits = (l.t > 1 || l.p > 1) && (l.t == 1 || in.links.tp.hosts <= 1);
  if (coupled_fits && cpu_has_concurrent_curve(c, l.t, k, true, l.p)) {
    // Measured as this layout runs (departure 16): p stages of t ranks, TP groups in lock
    // step with their all-reduce, k of them computing at once while the others wait for
    // their input. Every wait for the slower partner, and the core a waiting rank takes from
    // the computing ones, is inside the rate; the cores are not divided on top.
    linear = params * cpu_seconds_per_param(c, rows, cap, l.t, k, true, l.p);
  } else if (k > 1 && cpu_has_concurrent_curve(c, in.layout.t, k)) {
    // Measured with k copies at once (departure 15): each rank runs its own kernel threads
    // and the contention for cores and memory is in the rate.
    linear = params * cpu_seconds_per_param(c, rows, cap, in.layout.t, k);
  } else {
    // The k busy ranks stream their weights through one memory system: together no faster
    // than the host's measured bandwidth, however fast each one's curve alone would be.
    linear = std::max(params * cpu_seconds_per_param(c, rows, cores, in.layout.t),
                      k * params * in.work.weight_bytes / c.host_memory_bandwidth);
  }
  const double t = linear + std::max(flops / (c.host_flops * share), bytes / (c.host_memory_bandwidth * share));
  // Memory-bound when streaming the weights takes longer than their arithmetic would.
  const bool mem = params * in.work.weight_bytes / c.host_memory_bandwidth >= 2 * params * rows / c.host_flops;
  return {t, mem ? t : 0};
}

// Compute of one layer's two modules for one step's work (StepWork: decode steps, whole
// prompts, or a prompt chunk riding with decode steps).
struct LayerCompute {
  Roof attn, mlp;
  Roof moe;  // a MoE layer's MLP block (MoE models only)
  double alltoall_bytes = 0;  // what one rank sends in each of a MoE layer's all-to-alls
};

LayerCompute layer_compute(const ModelInputs& in, const StepWork& w) {
  const ModelSpec& m = *in.model;
  const Shard s = shard(m, in.layout.t);
  const double tokens = w.tokens, ctx = w.ctx;
  const double wb = in.work.weight_bytes, ab = in.work.act_bytes;
  const double kv_token = s.kv_token * in.work.kv_bytes;
  const detail::MoeWork moe = m.is_moe() ? detail::moe_block_work(in, tokens) : detail::MoeWork{};
  const double kv_traffic = w.kv_positions * kv_token;
  LayerCompute c;
  c.alltoall_bytes = moe.alltoall_bytes;
  if (in.cpu.enabled) {
    // A curve measured through the whole forward already holds the attention core over
    // `covered` positions per row (departure 14): only the positions beyond it are added.
    const double covered = cpu_curve_context(in.cpu, tokens, in.layout.t);
    const double extra = ctx > 0 ? std::max(0.0, ctx - covered) / ctx : 0;
    c.attn = cpu_roof(in, s.attn_params, tokens, extra * 4 * tokens * ctx * s.core_dim,
                      extra * kv_traffic + (covered > 0 ? 0 : 4 * tokens * m.hidden * ab));
    c.mlp = cpu_roof(in, s.mlp_params, tokens, 0,
                     covered > 0 ? 0 : tokens * (2.0 * m.hidden + 3.0 * m.intermediate / in.layout.t) * ab);
    // A MoE block as a linear layer of the parameters each token passes through on this rank.
    if (m.is_moe()) c.moe = cpu_roof(in, moe.linear_flops / (2 * std::max(tokens, 1.0)), tokens, 0, 0);
    return c;
  }
  c.attn = roof(in, 2 * s.attn_params * tokens, 4 * tokens * ctx * s.core_dim,
                s.attn_params * wb + kv_traffic + 4 * tokens * m.hidden * ab);
  c.mlp = roof(in, 2 * s.mlp_params * tokens, 0,
               s.mlp_params * wb + tokens * (2.0 * m.hidden + 3.0 * m.intermediate / in.layout.t) * ab);
  if (m.is_moe()) c.moe = roof(in, moe.linear_flops, 0, moe.bytes);
  return c;
}

// All-reduces a stage of `n` layers issues under a variant, and how much of their time stays
// exposed. Ladder overlaps each all-reduce with the next module; the stage's last one has
// nothing after it and stays exposed.
struct CommCharge {
  double exposed = 0;
  double hidden = 0;
};

CommCharge tp_comm(const ModelInputs& in, int n, double ar, const LayerCompute& lc) {
  const Layout& l = in.layout;
  if (l.t <= 1 || n == 0) return {};
  switch (l.variant) {
    case Variant::kStandard: return {2.0 * n * ar, 0};
    case Variant::kParallel:
    case Variant::kDesync2: return {1.0 * n * ar, 0};
    case Variant::kDesync4: return {std::ceil(n / 2.0) * ar, 0};
    case Variant::kLayerParallel: {
      const int paired = 2 * static_cast<int>(std::floor(l.lp_fraction * n / 2.0));
      return {(2.0 * n - paired) * ar, 0};
    }
    case Variant::kLadder: {
      const double exposed = n * std::max(0.0, ar - lc.mlp.time) +
                             (n - 1) * std::max(0.0, ar - lc.attn.time) + ar;
      return {exposed, 2.0 * n * ar - exposed};
    }
    case Variant::kNoComm: return {};
  }
  return {};
}

// One stage's costs for one microbatch of one phase.
struct StageCost {
  double compute = 0, memory_bound = 0, comm = 0, comm_hidden = 0, comm_inter = 0, send = 0, meta = 0, head = 0,
         gather = 0, alltoall = 0;
  double forward() const { return compute + comm + head + gather + alltoall; }
};

StageCost stage_cost(const ModelInputs& in, int stage, int first, int n_layers, const StepWork& w) {
  const ModelSpec& m = *in.model;
  const int p = in.layout.p, t = in.layout.t;
  const double seqs = w.seqs, tokens = w.tokens;
  const LayerCompute lc = layer_compute(in, w);
  StageCost c;
  // MoE layers run the MoE block where dense layers run the MLP; with ep > 1 each MoE layer
  // also sends its tokens to their experts and back (two all-to-alls, not overlapped).
  const int n_moe = m.moe_layers_in(first, n_layers);
  c.compute = n_layers * lc.attn.time + (n_layers - n_moe) * lc.mlp.time + n_moe * lc.moe.time;
  c.memory_bound = n_layers * lc.attn.memory_bound_time + (n_layers - n_moe) * lc.mlp.memory_bound_time +
                   n_moe * lc.moe.memory_bound_time;
  if (n_moe > 0 && in.layout.ep > 1)
    c.alltoall = 2.0 * n_moe * alltoall_time(in.links.ep, lc.alltoall_bytes);
  const double msg = tokens * m.hidden * in.work.act_bytes;
  const double ar = allreduce_time(in.links.tp, msg);
  const CommCharge cc = tp_comm(in, n_layers, ar, lc);
  c.comm = cc.exposed;
  c.comm_hidden = cc.hidden;
  // The exposed all-reduce time in the same proportion as each all-reduce's fabric part.
  if (ar > 0 && in.links.tp.hosts > 1) c.comm_inter = cc.exposed * allreduce_inter_time(in.links.tp, msg) / ar;
  if (stage == p - 1) {
    // Only the last position of each sequence needs logits; vocab-parallel over t ranks,
    // gathered (f32) for the sampler.
    const double head_params = static_cast<double>(m.vocab) * m.hidden / t;
    const Roof head = in.cpu.enabled ? cpu_roof(in, head_params, seqs, 0, 0)
                                     : roof(in, 2.0 * head_params * seqs, 0, head_params * in.work.weight_bytes);
    const LinkCost& l = in.links.tp.intra;
    const double gather = t <= 1 ? 0 : (t - 1) * l.alpha_s + (t - 1.0) / t * seqs * m.vocab * 4 / l.bandwidth;
    c.head = head.time;
    c.memory_bound += head.memory_bound_time;
    c.gather = gather;
  } else {
    const LinkCost& b = in.links.boundaries.at(static_cast<std::size_t>(stage));
    c.send = transfer_time(b, msg);
    if (!in.techniques.structure_aware)
      c.meta = in.host.metadata_s + in.host.metadata_round_trips * 2 * b.alpha_s;
  }
  return c;
}

double gpu_sampling(const ModelInputs& in, double seqs) {
  const double logits = seqs * in.model->vocab * 4.0;
  return in.host.gpu_sample_fixed_s +
         in.host.gpu_sample_passes * logits / (in.device->memory_bandwidth * in.efficiency.memory);
}

double cpu_sampling(const ModelInputs& in, double seqs) { return seqs * in.model->vocab / in.host.cpu_sample_rate; }

}  // namespace

double transfer_time(const LinkCost& l, double bytes) { return l.alpha_s + bytes / l.bandwidth; }

double allreduce_time(const GroupLinks& g, double bytes) {
  if (g.ranks <= 1) return 0;
  const auto& cv = g.measured_curve;
  if (!cv.empty() && bytes <= cv.back().first) {
    if (bytes <= cv.front().first) return cv.front().second;
    auto hi = std::lower_bound(cv.begin(), cv.end(), bytes, [](const auto& pt, double b) { return pt.first < b; });
    auto lo = hi - 1;
    const double f = (bytes - lo->first) / (hi->first - lo->first);
    return lo->second + f * (hi->second - lo->second);
  }
  if (g.measured_bus_bandwidth > 0)
    return g.measured_alpha_s + 2.0 * (g.ranks - 1) / g.ranks * bytes / g.measured_bus_bandwidth;
  if (g.hosts <= 1) {
    const double t = g.ranks;
    return 2 * log2_steps(g.ranks) * g.intra.alpha_s + 2 * (t - 1) / t * bytes / g.intra.bandwidth;
  }
  const int local = std::max(1, g.ranks / g.hosts);
  const double l = local, h = g.hosts;
  double intra = 0;
  if (local > 1) intra = log2_steps(local) * g.intra.alpha_s + (l - 1) / l * bytes / g.intra.bandwidth;
  const double shard = bytes / l;
  const double inter = 2 * log2_steps(g.hosts) * g.inter.alpha_s + 2 * (h - 1) / h * shard / g.inter.bandwidth;
  return 2 * intra + inter;  // reduce-scatter and all-gather inside each host
}

double allreduce_inter_time(const GroupLinks& g, double bytes) {
  if (g.ranks <= 1 || g.hosts <= 1) return 0;
  const bool measured = (!g.measured_curve.empty() && bytes <= g.measured_curve.back().first) ||
                        g.measured_bus_bandwidth > 0;
  if (measured) return allreduce_time(g, bytes);
  const double l = std::max(1, g.ranks / g.hosts), h = g.hosts;
  return 2 * log2_steps(g.hosts) * g.inter.alpha_s + 2 * (h - 1) / h * (bytes / l) / g.inter.bandwidth;
}

std::string_view to_string(Precision p) {
  switch (p) {
    case Precision::kBf16: return "bf16";
    case Precision::kFp8: return "fp8";
    case Precision::kF32: return "f32";
  }
  return "?";
}

Precision parse_precision(std::string_view name) {
  for (Precision p : {Precision::kBf16, Precision::kFp8, Precision::kF32})
    if (name == to_string(p)) return p;
  throw_error(ErrorCode::kInvalidArgument, "unknown precision '{}'; valid: bf16, fp8, f32", name);
}

Workload with_precision(Workload w, Precision p) {
  switch (p) {
    case Precision::kBf16: w.weight_bytes = w.kv_bytes = w.act_bytes = 2; w.fp8_linear = false; break;
    case Precision::kFp8: w.weight_bytes = w.kv_bytes = 1; w.act_bytes = 2; w.fp8_linear = true; break;
    case Precision::kF32: w.weight_bytes = w.kv_bytes = w.act_bytes = 4; w.fp8_linear = false; break;
  }
  return w;
}

double roofline_time(const DeviceSpec& d, const Efficiency& e, double flops, double bytes, bool f32) {
  const double peak = f32 ? d.dense_flops_fp32 : d.dense_flops_bf16;
  return std::max(flops / (peak * e.compute), bytes / (d.memory_bandwidth * e.memory));
}

namespace {
// The measured rate curve of one thread count at `rows`: linear between measured rows,
// the smallest row count's time below it, FLOP-bound (proportional to rows) above the largest.
double curve_at(const std::vector<MatmulPoint>& pts, int threads, double rows) {
  const MatmulPoint* lo = nullptr;  // largest measured rows <= rows
  const MatmulPoint* hi = nullptr;  // smallest measured rows >= rows
  const MatmulPoint* first = nullptr;
  const MatmulPoint* last = nullptr;
  for (const auto& p : pts) {
    if (p.threads != threads) continue;
    if (!first || p.rows < first->rows) first = &p;
    if (!last || p.rows > last->rows) last = &p;
    if (p.rows <= rows && (!lo || p.rows > lo->rows)) lo = &p;
    if (p.rows >= rows && (!hi || p.rows < hi->rows)) hi = &p;
  }
  if (!lo) return 1 / first->params_per_s;
  if (!hi) return rows / last->rows / last->params_per_s;
  if (hi->rows == lo->rows) return 1 / lo->params_per_s;
  const double f = (rows - lo->rows) / (hi->rows - lo->rows);
  return (1 - f) / lo->params_per_s + f / hi->params_per_s;
}
}  // namespace

namespace {
// The TP shard whose points a layout of TP degree `t` reads: the largest measured tp <= t,
// else the smallest measured (a curve measured on wider shards stands in for narrower ones).
int curve_tp(const std::vector<MatmulPoint>& pts, int t) {
  int best = 0, smallest = 0;
  for (const auto& p : pts) {
    if (p.tp <= t && p.tp > best) best = p.tp;
    if (smallest == 0 || p.tp < smallest) smallest = p.tp;
  }
  return best > 0 ? best : smallest;
}
}  // namespace

// Coupled points stand only for the group size they were measured with: the lock step of a
// 2-rank group says nothing about a 4-rank one. Copies and solo points read the nearest shard.
static bool point_matches(const MatmulPoint& p, int shard, int concurrent, bool coupled, int pp) {
  return p.tp == shard && p.concurrent == concurrent && p.coupled == coupled && (!coupled || p.pp == pp);
}

bool cpu_has_concurrent_curve(const CpuSharing& c, int tp, int concurrent, bool coupled, int pp) {
  const int shard = coupled ? tp : curve_tp(c.matmul, tp);
  for (const auto& p : c.matmul)
    if (point_matches(p, shard, concurrent, coupled, pp)) return true;
  return false;
}

double cpu_seconds_per_param(const CpuSharing& c, double rows, double cores, int tp, int concurrent, bool coupled,
                             int pp) {
  if (c.matmul.empty()) throw_error(ErrorCode::kInvalidArgument, "CPU sharing model without measured matmul rates");
  const int shard = coupled ? tp : curve_tp(c.matmul, tp);
  std::vector<MatmulPoint> pts;
  for (const auto& p : c.matmul)
    if (point_matches(p, shard, concurrent, coupled, pp)) pts.push_back(p);
  if (pts.empty())
    throw_error(ErrorCode::kInvalidArgument, "no matmul rates measured for tp {} with {} {} ranks{}", shard, concurrent,
                coupled ? "coupled" : "concurrent", coupled ? fmt::format(" in {} stages", pp) : "");
  int t_min = pts.front().threads, t_max = t_min, t_lo = 0, t_hi = 0;
  for (const auto& p : pts) {
    t_min = std::min(t_min, p.threads);
    t_max = std::max(t_max, p.threads);
    if (p.threads <= cores && p.threads > t_lo) t_lo = p.threads;
    if (p.threads >= cores && (t_hi == 0 || p.threads < t_hi)) t_hi = p.threads;
  }
  if (cores <= t_min) return curve_at(pts, t_min, rows) * t_min / cores;  // time-shared cores
  double v = 0;
  if (cores >= t_max) {
    v = curve_at(pts, t_max, rows);
  } else {
    const double a = curve_at(pts, t_lo, rows), b = curve_at(pts, t_hi, rows);
    const double f = t_hi == t_lo ? 0 : (cores - t_lo) / (t_hi - t_lo);
    v = (1 - f) * a + f * b;
  }
  // More cores never make a kernel slower when they are really there: a curve that measured
  // slower with more threads (their threads waited for each other while another process held
  // a core) is replaced by the fastest thread count that fits.
  for (const auto& p : pts)
    if (p.threads <= cores) v = std::min(v, curve_at(pts, p.threads, rows));
  return v;
}

double cpu_curve_context(const CpuSharing& c, double rows, int tp) {
  if (c.matmul.empty()) return 0;
  const int shard = curve_tp(c.matmul, tp);
  const MatmulPoint* near = nullptr;
  for (const auto& p : c.matmul) {
    if (p.tp != shard || p.concurrent != 1) continue;
    const double d = std::abs(std::log(p.rows / rows));
    if (!near || d < std::abs(std::log(near->rows / rows)) - 1e-12) near = &p;
  }
  return near ? near->context : 0;
}

int cpu_busy_ranks(const CpuSharing& c, const Layout& l, int ranks_per_host) {
  const int busy = l.t * std::min(l.microbatches, l.p);
  const int placed = c.one_machine ? l.p * l.t : ranks_per_host;
  return std::max(1, std::min(busy, placed));
}

std::vector<int> layers_per_stage(int layers, int p) {
  std::vector<int> out(static_cast<std::size_t>(p), layers / p);
  for (int i = 0; i < layers % p; ++i) ++out[static_cast<std::size_t>(i)];
  return out;
}

std::vector<int> stage_split(const ModelInputs& in) {
  const ModelSpec& m = *in.model;
  const int p = in.layout.p;
  if (!in.layout.head_aware_split || p < 2 || m.layers < p) return layers_per_stage(m.layers, p);
  const double per_layer = detail::stage_params_per_rank(in, 0, m.layers) / m.layers;
  const double head = static_cast<double>(m.vocab) * m.hidden / in.layout.t;
  return topology::split_layers(m.layers, p, per_layer > 0 ? head / per_layer : 0);
}

namespace detail {
int first_layer_of_stage(const std::vector<int>& split, int stage) {
  int first = 0;
  for (int s = 0; s < stage; ++s) first += split[static_cast<std::size_t>(s)];
  return first;
}

double stage_forward(const ModelInputs& in, int stage, int first, int n, const StepWork& w, Breakdown* b,
                     double* send, double* meta) {
  const StageCost c = stage_cost(in, stage, first, n, w);
  if (b) {
    b->compute = c.compute + c.head;
    b->compute_memory_bound = c.memory_bound;
    b->tp_comm = c.comm;
    b->tp_comm_hidden = c.comm_hidden;
    b->tp_comm_inter = c.comm_inter;
    b->ep_comm = c.alltoall;
    b->logits_gather = c.gather;
  }
  *send = c.send;
  *meta = c.meta;
  return c.forward();
}
double sampling_time(const ModelInputs& in, double seqs, bool on_cpu) {
  return on_cpu ? cpu_sampling(in, seqs) : gpu_sampling(in, seqs);
}
}  // namespace detail

Prediction predict(const ModelInputs& in) {
  Prediction out;
  if (std::string why = shape_problem(in); !why.empty()) {
    out.feasible = false;
    out.reason = std::move(why);
    return out;
  }
  const auto split = stage_split(in);
  out.layers_per_stage = split;
  out.memory = memory_per_device(in, split);
  out.capacity = in.device->memory_bytes * in.host.memory_utilisation;
  if (out.memory.total() > out.capacity) {
    out.feasible = false;
    out.reason = fmt::format(
        "memory: needs {:.1f} GiB per device (weights {:.1f} + KV cache {:.1f} + activations {:.1f} + reserve "
        "{:.1f}) > {:.1f} GiB usable on {}",
        out.memory.total() / kGiB, out.memory.weights / kGiB, out.memory.kv_cache / kGiB,
        out.memory.activations / kGiB, out.memory.reserve / kGiB, out.capacity / kGiB, in.device->name);
    return out;
  }
  assemble(in, split, out);
  return out;
}

}  // namespace trellis::sim
