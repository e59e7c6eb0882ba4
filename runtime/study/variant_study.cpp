#include "trellis/core/strings.hpp"
#include "trellis/runtime/study/variant_study.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <cstring>
#include <span>
#include <sstream>

#include <sys/resource.h>
#include <time.h>

#include "trellis/core/error.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::runtime {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Deterministic token ids: the study times the same work for every variant, so decode
// tokens are not sampled from (possibly wrong, for nocomm) logits.
std::int32_t token_id(int seq, int pos, int vocab) { return static_cast<std::int32_t>((seq * 131 + pos * 37 + 5) % vocab); }

std::string layers_text(const VariantSpec& spec, int num_layers) {
  const int last = spec.range_last < 0 ? num_layers : spec.range_last;
  if (spec.range_first == 0 && last == num_layers) return "all";
  return fmt::format("{}-{}", spec.range_first, last - 1);
}

std::string share_text(double v) { return std::isnan(v) ? "n/a" : fmt::format("{:.0f}%", 100 * v); }
std::string csv_num(double v) { return std::isnan(v) ? "" : fmt::format("{:.6g}", v); }


std::vector<int> batches_of(const std::vector<StudyPoint>& points) {
  std::vector<int> b;
  for (const auto& p : points)
    if (std::find(b.begin(), b.end(), p.batch) == b.end()) b.push_back(p.batch);
  return b;
}

std::vector<std::string> variants_of(const std::vector<StudyPoint>& points) {
  std::vector<std::string> v;
  for (const auto& p : points)
    if (std::find(v.begin(), v.end(), p.variant) == v.end()) v.push_back(p.variant);
  return v;
}

}  // namespace

StagePlace StagePlace::of(int world_rank, int tp, int pp, int num_layers) {
  if (tp < 1 || pp < 1 || pp > num_layers)
    throw_error(ErrorCode::kInvalidArgument, "study: --tp {} x --pp {} cannot split a model of {} layers (need 1 <= pp <= layers)",
                tp, pp, num_layers);
  StagePlace p;
  p.tp = tp;
  p.pp = pp;
  p.stage = world_rank / tp;
  p.tp_rank = world_rank % tp;
  // Even split; the first num_layers % pp stages take one more.
  const int base = num_layers / pp, extra = num_layers % pp;
  for (int s = 0; s < p.stage; ++s) p.first_layer += base + (s < extra ? 1 : 0);
  p.last_layer = p.first_layer + base + (p.stage < extra ? 1 : 0);
  return p;
}

namespace {

// One forward of the pipeline on this rank: receive the hidden state from the previous stage
// (or embed), run this stage's layers with the variant, then pass x on, or (last stage)
// compute the logits and send the next tokens back to the first stage, which waits for them:
// a decode step needs the previous step's token, so stages never run ahead.
void pipeline_forward(VariantRunner& runner, LlamaModel& model, const Batch& batch, const kernels::TensorView& x,
                      const kernels::TensorView& local, std::vector<float>& full, bool gather, const StagePlace& place,
                      transport::Bootstrap& world, Millis deadline) {
  constexpr int kActTag = 0x5701, kTokTag = 0x5702;
  const int me = world.rank();
  auto bytes = [](const kernels::TensorView& t) {
    return std::span<std::byte>(static_cast<std::byte*>(t.data), static_cast<std::size_t>(t.numel()) * sizeof(float));
  };
  if (place.stage > 0) world.recv(me - place.tp, kActTag, bytes(x), Deadline::after(deadline));
  runner.run_stage(batch, x);
  if (place.stage + 1 < place.pp) world.send(me + place.tp, kActTag, bytes(x), Deadline::after(deadline));
  if (model.has_lm_head()) {
    model.local_logits(batch, x, local);
    if (gather) model.gather_logits(local, full);
  }
  if (place.pp == 1) return;
  std::vector<std::int32_t> next(batch.seqs.size(), 0);
  auto tok = std::as_writable_bytes(std::span(next));
  if (place.stage + 1 == place.pp) world.send(place.tp_rank, kTokTag, tok, Deadline::after(deadline));
  if (place.stage == 0) world.recv((place.pp - 1) * place.tp + place.tp_rank, kTokTag, tok, Deadline::after(deadline));
}

// CPU time and context switches so far: of the calling thread, and the process's CPU time.
struct CpuSample {
  double thread_s = 0, process_s = 0, vol = 0, invol = 0;
  static CpuSample now() {
    auto secs = [](clockid_t id) {
      timespec ts{};
      ::clock_gettime(id, &ts);
      return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    };
    CpuSample s;
    s.thread_s = secs(CLOCK_THREAD_CPUTIME_ID);
    s.process_s = secs(CLOCK_PROCESS_CPUTIME_ID);
    rusage ru{};
    ::getrusage(RUSAGE_THREAD, &ru);
    s.vol = static_cast<double>(ru.ru_nvcsw);
    s.invol = static_cast<double>(ru.ru_nivcsw);
    return s;
  }
};

// The wake control's request: never completes, costs one atomic load per test.
class IdleRequest final : public transport::Request {
 public:
  bool test() override { return false; }
  std::size_t bytes() const override { return 0; }
  std::string describe() const override { return "wake control (never completes)"; }
};

}  // namespace

