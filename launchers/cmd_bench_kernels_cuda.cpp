// `trellis bench kernels --device cuda`: the CUDA backend against its ceilings and its peer,
// all timed with CUDA events on the op stream (device time, not launch gaps) in one run.
//  * The card's memory ceilings: a device-to-device copy (bytes read + written) and a
//    read-only stream (the limit of a GEMV that streams its weights once).
//  * Prefill GEMM on the preset's layer shapes: our matmul (f32 activations, bf16 or f32
//    weights: x is rounded to bf16 inside, as the model runs it) against one cublasLtMatmul
//    on operands already in the weight's type ("nothing around it" is the gap between them).
//  * Decode GEMV at batch 1 and --batch: weight bytes per second over copies that together
//    exceed the L2 cache, our GEMV kernel and the cuBLASLt path of our matmul side by side,
//    as a fraction of the read stream's bandwidth; timed twice: launched eagerly one by one,
//    and replayed as one CUDA graph (as the engine's decode step runs them; for the small
//    shapes the eager figure is the host's launch rate, not the kernel).
// Each timed point is also checked: ours and the peer must agree (relative L2 error < 2e-2:
// the peers round x to bf16, our GEMV keeps it f32), so a fast wrong kernel cannot score.
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cmd_bench_kernels.hpp"
#include "json_output.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/kernels.hpp"
#include "trellis/runtime/model/synthetic.hpp"

namespace trellis::launchers {
namespace {

namespace k = trellis::kernels;

k::Tensor to_device(const k::Context& ctx, const k::Tensor& host) {
  const k::TensorView& v = host.view();
  k::Tensor d = k::Tensor::empty(v.dtype, std::span<const std::int64_t>(v.shape.data(), v.ndim), k::Device::kCuda);
  k::copy(ctx, host, d);
  return d;
}

k::Tensor to_host(const k::Context& ctx, const k::Tensor& dev) {
  const k::TensorView& v = dev.view();
  k::Tensor h = k::Tensor::empty(v.dtype, std::span<const std::int64_t>(v.shape.data(), v.ndim));
  k::copy(ctx, dev, h);
  return h;
}

// Relative L2 distance of two f32 device tensors of one shape.
double rel_error(const k::Context& ctx, const k::Tensor& got, const k::Tensor& want) {
  k::Tensor a = to_host(ctx, got), b = to_host(ctx, want);
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double d = static_cast<double>(a.ptr<float>()[i]) - b.ptr<float>()[i];
    num += d * d;
    den += static_cast<double>(b.ptr<float>()[i]) * b.ptr<float>()[i];
  }
  return std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-300)) : INFINITY;
}

void check_agree(double err, const std::string& what) {
  if (!(err < 2e-2))
    throw_error(ErrorCode::kInternal, "bench kernels: {}: ours and the peer disagree (relative L2 error {:.3g})", what, err);
}

struct GemmRow {
  std::string shape, dtype;
  std::int64_t m, n, k;
  double ours_tflops;    // f32 activations, rounded to the weight type inside (as the model calls it)
  double ours16_tflops;  // activations already in the weight type (0 for f32 weights: the same call)
  double direct_tflops;
};

// Median device seconds per call of each of fs: `inner` back-to-back calls per sample, the
// functions interleaved within each rep so they share the card's state (clocks, L2).
std::vector<double> time_each(const k::Context& ctx, int reps, int inner, const std::vector<std::function<void()>>& fs) {
  k::DeviceTimer t(ctx);
  std::vector<std::vector<double>> samples(fs.size());
  for (int r = -1; r < reps; ++r)  // rep -1 warms up (cuBLASLt's heuristic, scratch growth)
    for (std::size_t i = 0; i < fs.size(); ++i) {
      t.start();
      for (int j = 0; j < inner; ++j) fs[i]();
      const double dt = t.stop() / inner;
      if (r >= 0) samples[i].push_back(dt);
    }
  std::vector<double> out;
  for (auto& v : samples) out.push_back(median(v));
  return out;
}

