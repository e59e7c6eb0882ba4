// `trellis bench kernels`: the kernels against their peers, measured in the same run.
//  * Prefill GEMM: y = x w^T on the linear-layer shapes of a model preset from the runtime's
//    table (default "llama-1b": hidden 2048, intermediate 8192, 32 heads / 8 KV heads of 64,
//    vocab 32000), ours with f32 and bf16 weights vs OpenBLAS cblas_sgemm and oneDNN's matmul
//    (f32, and bf16 with x rounded to bf16), each rep of each implementation interleaved so
//    they share the machine's noise; every result is checked against sgemm's first.
//  * Decode GEMV: weight bytes streamed per second at batch 1 (and --batch), against the
//    STREAM triad bandwidth measured at the start of the same run. Weights rotate through
//    enough copies to exceed the last-level cache, as a model's layers do.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "cmd_bench_kernels.hpp"
#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/kernels.hpp"
#include "trellis/runtime/model/synthetic.hpp"

namespace trellis::launchers {

namespace k = trellis::kernels;

std::vector<Shape> preset_shapes(const std::string& preset, const std::string& filter) {
  runtime::ModelConfig c = runtime::model_preset(preset);
  const std::int64_t q = std::int64_t{c.num_heads} * c.head_dim, kv = std::int64_t{c.num_kv_heads} * c.head_dim;
  std::vector<Shape> all = {{"qkv", q + 2 * kv, c.hidden_size},
                            {"o", c.hidden_size, q},
                            {"gate/up", c.intermediate_size, c.hidden_size},
                            {"down", c.hidden_size, c.intermediate_size},
                            {"lm_head", c.vocab_size, c.hidden_size}};
  if (filter == "all") return all;
  std::vector<Shape> out;
  for (const auto& name : split(filter, ',')) {
    auto it = std::find_if(all.begin(), all.end(), [&](const Shape& s) { return s.name == name; });
    if (it == all.end())
      throw_error(ErrorCode::kInvalidArgument, "--shapes: unknown shape '{}' (known: qkv, o, gate/up, down, lm_head, all)", name);
    out.push_back(*it);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

k::Tensor random_tensor(k::DType t, std::int64_t rows, std::int64_t cols, std::uint32_t seed,
                        k::HostArena* arena) {
  // Written element by element, not through k::convert: that needs a Context, and making one
  // sets OpenBLAS's thread count (the last Context made wins), which made every sgemm of this
  // benchmark single-threaded until 2026-11-27.
  if (t != k::DType::kF32 && t != k::DType::kBF16 && t != k::DType::kF16)
    throw_error(ErrorCode::kInvalidArgument, "bench: no random {} tensors", k::to_string(t));
  k::Tensor out = arena ? k::Tensor::empty(t, {rows, cols}, *arena) : k::Tensor::empty(t, {rows, cols});
  std::uint32_t s = seed * 2654435761u + 1;
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    s = s * 1664525u + 1013904223u;  // LCG: cheap and deterministic; values in [-0.5, 0.5)
    const float f = static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
    if (t == k::DType::kF32)
      out.ptr<float>()[i] = f;
    else
      out.ptr<std::uint16_t>()[i] = t == k::DType::kBF16 ? k::f32_to_bf16(f) : k::f32_to_f16(f);
  }
  return out;
}

namespace {

// One row of the prefill table: GFLOP/s medians of each implementation, in this order.
enum GemmImpl { kSgemm, kOursF32, kOursBf16, kBf16Sgemm, kDnnlF32, kBf16DnnlF32, kDnnlBf16, kGemmImpls };
// Their names in the JSON output and in errors.
constexpr const char* kGemmImplNames[kGemmImpls] = {"sgemm",      "ours_f32",           "ours_bf16",  "bf16_to_f32_sgemm",
                                                    "onednn_f32", "bf16_to_f32_onednn", "onednn_bf16"};

struct GemmRow {
  std::string shape;
  std::int64_t m, n, k;
  double gflops[kGemmImpls];
  double max_error[kGemmImpls];  // max |y - y_sgemm| / max |y_sgemm|, same weights, after warm-up
};

// Largest difference from the reference, relative to its largest magnitude.
double relative_error(const k::Tensor& y, const k::Tensor& ref) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(y.ptr<float>()[i] - ref.ptr<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::abs(ref.ptr<float>()[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

GemmRow bench_gemm(const k::Context& ctx, const Shape& s, std::int64_t m, int reps) {
  k::Tensor x = random_tensor(k::DType::kF32, m, s.k, 1);
  k::Tensor w32 = random_tensor(k::DType::kF32, s.n, s.k, 2), w16 = random_tensor(k::DType::kBF16, s.n, s.k, 3);
  struct Impl {
    const k::Tensor* w;
    k::MatmulAlgo algo;
    GemmImpl reference;  // sgemm with the same weights
    double tolerance;    // on relative_error: f32 sums in another order; bf16 x loses 16 bits
    k::Tensor y;
    std::vector<double> gflops;
  };
  using A = k::MatmulAlgo;
  Impl impls[kGemmImpls] = {{&w32, A::kBlas, kSgemm, 0, {}, {}},        {&w32, A::kGemm, kSgemm, 1e-4, {}, {}},
                            {&w16, A::kGemm, kBf16Sgemm, 1e-4, {}, {}}, {&w16, A::kBlas, kBf16Sgemm, 0, {}, {}},
                            {&w32, A::kOnednn, kSgemm, 1e-4, {}, {}},   {&w16, A::kOnednn, kBf16Sgemm, 1e-4, {}, {}},
                            {&w16, A::kOnednnBf16, kBf16Sgemm, 2e-2, {}, {}}};
  for (auto& im : impls) im.y = k::Tensor::empty(k::DType::kF32, {m, s.n});
  GemmRow row{s.name, m, s.n, s.k, {}, {}};
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  for (int r = -1; r < reps; ++r) {  // rep -1 warms caches, pages, scratch and oneDNN's primitives
    for (auto& im : impls) {
      double t0 = now_seconds();
      k::matmul(ctx, x, *im.w, im.y, {0.0f, im.algo});
      double dt = now_seconds() - t0;
      if (r >= 0) im.gflops.push_back(flops / dt / 1e9);
    }
    if (r >= 0) continue;
    // What is timed must be right: a broken call could look fast.
    for (int i = 0; i < kGemmImpls; ++i) {
      row.max_error[i] = relative_error(impls[i].y, impls[impls[i].reference].y);
      if (!(row.max_error[i] <= impls[i].tolerance))
        throw_error(ErrorCode::kInternal, "bench kernels: {} M={}: {} differs from sgemm by {:.3g} of the largest "
                    "value (bound {:.3g})", s.name, m, kGemmImplNames[i], row.max_error[i], impls[i].tolerance);
    }
  }
  for (int i = 0; i < kGemmImpls; ++i) row.gflops[i] = median(impls[i].gflops);
  return row;
}

struct GemvRow {
  std::string shape;
  std::string dtype;
  std::int64_t m, n, k;
  double gbps;        // weight bytes per second, median
  double triad_gbps;  // triad passes interleaved with this point's reps, median
  double ratio;       // median over reps of (GEMV / the triad pass just before it)
};

GemvRow bench_gemv(const k::Context& ctx, k::Triad& triad, const Shape& s, k::DType t, std::int64_t m, int reps,
                   std::size_t rotate_bytes) {
  const std::size_t bytes = static_cast<std::size_t>(s.n * s.k) * k::dtype_size(t);
  const std::size_t copies = std::max<std::size_t>(2, (rotate_bytes + bytes - 1) / bytes);
  std::vector<k::Tensor> ws;
  // The weights on the pages a model's weights get (kernels.huge_pages), as the triad's.
  k::HostArena arena({.huge_pages = ctx.huge_pages()});
  for (std::size_t i = 0; i < copies; ++i)
    ws.push_back(random_tensor(t, s.n, s.k, 10 + static_cast<std::uint32_t>(i), &arena));
  k::Tensor x = random_tensor(k::DType::kF32, m, s.k, 4), y = k::Tensor::empty(k::DType::kF32, {m, s.n});
  std::vector<double> gbps, tri, ratio;
  // Each sample streams every copy once, so no copy is still in cache when it comes round;
  // a triad pass right before it sees the same machine load.
  for (int r = -1; r < reps; ++r) {
    double bw = triad.run() / 1e9;
    double t0 = now_seconds();
    for (const auto& w : ws) k::matmul(ctx, x, w, y);
    double g = static_cast<double>(bytes * copies) / (now_seconds() - t0) / 1e9;
    if (r < 0) continue;
    gbps.push_back(g);
    tri.push_back(bw);
    ratio.push_back(g / bw);
  }
  return {s.name, std::string(k::to_string(t)), m, s.n, s.k, median(gbps), median(tri), median(ratio)};
}

int run_bench_kernels(Session& s, const KernelBenchOptions& o) {
  if (o.device == "cuda") return run_bench_kernels_cuda(s, o);
  if (!s.require_world(s.size() == 1, "bench kernels runs on one rank; run it without mpirun")) return 1;
  auto tokens = parse_int_list(o.tokens, "--tokens");
  const std::vector<Shape> shapes = preset_shapes(o.preset, o.shapes);
  const std::size_t triad_bytes = parse_size(o.triad_size, "--triad-size");
  const std::size_t rotate_bytes = parse_size(o.rotate_size, "--rotate-size");
  const int threads = static_cast<int>(s.config.get_int("kernels.threads"));
  k::Context ctx(threads);
  ctx.set_huge_pages(s.config.get_bool("kernels.huge_pages"));
  std::cerr << fmt::format("bench kernels: preset {} | {} | {} threads | BLAS {} | {} | ISA {} | huge pages {}\n",
                           o.preset, k::cpu_model_name(), ctx.threads(), k::blas_description(),
                           k::onednn_description(), k::compiled_isa(),
                           ctx.huge_pages() ? "asked (THP " + k::transparent_huge_page_mode() + ")" : "off");
  const std::string auto_f32 = k::prefill_gemm_choice(k::DType::kF32), auto_bf16 = k::prefill_gemm_choice(k::DType::kBF16);
  k::TriadResult triad = k::measure_triad(ctx, triad_bytes, 10);
  k::Triad triad_pass(ctx, triad_bytes);
  std::vector<GemmRow> gemm;
  for (auto m : tokens)
    for (const auto& sh : shapes) gemm.push_back(bench_gemm(ctx, sh, m, o.reps));
  std::vector<GemvRow> gemv;
  std::vector<std::int64_t> rows = {1};
  if (o.batch > 1) rows.push_back(o.batch);
  for (std::int64_t m : rows)
    for (k::DType t : {k::DType::kBF16, k::DType::kF32})
      for (const auto& sh : shapes) gemv.push_back(bench_gemv(ctx, triad_pass, sh, t, m, o.reps, rotate_bytes));
  const double triad_gbps = triad.median_bytes_per_s / 1e9;
  if (o.json) {
    nlohmann::json j;
    j["preset"] = o.preset;
    j["cpu"] = k::cpu_model_name();
    j["threads"] = ctx.threads();
    j["blas"] = k::blas_description();
    j["onednn"] = k::onednn_description();
    j["prefill_auto"] = {{"f32", auto_f32}, {"bf16", auto_bf16}};
    j["triad"] = {{"array_bytes", triad.array_bytes}, {"median_GBps", triad_gbps}, {"best_GBps", triad.best_bytes_per_s / 1e9}};
    for (const auto& g : gemm) {
      nlohmann::json r = {{"shape", g.shape}, {"m", g.m}, {"n", g.n}, {"k", g.k}};
      for (int i = 0; i < kGemmImpls; ++i) {
        r[std::string(kGemmImplNames[i]) + "_GFLOPs"] = g.gflops[i];
        r[std::string(kGemmImplNames[i]) + "_max_rel_error"] = g.max_error[i];
      }
      j["gemm"].push_back(r);
    }
    for (const auto& g : gemv)
      j["gemv"].push_back({{"shape", g.shape}, {"dtype", g.dtype}, {"m", g.m}, {"n", g.n}, {"k", g.k},
                           {"GBps", g.gbps}, {"triad_GBps", g.triad_gbps}, {"fraction_of_triad", g.ratio}});
    std::cout << versioned_json(j) << "\n";
    return 0;
  }
  std::cout << fmt::format("triad bandwidth ({} threads, 3 x {}): median {:.1f} GB/s, best {:.1f} GB/s\n\n",
                           ctx.threads(), format_bytes(static_cast<double>(triad.array_bytes)), triad_gbps,
                           triad.best_bytes_per_s / 1e9);
  std::cout << "prefill GEMM y[M,N] = x[M,K] w[N,K]^T, GFLOP/s (median of " << o.reps
            << "), ratio = / OpenBLAS sgemm; bf16 columns have bf16 weights (widened to f32 for sgemm and "
               "oneDNN f32); oneDNN bf16 rounds x to bf16 (counted in its time)\n";
  std::cout << fmt::format("kAuto at M > 8 takes: f32 weights: {}; bf16 weights: {}\n", auto_f32, auto_bf16);
  std::cout << fmt::format("{:<8} {:>5} {:>6} {:>5}  {:>7}  {:>8} {:>5}  {:>9} {:>5}  {:>10} {:>5}  {:>8} {:>5}  "
                           "{:>10} {:>5}  {:>9} {:>5}\n", "shape", "M", "N", "K", "sgemm", "ours f32", "ratio",
                           "ours bf16", "ratio", "bf16>sgemm", "ratio", "dnnl f32", "ratio", "bf16>dnnl", "ratio",
                           "dnnl bf16", "ratio");
  for (const auto& g : gemm) {
    std::string line = fmt::format("{:<8} {:>5} {:>6} {:>5}  {:>7.1f}", g.shape, g.m, g.n, g.k, g.gflops[kSgemm]);
    const int widths[] = {0, 8, 9, 10, 8, 10, 9};
    for (int i = 1; i < kGemmImpls; ++i)
      line += fmt::format("  {:>{}.1f} {:>5.2f}", g.gflops[i], widths[i], g.gflops[i] / g.gflops[kSgemm]);
    std::cout << line << "\n";
  }
  std::cout << "\ndecode GEMV (weights streamed from memory): GB/s of weights, a triad pass before each rep, "
               "medians; ratio = median of per-rep GEMV/triad\n";
  std::cout << fmt::format("{:<8} {:>5} {:>3} {:>6} {:>5}  {:>8}  {:>8}  {:>6}\n", "shape", "dtype", "M", "N", "K", "GB/s",
                           "triad", "ratio");
  for (const auto& g : gemv)
    std::cout << fmt::format("{:<8} {:>5} {:>3} {:>6} {:>5}  {:>8.1f}  {:>8.1f}  {:>6.2f}\n", g.shape, g.dtype, g.m, g.n,
                             g.k, g.gbps, g.triad_gbps, g.ratio);
  return 0;
}

}  // namespace

Action define_bench_kernels(CLI::App& sub) {
  auto o = std::make_shared<KernelBenchOptions>();
  sub.add_option("--device", o->device,
                 "cpu: GEMM vs OpenBLAS, GEMV vs triad; cuda: GEMM vs cuBLASLt called directly, GEMV vs the GPU's "
                 "read bandwidth, timed with CUDA events")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  sub.add_option("--bandwidth-size", o->bandwidth_size, "cuda: bytes of the copy and read-stream buffers")
      ->capture_default_str();
  sub.add_option("--preset", o->preset, "Model preset whose layer shapes are measured (see make-model)")
      ->capture_default_str();
  sub.add_option("--shapes", o->shapes, "Comma list of qkv, o, gate/up, down, lm_head, or all")
      ->capture_default_str();
  sub.add_option("--tokens", o->tokens, "Prefill token counts M for the GEMM table (e.g. 128,512)")
      ->capture_default_str();
  sub.add_option("--batch", o->batch, "Decode batch (rows) measured besides 1")->check(CLI::Range(1, 8))
      ->capture_default_str();
  sub.add_option("--reps", o->reps, "Timed repetitions per point (medians are reported)")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  sub.add_option("--triad-size", o->triad_size, "Bytes per triad array (3 arrays)")->capture_default_str();
  sub.add_option("--rotate-size", o->rotate_size,
                 "GEMV weights rotate through copies totalling at least this much (defeats the caches)")
      ->capture_default_str();
  sub.add_flag("--json", o->json, "Print JSON");
  return [o](Session& s) { return run_bench_kernels(s, *o); };
}

}  // namespace trellis::launchers