StudyPoint measure_variant(LlamaModel& model, const VariantSpec& spec, int batch, const StudyRun& run,
                           transport::Bootstrap& world) {
  const ModelConfig& cfg = model.config();
  const StagePlace place = run.place.tp == 0 ? StagePlace::of(0, 1, 1, cfg.num_layers) : run.place;
  if (model.first_layer() != place.first_layer || model.last_layer() != place.last_layer)
    throw_error(ErrorCode::kInvalidArgument, "study: rank {} holds layers [{}, {}) but its stage {} of {} should hold [{}, {})",
                world.rank(), model.first_layer(), model.last_layer(), place.stage, place.pp, place.first_layer,
                place.last_layer);
  if (batch < 1 || run.prompt_len < 1 || run.gen_len < 1 || run.repeats < 1)
    throw_error(ErrorCode::kInvalidArgument, "study: batch ({}), prompt length ({}), gen length ({}) and repeats ({}) must be >= 1",
                batch, run.prompt_len, run.gen_len, run.repeats);
  VariantOptions vo;
  vo.progress = run.progress;
  vo.reader = run.reader;
  vo.load = run.load;
  VariantRunner runner(model, spec, run.deadline, vo);
  // Declared after the runner so it stops first; see StudyRun::wake_control.
  std::optional<transport::ProgressThread> control;
  transport::RequestPtr idle;
  if (run.wake_control) {
    control.emplace(transport::ProgressOptions{true, run.wake_interval, false});
    idle = control->drive(std::make_unique<IdleRequest>());
  }
  const std::int64_t H = cfg.hidden_size, P = run.prompt_len, B = batch;
  Batch pre;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < run.prompt_len; ++i) pre.tokens.push_back(token_id(b, i, cfg.vocab_size));
    pre.seqs.push_back({b, 0, P});
  }
  auto x = kernels::Tensor::empty(kernels::DType::kF32, {B * P, H});
  auto xd = kernels::Tensor::empty(kernels::DType::kF32, {B, H});
  auto local = kernels::Tensor::empty(kernels::DType::kF32, {B, model.layout().vocab_local()});
  std::vector<float> full;
  // nocomm drops the logits all-gather too: the bound has no TP communication at all.
  const bool gather = variant_is_exact(spec.kind);

  StudyPoint pt;
  pt.variant = run.label.empty() ? std::string(to_string(spec.kind)) : run.label;
  pt.layers = layers_text(spec, cfg.num_layers);
  pt.exact = variant_is_exact(spec.kind);
  pt.batch = batch;
  pt.prompt_len = run.prompt_len;
  pt.gen_len = run.gen_len;
  std::vector<double> pre_t, dec_t, cpu_t[4], tests_t[5];
  for (int r = 0; r < run.warmup + run.repeats; ++r) {
    world.barrier(Deadline::after(run.deadline));
    const double bg0 = static_cast<double>(runner.progress().background_tests()),
                 co0 = static_cast<double>(runner.progress().cooperative_tests());
    const CpuSample p0 = CpuSample::now();
    const double w0 = static_cast<double>(runner.ladder_waits()), h0 = static_cast<double>(runner.ladder_waits_complete());
    double t0 = now_seconds();
    pipeline_forward(runner, model, pre, x, local, full, gather, place, world, run.deadline);
    double tp = now_seconds() - t0;
    const CpuSample p1 = CpuSample::now();
    const double w1 = static_cast<double>(runner.ladder_waits()), h1 = static_cast<double>(runner.ladder_waits_complete());
    // Smallest rank's share; 2 marks "no ladder waits" (every rank alike), reported as NaN.
    auto hidden_share = [&](double waits, double hidden) {
      const double v = -world.max(waits > 0 ? -hidden / waits : -2.0, Deadline::after(run.deadline));
      return v > 1.0 ? kNaN : v;
    };
    const double pre_hidden = hidden_share(w1 - w0, h1 - h0);
    const double tests[3] = {world.max(static_cast<double>(runner.progress().background_tests()) - bg0,
                                       Deadline::after(run.deadline)),
                             world.max(static_cast<double>(runner.progress().cooperative_tests()) - co0,
                                       Deadline::after(run.deadline)),
                             world.max(p1.thread_s - p0.thread_s, Deadline::after(run.deadline))};
    pt.all_reduces_prefill = runner.all_reduces();

    std::vector<std::int32_t> toks(static_cast<std::size_t>(batch));
    std::vector<std::int64_t> pos(static_cast<std::size_t>(batch), P);
    const CpuSample c0 = CpuSample::now();
    t0 = now_seconds();
    const double dw0 = static_cast<double>(runner.ladder_waits()), dh0 = static_cast<double>(runner.ladder_waits_complete());
    for (int k = 0; k < run.gen_len; ++k) {
      for (int b = 0; b < batch; ++b) toks[static_cast<std::size_t>(b)] = token_id(b, run.prompt_len + k, cfg.vocab_size);
      Batch step = Batch::decode(toks, pos);
      pipeline_forward(runner, model, step, xd, local, full, gather, place, world, run.deadline);
      for (auto& p : pos) ++p;
    }
    double td = (now_seconds() - t0) / run.gen_len;
    const CpuSample c1 = CpuSample::now();
    const double dec_hidden = hidden_share(static_cast<double>(runner.ladder_waits()) - dw0,
                                           static_cast<double>(runner.ladder_waits_complete()) - dh0);
    pt.all_reduces_decode = runner.all_reduces();
    // The slowest rank sets the step time (with stages: the one that finishes last).
    tp = world.max(tp, Deadline::after(run.deadline));
    td = world.max(td, Deadline::after(run.deadline));
    const double steps = run.gen_len;
    const double cpu[4] = {world.max((c1.thread_s - c0.thread_s) / steps, Deadline::after(run.deadline)),
                           world.max((c1.process_s - c0.process_s) / steps, Deadline::after(run.deadline)),
                           world.max((c1.vol - c0.vol) / steps, Deadline::after(run.deadline)),
                           world.max((c1.invol - c0.invol) / steps, Deadline::after(run.deadline))};
    if (r >= run.warmup) {
      pre_t.push_back(tp);
      dec_t.push_back(td);
      for (int i = 0; i < 4; ++i) cpu_t[i].push_back(cpu[i]);
      for (int i = 0; i < 3; ++i) tests_t[i].push_back(tests[i]);
      tests_t[3].push_back(pre_hidden);
      tests_t[4].push_back(dec_hidden);
    }
  }
  pt.prefill_background_tests = median(tests_t[0]);
  pt.prefill_cooperative_tests = median(tests_t[1]);
  pt.prefill_thread_cpu_s = median(tests_t[2]);
  pt.prefill_hidden_waits = median(tests_t[3]);
  pt.decode_hidden_waits = median(tests_t[4]);
  pt.prefill_s = median(pre_t);
  pt.decode_s = median(dec_t);
  pt.decode_thread_cpu_s = median(cpu_t[0]);
  pt.decode_process_cpu_s = median(cpu_t[1]);
  pt.decode_vol_switches = median(cpu_t[2]);
  pt.decode_invol_switches = median(cpu_t[3]);
  // All-reduces per forward over the whole pipeline: the sum of every stage's count.
  const std::int32_t counts[2] = {place.tp_rank == 0 ? pt.all_reduces_prefill : 0,
                                  place.tp_rank == 0 ? pt.all_reduces_decode : 0};
  auto all = world.allgather(std::as_bytes(std::span(counts)), Deadline::after(run.deadline));
  pt.all_reduces_prefill = pt.all_reduces_decode = 0;
  for (const auto& v : all) {
    std::int32_t c[2];
    std::memcpy(c, v.data(), sizeof c);
    pt.all_reduces_prefill += c[0];
    pt.all_reduces_decode += c[1];
  }
  return pt;
}

