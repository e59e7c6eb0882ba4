// The CUDA side of device_bench.hpp: event timing, the copy and read ceilings, and a direct
// cuBLASLt product (descriptors and algorithm made once, so run() is one cublasLtMatmul).
#include <algorithm>
#include <vector>

#include "cuda/state.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/device_bench.hpp"

namespace trellis::kernels {
namespace {

CudaState& state_of(const Context& ctx, const char* what) {
  if (ctx.device() != Device::kCuda)
    throw_error(ErrorCode::kUnsupported, "{}: needs a CUDA context (this one is on the CPU)", what);
  return ctx.cuda_state();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: throw_error(ErrorCode::kInvalidArgument, "DirectGemm: dtype {} is not f32, bf16 or f16", to_string(t));
  }
}

}  // namespace

DeviceTimer::DeviceTimer(const Context& ctx) : ctx_(ctx) {
  CudaState& s = state_of(ctx, "DeviceTimer");
  cudaEvent_t a = nullptr, b = nullptr;
  TRELLIS_CUDA_CHECK(s.gpu, cudaEventCreate(&a));
  if (cudaError_t e = cudaEventCreate(&b); e != cudaSuccess) {
    cudaEventDestroy(a);
    cuda::check(e, "cudaEventCreate", s.gpu);
  }
  begin_ = a;
  end_ = b;
}

DeviceTimer::~DeviceTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(begin_));
  cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}

void DeviceTimer::start() {
  CudaState& s = ctx_.cuda_state();
  TRELLIS_CUDA_CHECK(s.gpu, cudaEventRecord(static_cast<cudaEvent_t>(begin_), s.stream));
}

double DeviceTimer::stop() {
  CudaState& s = ctx_.cuda_state();
  TRELLIS_CUDA_CHECK(s.gpu, cudaEventRecord(static_cast<cudaEvent_t>(end_), s.stream));
  TRELLIS_CUDA_CHECK(s.gpu, cudaEventSynchronize(static_cast<cudaEvent_t>(end_)));
  float ms = 0;
  TRELLIS_CUDA_CHECK(s.gpu, cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin_), static_cast<cudaEvent_t>(end_)));
  return ms * 1e-3;
}