GemmRow bench_gemm(const k::Context& ctx, const Shape& sh, std::int64_t m, k::DType wt, int reps) {
  k::Tensor x32 = to_device(ctx, random_tensor(k::DType::kF32, m, sh.k, 1));
  k::Tensor w = to_device(ctx, random_tensor(wt, sh.n, sh.k, 2));
  k::Tensor xw = k::Tensor::empty(wt, {m, sh.k}, k::Device::kCuda);
  k::convert(ctx, x32, xw);
  k::Tensor y_ours = k::Tensor::empty(k::DType::kF32, {m, sh.n}, k::Device::kCuda);
  k::Tensor y_ours16 = k::Tensor::empty(k::DType::kF32, {m, sh.n}, k::Device::kCuda);
  k::Tensor y_peer = k::Tensor::empty(k::DType::kF32, {m, sh.n}, k::Device::kCuda);
  k::DirectGemm peer(ctx, xw, w, y_peer);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(sh.n) * static_cast<double>(sh.k);
  const int inner = std::clamp(static_cast<int>(2e11 / flops), 2, 50);
  const bool sixteen = wt != k::DType::kF32;
  std::vector<std::function<void()>> fs = {[&] { k::matmul(ctx, x32, w, y_ours, {0.0f, k::MatmulAlgo::kGemm}); },
                                           [&] { peer.run(); }};
  if (sixteen) fs.push_back([&] { k::matmul(ctx, xw, w, y_ours16, {0.0f, k::MatmulAlgo::kGemm}); });
  const std::vector<double> t = time_each(ctx, reps, inner, fs);
  const std::string what = fmt::format("GEMM {} M={} {}", sh.name, m, k::to_string(wt));
  check_agree(rel_error(ctx, y_ours, y_peer), what);
  if (sixteen) check_agree(rel_error(ctx, y_ours16, y_peer), what + " (16-bit x)");
  return {sh.name, std::string(k::to_string(wt)), m, sh.n, sh.k, flops / t[0] / 1e12, sixteen ? flops / t[2] / 1e12 : 0.0,
          flops / t[1] / 1e12};
}

struct GemvRow {
  std::string shape;
  std::int64_t m, n, k;
  double ours_gbps, lt_gbps;              // eager launches, back to back
  double ours_graph_gbps, lt_graph_gbps;  // the same launches replayed as one CUDA graph
};

GemvRow bench_gemv(const k::Context& ctx, const Shape& sh, std::int64_t m, int reps, std::size_t rotate_bytes) {
  const std::size_t bytes = static_cast<std::size_t>(sh.n * sh.k) * 2;
  const std::size_t copies = std::max<std::size_t>(2, (rotate_bytes + bytes - 1) / bytes);
  k::Tensor host = random_tensor(k::DType::kBF16, sh.n, sh.k, 10);
  std::vector<k::Tensor> ws;
  for (std::size_t i = 0; i < copies; ++i) ws.push_back(to_device(ctx, host));
  k::Tensor x = to_device(ctx, random_tensor(k::DType::kF32, m, sh.k, 4));
  k::Tensor y_ours = k::Tensor::empty(k::DType::kF32, {m, sh.n}, k::Device::kCuda);
  k::Tensor y_lt = k::Tensor::empty(k::DType::kF32, {m, sh.n}, k::Device::kCuda);
  const std::vector<double> t = time_each(
      ctx, reps, 1,
      {[&] { for (const auto& w : ws) k::matmul(ctx, x, w, y_ours, {0.0f, k::MatmulAlgo::kGemv}); },
       [&] { for (const auto& w : ws) k::matmul(ctx, x, w, y_lt, {0.0f, k::MatmulAlgo::kGemm}); }});
  const double ours = t[0], lt = t[1];
  check_agree(rel_error(ctx, y_ours, y_lt), fmt::format("GEMV {} M={}", sh.name, m));
  // As a decode step runs them (CUDA graphs): a GEMV of 8 MB reads in ~2 us on an H200, about
  // what the host needs to launch one, so eager timing of small shapes measures the host.
  const double ours_g = k::time_graph_launches(
      ctx, [&] { for (const auto& w : ws) k::matmul(ctx, x, w, y_ours, {0.0f, k::MatmulAlgo::kGemv}); }, 20, reps);
  const double lt_g = k::time_graph_launches(
      ctx, [&] { for (const auto& w : ws) k::matmul(ctx, x, w, y_lt, {0.0f, k::MatmulAlgo::kGemm}); }, 20, reps);
  check_agree(rel_error(ctx, y_ours, y_lt), fmt::format("GEMV {} M={} (graph)", sh.name, m));
  const double total = static_cast<double>(bytes * copies);
  return {sh.name, m, sh.n, sh.k, total / ours / 1e9, total / lt / 1e9, total / ours_g / 1e9, total / lt_g / 1e9};
}

}  // namespace