std::vector<StudyPoint> measure_interleaved(LlamaModel& model, const std::vector<VariantSpec>& specs, int batch,
                                            const StudyRun& run, transport::Bootstrap& world) {
  if (!run.per_spec.empty() && run.per_spec.size() != specs.size())
    throw_error(ErrorCode::kInvalidArgument, "study: {} per-spec settings for {} variants", run.per_spec.size(), specs.size());
  // One single-repeat run per spec, with its label and progress options.
  std::vector<StudyRun> once(specs.size(), run);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    once[i].repeats = 1;
    once[i].warmup = 0;
    once[i].per_spec.clear();
    if (run.per_spec.empty()) continue;
    once[i].label = run.per_spec[i].label;
    if (run.per_spec[i].progress) once[i].progress = *run.per_spec[i].progress;
  }
  for (int w = 0; w < run.warmup; ++w)
    for (std::size_t i = 0; i < specs.size(); ++i) measure_variant(model, specs[i], batch, once[i], world);
  constexpr int kStats = 9;  // decode CPU (4), prefill tests (2), prefill thread CPU, hidden waits (2)
  std::vector<StudyPoint> points;
  std::vector<std::vector<double>> pre(specs.size()), dec(specs.size()), stat(specs.size() * kStats);
  for (int r = 0; r < run.repeats; ++r) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      StudyPoint p = measure_variant(model, specs[i], batch, once[i], world);
      pre[i].push_back(p.prefill_s);
      dec[i].push_back(p.decode_s);
      const double c[kStats] = {p.decode_thread_cpu_s,  p.decode_process_cpu_s,     p.decode_vol_switches,
                                p.decode_invol_switches, p.prefill_background_tests, p.prefill_cooperative_tests,
                                p.prefill_thread_cpu_s, p.prefill_hidden_waits, p.decode_hidden_waits};
      for (int k = 0; k < kStats; ++k) stat[i * kStats + k].push_back(c[k]);
      if (r == 0) points.push_back(p);
    }
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    points[i].prefill_s = median(pre[i]);
    points[i].decode_s = median(dec[i]);
    double* out[kStats] = {&points[i].decode_thread_cpu_s,   &points[i].decode_process_cpu_s,
                           &points[i].decode_vol_switches,   &points[i].decode_invol_switches,
                           &points[i].prefill_background_tests, &points[i].prefill_cooperative_tests,
                           &points[i].prefill_thread_cpu_s, &points[i].prefill_hidden_waits,
                           &points[i].decode_hidden_waits};
    for (int k = 0; k < kStats; ++k) *out[k] = median(stat[i * kStats + k]);
  }
  return points;
}

