// The CUDA backend's runtime: contexts (stream, cuBLASLt, workspace, scratch), device memory,
// copies between devices, error checks and what `trellis info` reports.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda/cuda_ops.hpp"
#include "cuda/state.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels::cuda {

static_assert(static_cast<int>(Elem::kF32) == static_cast<int>(DType::kF32) &&
                  static_cast<int>(Elem::kBF16) == static_cast<int>(DType::kBF16) &&
                  static_cast<int>(Elem::kF16) == static_cast<int>(DType::kF16) &&
                  static_cast<int>(Elem::kQ4_1) == static_cast<int>(DType::kQ4_1) &&
                  static_cast<int>(Elem::kQ8_0) == static_cast<int>(DType::kQ8_0),
              "launch.hpp's Elem must number the types as DType does");

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // cuBLASLt's advice for Hopper
constexpr std::size_t kUploadHalfBytes = std::size_t{1} << 20;  // a few decode steps of descriptors

ErrorCode code_of(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation: return ErrorCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice: return ErrorCode::kUnsupported;
    default: return ErrorCode::kIo;
  }
}

// Why there is no usable GPU, or "" when there is one.
std::string no_device_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so later calls do not report it again
    return fmt::format("{} ({} from cudaGetDeviceCount)", cudaGetErrorString(e), cudaGetErrorName(e));
  }
  return n == 0 ? "cudaGetDeviceCount found 0 GPUs" : "";
}

}  // namespace

void check(cudaError_t e, const char* call, int gpu) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error; a sticky one (a kernel fault) stays
  throw_error(code_of(e), "CUDA call {} failed on GPU {}: {} ({})", call, gpu, cudaGetErrorString(e),
              cudaGetErrorName(e));
}

void check(cublasStatus_t e, const char* call, int gpu) {
  if (e == CUBLAS_STATUS_SUCCESS) return;
  throw_error(e == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kResourceExhausted
              : e == CUBLAS_STATUS_NOT_SUPPORTED ? ErrorCode::kUnsupported
                                                 : ErrorCode::kIo,
              "cuBLAS call {} failed on GPU {}: {} ({})", call, gpu, cublasLtGetStatusString(e),
              cublasLtGetStatusName(e));
}

CudaState* create_state(int gpu) {
  std::string why = no_device_reason();
  if (!why.empty()) throw_error(ErrorCode::kUnsupported, "Context(cuda, GPU {}): no CUDA device: {}", gpu, why);
  int n = 0;
  TRELLIS_CUDA_CHECK(gpu, cudaGetDeviceCount(&n));
  if (gpu < 0 || gpu >= n)
    throw_error(ErrorCode::kInvalidArgument, "Context(cuda, GPU {}): this process sees GPUs 0..{} only", gpu, n - 1);
  TRELLIS_CUDA_CHECK(gpu, cudaSetDevice(gpu));
  struct Partial {  // releases what was made if a later step throws
    CudaState* s;
    ~Partial() { destroy_state(s); }
  } guard{new CudaState};
  CudaState* s = guard.s;
  s->gpu = gpu;
  TRELLIS_CUDA_CHECK(gpu, cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, gpu));
  // A blocking stream: work on the legacy default stream (cudaMemset, cudaFree) stays ordered with it.
  TRELLIS_CUDA_CHECK(gpu, cudaStreamCreate(&s->stream));
  TRELLIS_CUDA_CHECK(gpu, cublasLtCreate(&s->lt));
  TRELLIS_CUDA_CHECK(gpu, load_elementwise_kernels());
  TRELLIS_CUDA_CHECK(gpu, load_matmul_kernels());
  TRELLIS_CUDA_CHECK(gpu, load_attention_kernels());
  s->workspace = device_alloc(kWorkspaceBytes);
  s->workspace_bytes = kWorkspaceBytes;
  guard.s = nullptr;
  return s;
}

void destroy_state(CudaState* s) noexcept {
  if (!s) return;
  cudaSetDevice(s->gpu);
  if (s->stream) cudaStreamSynchronize(s->stream);
  if (s->lt) cublasLtDestroy(s->lt);
  device_free(s->workspace);
  device_free(s->scratch);
  if (s->ring.host) cudaFreeHost(s->ring.host);
  for (auto& e : s->ring.left)
    if (e) cudaEventDestroy(e);
  if (s->stream) cudaStreamDestroy(s->stream);
  delete s;
}

void synchronize(const CudaState& s) { TRELLIS_CUDA_CHECK(s.gpu, cudaStreamSynchronize(s.stream)); }

void* stream_of(const CudaState& s) { return s.stream; }

void* device_alloc(std::size_t bytes) {
  int gpu = -1;
  if (cudaGetDevice(&gpu) != cudaSuccess || !no_device_reason().empty())
    throw_error(ErrorCode::kUnsupported, "Tensor on cuda: no CUDA device: {}", no_device_reason());
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) return p;
  cudaGetLastError();
  std::size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  throw_error(e == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted : ErrorCode::kIo,
              "CUDA call cudaMalloc failed on GPU {}: {} ({}): {} bytes requested, {} of {} bytes free", gpu,
              cudaGetErrorString(e), cudaGetErrorName(e), bytes, free_bytes, total);
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);  // synchronises the device: no enqueued kernel still uses p
}

void device_zero(void* p, std::size_t bytes) {
  if (!p || bytes == 0) return;
  int gpu = -1;
  cudaGetDevice(&gpu);
  TRELLIS_CUDA_CHECK(gpu, cudaMemset(p, 0, bytes));
  TRELLIS_CUDA_CHECK(gpu, cudaDeviceSynchronize());  // allocation time only; orders it with every stream
}