int run_bench_kernels_cuda(Session& s, const KernelBenchOptions& o) {
  if (!s.require_world(s.size() == 1, "bench kernels runs on one rank; run it without mpirun")) return 1;
  const auto tokens = parse_int_list(o.tokens, "--tokens");
  const std::vector<Shape> shapes = preset_shapes(o.preset, o.shapes);
  const std::size_t rotate_bytes = parse_size(o.rotate_size, "--rotate-size");
  const std::size_t bw_bytes = parse_size(o.bandwidth_size, "--bandwidth-size");
  const k::CudaKernelsInfo info = k::cuda_kernels_info();
  if (!info.built || info.gpus.empty())
    throw_error(ErrorCode::kUnsupported, "bench kernels --device cuda: {}", info.why.empty() ? "no GPU" : info.why);
  k::Context ctx(k::Device::kCuda, 0);
  const k::GpuInfo& gpu = info.gpus.front();
  std::cerr << fmt::format("bench kernels: preset {} | GPU 0 {} (sm_{}{}, {} SMs, {}) | CUDA {} | cuBLASLt {}\n", o.preset,
                           gpu.name, gpu.major, gpu.minor, gpu.multiprocessors,
                           format_bytes(static_cast<double>(gpu.memory_bytes)), info.runtime, info.cublaslt);
  const k::DeviceBandwidth bw = k::measure_device_bandwidth(ctx, bw_bytes, 20);
  const double read_gbps = bw.read_median_bytes_per_s / 1e9;
  std::vector<GemmRow> gemm;
  for (auto m : tokens)
    for (k::DType t : {k::DType::kBF16, k::DType::kF32})
      for (const auto& sh : shapes) gemm.push_back(bench_gemm(ctx, sh, m, t, o.reps));
  std::vector<GemvRow> gemv;
  std::vector<std::int64_t> rows = {1};
  if (o.batch > 1) rows.push_back(o.batch);
  for (auto m : rows)
    for (const auto& sh : shapes) gemv.push_back(bench_gemv(ctx, sh, m, o.reps, rotate_bytes));
  // The whole model's decode GEMVs at each M: every layer's matrices (q/k/v fused, o, gate and
  // up, down) n_layers times plus the LM head, timed as the medians above: bytes / time.
  const runtime::ModelConfig mc = runtime::model_preset(o.preset);
  struct ModelGemv {
    std::int64_t m;
    double gbps, graph_gbps;
  };
  std::vector<ModelGemv> model_gemv;
  for (auto m : rows) {
    double bytes = 0, secs = 0, graph_secs = 0;
    bool complete = o.shapes == "all";
    for (const auto& g : gemv) {
      if (g.m != m) continue;
      const double times = g.shape == "lm_head" ? 1.0 : (g.shape == "gate/up" ? 2.0 : 1.0) * mc.num_layers;
      const double b = static_cast<double>(g.n * g.k) * 2.0 * times;
      bytes += b;
      secs += b / (g.ours_gbps * 1e9);
      graph_secs += b / (g.ours_graph_gbps * 1e9);
    }
    if (complete && secs > 0) model_gemv.push_back({m, bytes / secs / 1e9, bytes / graph_secs / 1e9});
  }
  if (o.json) {
    nlohmann::json j;
    j["device"] = "cuda";
    for (const auto& mg : model_gemv)
      j["model_gemv"].push_back({{"m", mg.m}, {"layers", mc.num_layers}, {"GBps", mg.gbps},
                                 {"fraction_of_read", mg.gbps / read_gbps}, {"graph_GBps", mg.graph_gbps},
                                 {"graph_fraction_of_read", mg.graph_gbps / read_gbps}});
    j["preset"] = o.preset;
    j["gpu"] = {{"name", gpu.name}, {"sm", fmt::format("{}{}", gpu.major, gpu.minor)}, {"multiprocessors", gpu.multiprocessors},
                {"memory_bytes", gpu.memory_bytes}, {"cuda_runtime", info.runtime}, {"cublaslt", info.cublaslt}};
    j["bandwidth"] = {{"buffer_bytes", bw.bytes}, {"reps", bw.reps}, {"copy_median_GBps", bw.copy_median_bytes_per_s / 1e9},
                      {"copy_best_GBps", bw.copy_best_bytes_per_s / 1e9}, {"read_median_GBps", read_gbps},
                      {"read_best_GBps", bw.read_best_bytes_per_s / 1e9}};
    for (const auto& g : gemm)
      j["gemm"].push_back({{"shape", g.shape}, {"dtype", g.dtype}, {"m", g.m}, {"n", g.n}, {"k", g.k},
                           {"ours_TFLOPs", g.ours_tflops}, {"ours_16bit_x_TFLOPs", g.ours16_tflops},
                           {"cublaslt_direct_TFLOPs", g.direct_tflops}, {"ratio", g.ours_tflops / g.direct_tflops},
                           {"ratio_16bit_x", g.ours16_tflops / g.direct_tflops}});
    for (const auto& g : gemv)
      j["gemv"].push_back({{"shape", g.shape}, {"dtype", "bf16"}, {"m", g.m}, {"n", g.n}, {"k", g.k},
                           {"ours_GBps", g.ours_gbps}, {"cublaslt_GBps", g.lt_gbps},
                           {"fraction_of_read", g.ours_gbps / read_gbps}, {"ours_graph_GBps", g.ours_graph_gbps},
                           {"cublaslt_graph_GBps", g.lt_graph_gbps},
                           {"graph_fraction_of_read", g.ours_graph_gbps / read_gbps}});
    std::cout << versioned_json(j) << "\n";
    return 0;
  }
  std::cout << fmt::format("GPU memory ({} buffers, median of {}): copy {:.0f} GB/s (read + write), read stream {:.0f} GB/s\n\n",
                           format_bytes(static_cast<double>(bw.bytes)), bw.reps, bw.copy_median_bytes_per_s / 1e9, read_gbps);
  std::cout << "prefill GEMM y[M,N] = x[M,K] w[N,K]^T, TFLOP/s (median of " << o.reps
            << "), ratio = ours / cublasLtMatmul direct (target >= 0.90); 'ours' takes f32 x and rounds it, "
               "'x16' takes x already in the weight type\n";
  std::cout << fmt::format("{:<8} {:>5} {:>5} {:>6} {:>5}  {:>8} {:>6}  {:>8} {:>6}  {:>8}\n", "shape", "dtype", "M", "N",
                           "K", "ours", "ratio", "ours x16", "ratio", "direct");
  for (const auto& g : gemm)
    std::cout << fmt::format("{:<8} {:>5} {:>5} {:>6} {:>5}  {:>8.1f} {:>6.2f}  {:>8.1f} {:>6.2f}  {:>8.1f}\n", g.shape,
                             g.dtype, g.m, g.n, g.k, g.ours_tflops, g.ours_tflops / g.direct_tflops, g.ours16_tflops,
                             g.ours16_tflops / g.direct_tflops, g.direct_tflops);
  std::cout << "\ndecode GEMV, bf16 weights streamed from HBM: GB/s of weights (median), fraction = ours / read stream "
               "(target >= 0.70); eager = launched one by one, graph = the same launches replayed as a CUDA graph "
               "(as a decode step runs them)\n";
  std::cout << fmt::format("{:<8} {:>3} {:>6} {:>5}  {:>8} {:>9} {:>8}  {:>8} {:>9} {:>8}\n", "shape", "M", "N", "K", "eager",
                           "cuBLASLt", "fraction", "graph", "cuBLASLt", "fraction");
  for (const auto& g : gemv)
    std::cout << fmt::format("{:<8} {:>3} {:>6} {:>5}  {:>8.0f} {:>9.0f} {:>8.2f}  {:>8.0f} {:>9.0f} {:>8.2f}\n", g.shape, g.m,
                             g.n, g.k, g.ours_gbps, g.lt_gbps, g.ours_gbps / read_gbps, g.ours_graph_gbps, g.lt_graph_gbps,
                             g.ours_graph_gbps / read_gbps);
  for (const auto& mg : model_gemv)
    std::cout << fmt::format("{} decode at M={}, every GEMV of its {} layers and the LM head (bytes / summed medians): "
                             "eager {:.0f} GB/s = {:.2f}, graph {:.0f} GB/s = {:.2f} of the read stream\n",
                             o.preset, mg.m, mc.num_layers, mg.gbps, mg.gbps / read_gbps, mg.graph_gbps,
                             mg.graph_gbps / read_gbps);
  return 0;
}

}  // namespace trellis::launchers