void derive_study(std::vector<StudyPoint>& points) {
  std::map<int, const StudyPoint*> std_at, nocomm_at;
  for (const auto& p : points) {
    if (p.variant == "standard" && p.layers == "all") std_at[p.batch] = &p;
    if (p.variant == "nocomm" && p.layers == "all") nocomm_at[p.batch] = &p;
  }
  // Copies: the pointers above point into `points`, which the loop below writes.
  std::map<int, StudyPoint> ref_std, ref_nc;
  for (auto& [b, p] : std_at) ref_std[b] = *p;
  for (auto& [b, p] : nocomm_at) ref_nc[b] = *p;
  auto share = [](double t_std, double t_v, double t_nc) {
    const double room = t_std - t_nc;
    return room > 0 ? (t_std - t_v) / room : kNaN;
  };
  auto tps = [](const StudyPoint& p) { return p.batch * p.gen_len / (p.prefill_s + p.gen_len * p.decode_s); };
  for (auto& p : points) {
    p.tokens_per_s = tps(p);
    p.decode_tokens_per_s = p.batch / p.decode_s;
    p.speedup_pct = p.prefill_bound_share = p.decode_bound_share = kNaN;
    auto s = ref_std.find(p.batch);
    if (s == ref_std.end()) continue;
    p.speedup_pct = 100.0 * (p.tokens_per_s / tps(s->second) - 1.0);
    auto n = ref_nc.find(p.batch);
    if (n == ref_nc.end()) continue;
    p.prefill_bound_share = share(s->second.prefill_s, p.prefill_s, n->second.prefill_s);
    p.decode_bound_share = share(s->second.decode_s, p.decode_s, n->second.decode_s);
  }
}