double time_graph_launches(const Context& ctx, const std::function<void()>& body, int launches, int reps) {
  CudaState& s = ctx.cuda_state();
  if (launches < 1 || reps < 1)
    throw_error(ErrorCode::kInvalidArgument, "time_graph_launches: needs launches >= 1 and reps >= 1 (got {}, {})", launches,
                reps);
  body();  // eagerly: the scratch and cuBLASLt's plans are made outside the capture
  TRELLIS_CUDA_CHECK(s.gpu, cudaStreamSynchronize(s.stream));
  cudaGraph_t graph = nullptr;
  TRELLIS_CUDA_CHECK(s.gpu, cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(s.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  TRELLIS_CUDA_CHECK(s.gpu, cudaStreamEndCapture(s.stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TRELLIS_CUDA_CHECK(s.gpu, made);
  struct ExecGuard {
    cudaGraphExec_t e;
    ~ExecGuard() { cudaGraphExecDestroy(e); }
  } guard{exec};
  TRELLIS_CUDA_CHECK(s.gpu, cudaGraphLaunch(exec, s.stream));  // warm
  DeviceTimer t(ctx);
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    t.start();
    for (int i = 0; i < launches; ++i) TRELLIS_CUDA_CHECK(s.gpu, cudaGraphLaunch(exec, s.stream));
    samples.push_back(t.stop() / launches);
  }
  return median(samples);
}

DeviceBandwidth measure_device_bandwidth(const Context& ctx, std::size_t bytes, int reps) {
  CudaState& s = state_of(ctx, "measure_device_bandwidth");
  bytes = bytes / 64 * 64;
  if (bytes < (std::size_t{64} << 20) || reps < 1)
    throw_error(ErrorCode::kInvalidArgument, "measure_device_bandwidth: needs at least 64 MiB and 1 rep (got {} bytes, {} reps)",
                bytes, reps);
  Tensor a = Tensor::empty(DType::kF32, {static_cast<std::int64_t>(bytes / 4)}, Device::kCuda);
  Tensor b = Tensor::empty(DType::kF32, {static_cast<std::int64_t>(bytes / 4)}, Device::kCuda);
  Tensor x = Tensor::zeros(DType::kF32, {1}, Device::kCuda);
  auto* word = static_cast<std::uint32_t*>(x.view().data);
  cuda::check(cuda::launch_fill_pattern(static_cast<std::uint32_t*>(a.view().data), bytes / 4, s.stream), "fill_pattern_kernel", s.gpu);
  const std::uint32_t want = cuda::pattern_xor(bytes / 4);
  DeviceTimer timer(ctx);
  std::vector<double> copy, read;
  for (int r = -1; r < reps; ++r) {  // rep -1 warms up
    timer.start();
    TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpyAsync(b.view().data, a.view().data, bytes, cudaMemcpyDeviceToDevice, s.stream));
    const double tc = timer.stop();
    TRELLIS_CUDA_CHECK(s.gpu, cudaMemsetAsync(word, 0, 4, s.stream));
    timer.start();
    cuda::check(cuda::launch_read_stream(r % 2 ? a.view().data : b.view().data, bytes, word, s.sm_count, s.stream),
                "read_stream_kernel", s.gpu);
    const double tr = timer.stop();
    std::uint32_t got = 0;
    TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpy(&got, word, 4, cudaMemcpyDeviceToHost));
    if (got != want)
      throw_error(ErrorCode::kInternal, "measure_device_bandwidth: the read stream's XOR is {:#x}, the pattern's {:#x}",
                  got, want);
    if (r < 0) continue;
    copy.push_back(2.0 * static_cast<double>(bytes) / tc);
    read.push_back(static_cast<double>(bytes) / tr);
  }
  DeviceBandwidth out;
  out.bytes = bytes;
  out.reps = reps;
  out.copy_median_bytes_per_s = median(copy);
  out.copy_best_bytes_per_s = *std::max_element(copy.begin(), copy.end());
  out.read_median_bytes_per_s = median(read);
  out.read_best_bytes_per_s = *std::max_element(read.begin(), read.end());
  return out;
}

struct DirectGemm::Impl {
  CudaState* s = nullptr;
  std::unique_ptr<LtPlan> plan;
  const void *x = nullptr, *w = nullptr;
  void* y = nullptr;
};

DirectGemm::DirectGemm(const Context& ctx, const TensorView& x, const TensorView& w, const TensorView& y)
    : impl_(std::make_unique<Impl>()) {
  CudaState& s = state_of(ctx, "DirectGemm");
  for (const TensorView* v : {&x, &w, &y}) ctx.check_device("DirectGemm", *v);
  if (x.dtype != w.dtype || y.dtype != DType::kF32 || x.cols() != w.cols() || y.rows() != x.rows() ||
      y.cols() != w.rows())
    throw_error(ErrorCode::kInvalidArgument, "DirectGemm: needs x[M,K] and w[N,K] of one type and y[M,N] f32 (x {}, w {}, y {})",
                x.describe(), w.describe(), y.describe());
  Impl& d = *impl_;
  d.s = &s;
  d.x = x.data;
  d.w = w.data;
  d.y = y.data;
  // The same descriptors and heuristic query as our matmul's (ops.cpp), so both run the same
  // cuBLASLt algorithm and the difference between them is what our matmul does around it.
  d.plan = cuda::make_lt_plan(s, lt_type(w.dtype), x.rows(), w.rows(), w.cols(), w.row_stride(), x.row_stride(),
                              y.row_stride(), cuda::alignment(w.data), cuda::alignment(x.data), cuda::alignment(y.data));
}

DirectGemm::~DirectGemm() = default;

void DirectGemm::run() {
  Impl& d = *impl_;
  const LtPlan& p = *d.plan;
  const float alpha = 1.0f, beta = 0.0f;
  TRELLIS_CUDA_CHECK(d.s->gpu, cublasLtMatmul(d.s->lt, p.op, &alpha, d.w, p.a, d.x, p.b, &beta, d.y, p.c, d.y, p.c,
                                              &p.algo, d.s->workspace, d.s->workspace_bytes, d.s->stream));
}

}  // namespace trellis::kernels