void* scratch(CudaState& s, std::size_t bytes) {
  if (bytes <= s.scratch_bytes) return s.scratch;
  if (s.mode == GraphMode::kRecording)  // the sizing pass before capture grows it; this would be a bug
    throw_error(ErrorCode::kInternal, "graph capture: the context's scratch would grow to {} bytes mid-capture", bytes);
  std::size_t want = std::max(align_up(bytes), s.scratch_bytes * 2);
  TRELLIS_CUDA_CHECK(s.gpu, cudaStreamSynchronize(s.stream));
  device_free(s.scratch);
  s.scratch = nullptr;
  s.scratch_bytes = 0;
  s.scratch = device_alloc(want);
  s.scratch_bytes = want;
  ++s.scratch_serial;
  return s.scratch;
}

const void* upload(CudaState& s, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return dst;
  const std::size_t need = (bytes + 63) / 64 * 64;
  if (s.mode != GraphMode::kOff) {
    // A graph's input: staged in its arena; the kernel reads the arena's device copy, which
    // the graph's first node fills from the whole arena at each launch.
    GraphStaging& a = *s.staging;
    const bool room = a.base && a.used + need <= a.capacity;
    if (room) std::memcpy(a.base + a.used, src, bytes);
    if (s.mode == GraphMode::kRecording && !(room && a.device))
      throw_error(ErrorCode::kInternal, "graph capture: an upload of {} bytes outside the sized arena", bytes);
    std::byte* at = a.device ? a.device + a.used : nullptr;
    if (s.mode == GraphMode::kRecording && a.copy_each)
      TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpyAsync(at, a.base + a.used, bytes, cudaMemcpyHostToDevice, s.stream));
    a.used += need;
    return at;
  }
  CudaState::UploadRing& r = s.ring;
  if (!r.host) {
    r.half = kUploadHalfBytes;
    TRELLIS_CUDA_CHECK(s.gpu, cudaHostAlloc(reinterpret_cast<void**>(&r.host), 2 * r.half, cudaHostAllocDefault));
    for (auto& e : r.left) TRELLIS_CUDA_CHECK(s.gpu, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  if (need > r.half) {  // larger than a half (not seen in a forward): a plain copy
    TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s.stream));
    return dst;
  }
  if (r.used + need > r.half) {
    TRELLIS_CUDA_CHECK(s.gpu, cudaEventRecord(r.left[r.current], s.stream));
    r.recorded[r.current] = true;
    r.current ^= 1;
    r.used = 0;
    // The other half's last copies were enqueued before its event: past it, it is free.
    if (r.recorded[r.current]) TRELLIS_CUDA_CHECK(s.gpu, cudaEventSynchronize(r.left[r.current]));
  }
  std::byte* stage = r.host + static_cast<std::size_t>(r.current) * r.half + r.used;
  std::memcpy(stage, src, bytes);
  r.used += need;
  TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, s.stream));
  return dst;
}

Mat mat_of(const TensorView& m) {
  return Mat{m.data, static_cast<Elem>(m.dtype), m.rows(), m.cols(), m.row_stride()};
}

void copy(const Context& ctx, const TensorView& src, const TensorView& dst) {
  CudaState& s = ctx.cuda_state();
  if (s.mode != GraphMode::kOff && (src.device == Device::kCpu || dst.device == Device::kCpu))
    throw_error(ErrorCode::kInvalidArgument, "copy: {} -> {} touches host memory inside a CUDA graph's body",
                src.describe(), dst.describe());
  if (filling(s)) return;
  const std::int64_t rows = src.rows();
  if (rows == 0 || src.cols() == 0) return;
  const std::size_t width = dtype_bytes(src.dtype, src.cols());
  const std::size_t spitch = rows > 1 ? dtype_bytes(src.dtype, src.row_stride()) : width;
  const std::size_t dpitch = rows > 1 ? dtype_bytes(dst.dtype, dst.row_stride()) : width;
  // cudaMemcpyDefault: the driver tells host from device memory (unified addressing). Dense
  // on both sides: one linear copy (2-D copies limit the pitch).
  if (spitch == width && dpitch == width)
    TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpyAsync(dst.data, src.data, width * static_cast<std::size_t>(rows),
                                              cudaMemcpyDefault, s.stream));
  else
    TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpy2DAsync(dst.data, dpitch, src.data, spitch, width,
                                                static_cast<std::size_t>(rows), cudaMemcpyDefault, s.stream));
  if (src.device == Device::kCpu || dst.device == Device::kCpu)
    TRELLIS_CUDA_CHECK(s.gpu, cudaStreamSynchronize(s.stream));
}

CudaKernelsInfo info() {
  CudaKernelsInfo i;
  i.built = true;
  i.architectures = TRELLIS_CUDA_ARCHS;
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) i.runtime = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
  std::size_t lt = cublasLtGetVersion();
  i.cublaslt = fmt::format("{}.{}.{}", lt / 10000, (lt % 10000) / 100, lt % 100);
  i.why = no_device_reason();
  if (!i.why.empty()) return i;
  int n = 0;
  cudaGetDeviceCount(&n);
  for (int g = 0; g < n; ++g) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, g) != cudaSuccess) continue;
    i.gpus.push_back({g, p.name, p.major, p.minor, p.multiProcessorCount, static_cast<std::int64_t>(p.totalGlobalMem)});
  }
  return i;
}

}  // namespace trellis::kernels::cuda