std::string format_study_tables(const std::vector<StudyPoint>& points, const std::string& title) {
  std::ostringstream o;
  o << title << "\n";
  for (int b : batches_of(points)) {
    const StudyPoint* any = nullptr;
    for (const auto& p : points)
      if (p.batch == b) any = &p;
    o << fmt::format("\nbatch {}: prefill {} x {} tokens, then {} decode steps (median of repeats, slowest rank)\n", b, b,
                     any->prompt_len, any->gen_len);
    o << fmt::format("  {:<12} {:<7} {:>11} {:>10} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6}  {}\n", "variant",
                     "layers", "prefill ms", "decode ms", "tokens/s", "speedup", "pf share", "dc share", "ARs/step",
                     "thr cpu", "proc cpu", "vcsw", "ivcsw", "");
    for (const auto& p : points) {
      if (p.batch != b) continue;
      o << fmt::format("  {:<12} {:<7} {:>11.3f} {:>10.3f} {:>10.1f} {:>9} {:>8} {:>8} {:>8} {:>8.3f} {:>8.3f} {:>6.1f} {:>6.1f}  {}\n",
                       p.variant, p.layers, 1e3 * p.prefill_s, 1e3 * p.decode_s, p.tokens_per_s,
                       std::isnan(p.speedup_pct) ? "n/a" : fmt::format("{:+.1f}%", p.speedup_pct),
                       share_text(p.prefill_bound_share), share_text(p.decode_bound_share), p.all_reduces_decode,
                       1e3 * p.decode_thread_cpu_s, 1e3 * p.decode_process_cpu_s, p.decode_vol_switches,
                       p.decode_invol_switches, p.exact ? "" : std::string("(") + kNoCommLabel + ")");
    }
  }
  o << "\ntokens/s = batch x decode steps / (prefill + decode steps x decode step); speedup: tokens/s over standard;\n"
       "pf/dc share: share of the no-communication bound reached, (t_standard - t_variant) / (t_standard - t_nocomm),\n"
       "for prefill and decode latency; ARs/step: TP all-reduces per decode forward; per decode step (largest rank):\n"
       "thr cpu / proc cpu: ms of CPU time of the compute thread / the whole process, vcsw / ivcsw: the compute\n"
       "thread's voluntary / involuntary context switches. nocomm: "
    << kNoCommLabel << ".\n";
  return o.str();
}

std::string format_study_csv(const std::vector<StudyPoint>& points) {
  std::ostringstream o;
  o << "variant,layers,batch,prompt_len,gen_len,prefill_ms,decode_ms,tokens_per_s,decode_tokens_per_s,speedup_pct,"
       "prefill_bound_share,decode_bound_share,all_reduces_prefill,all_reduces_decode,decode_thread_cpu_ms,"
       "decode_process_cpu_ms,decode_vol_switches,decode_invol_switches,exact,note\n";
  for (const auto& p : points)
    o << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", p.variant, p.layers, p.batch,
                     p.prompt_len, p.gen_len, csv_num(1e3 * p.prefill_s), csv_num(1e3 * p.decode_s),
                     csv_num(p.tokens_per_s), csv_num(p.decode_tokens_per_s), csv_num(p.speedup_pct),
                     csv_num(p.prefill_bound_share), csv_num(p.decode_bound_share), p.all_reduces_prefill,
                     p.all_reduces_decode, csv_num(1e3 * p.decode_thread_cpu_s), csv_num(1e3 * p.decode_process_cpu_s),
                     csv_num(p.decode_vol_switches), csv_num(p.decode_invol_switches), p.exact ? 1 : 0,
                     p.exact ? "" : fmt::format("\"{}\"", kNoCommLabel));  // the label has a comma
  return o.str();
}

std::string format_study_svg(const std::vector<StudyPoint>& points, const std::string& title) {
  static const char* kColors[] = {"#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#999999", "#da8bc3"};
  const auto batches = batches_of(points);
  const auto variants = variants_of(points);
  const double bar = 14, gap = 24, left = 60, top = 60, plot_h = 260;
  const double group_w = bar * static_cast<double>(variants.size()) + gap;
  const double width = left + group_w * static_cast<double>(batches.size()) + 260;
  const double height = top + plot_h + 60;
  auto rel = [&](const StudyPoint& p) {
    return std::isnan(p.speedup_pct) ? kNaN : 1.0 + p.speedup_pct / 100.0;
  };
  double ymax = 1.2;
  for (const auto& p : points)
    if (!std::isnan(rel(p))) ymax = std::max(ymax, rel(p) * 1.1);
  auto y_of = [&](double v) { return top + plot_h * (1.0 - v / ymax); };

  std::ostringstream o;
  o << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" font-family="sans-serif" font-size="11">)",
                   width, height)
    << "\n";
  o << R"svg(<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">)svg"
       R"(<rect width="6" height="6" fill="#dddddd"/><line x1="0" y1="0" x2="0" y2="6" stroke="#666666" stroke-width="2"/>)"
       "</pattern></defs>\n";
  o << fmt::format(R"(<text x="{:.0f}" y="20" font-size="14">{}</text>)", left, xml_escape(title)) << "\n";
  o << fmt::format(R"(<text x="{:.0f}" y="38">end-to-end tokens/s relative to standard at the same batch (standard = 1)</text>)",
                   left)
    << "\n";
  for (double t = 0; t <= ymax + 1e-9; t += 0.25) {
    o << fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" {}/>)", left, y_of(t),
                     left + group_w * static_cast<double>(batches.size()), y_of(t), t == 1.0 ? "#000000" : "#e0e0e0",
                     t == 1.0 ? R"(stroke-dasharray="4,3")" : "")
      << "\n";
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{:.2f}</text>)", left - 4, y_of(t) + 4, t) << "\n";
  }
  for (std::size_t g = 0; g < batches.size(); ++g) {
    const double gx = left + gap / 2 + group_w * static_cast<double>(g);
    for (std::size_t v = 0; v < variants.size(); ++v) {
      for (const auto& p : points) {
        if (p.batch != batches[g] || p.variant != variants[v] || std::isnan(rel(p))) continue;
        const double x = gx + bar * static_cast<double>(v), y = y_of(rel(p));
        const std::string fill = p.exact ? kColors[v % 8] : "url(#hatch)";
        o << fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}" stroke="#333333" stroke-width="0.5">)",
                         x, y, bar - 2, top + plot_h - y, fill)
          << fmt::format("<title>{} batch {}: {:.1f} tokens/s ({:+.1f}%){}</title></rect>\n", p.variant, p.batch,
                         p.tokens_per_s, p.speedup_pct, p.exact ? "" : std::string(", ") + kNoCommLabel);
      }
    }
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">batch {}</text>)",
                     gx + bar * static_cast<double>(variants.size()) / 2, top + plot_h + 18, batches[g])
      << "\n";
  }
  const double lx = left + group_w * static_cast<double>(batches.size()) + 20;
  for (std::size_t v = 0; v < variants.size(); ++v) {
    const bool nocomm = variants[v] == "nocomm";
    const double ly = top + 18 * static_cast<double>(v);
    o << fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="12" height="12" fill="{}" stroke="#333333" stroke-width="0.5"/>)",
                     lx, ly, nocomm ? "url(#hatch)" : kColors[v % 8])
      << fmt::format(R"(<text x="{:.1f}" y="{:.1f}">{}{}</text>)", lx + 18, ly + 10, xml_escape(variants[v]),
                     nocomm ? std::string(" (") + kNoCommLabel + ")" : "")
      << "\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace trellis::runtime
