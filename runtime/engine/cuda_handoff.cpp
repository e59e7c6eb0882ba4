// The CUDA side of the device stage hand-off (cuda_handoff.hpp), compiled in CUDA builds
// only (runtime/CMakeLists.txt); cuda_handoff_none.cpp stands in elsewhere.
#include "cuda_handoff.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "trellis/core/error.hpp"

namespace trellis::runtime::detail {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes && sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes,
              "CUDA IPC handles are expected to be 64 bytes");

void check(cudaError_t e, const char* call, int gpu) {
  if (e != cudaSuccess)
    throw_error(ErrorCode::kUnsupported, "{} failed on GPU {}: {} ({})", call, gpu, cudaGetErrorString(e),
                cudaGetErrorName(e));
}
#define HANDOFF_CUDA(gpu, call) check((call), #call, (gpu))

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The driver's stream memory operations, found through the runtime (cudaGetDriverEntryPointByVersion)
// so that nothing links libcuda: a build machine without a driver links the same binary.
struct StreamValueApi {
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  std::string missing;  // why not, when either is null
};
const StreamValueApi& stream_value_api() {
  static const StreamValueApi api = [] {
    StreamValueApi a;
    for (auto [name, slot] : {std::pair{"cuStreamWaitValue32", reinterpret_cast<void**>(&a.wait)},
                              std::pair{"cuStreamWriteValue32", reinterpret_cast<void**>(&a.write)}}) {
      cudaDriverEntryPointQueryResult found{};
      const cudaError_t e = cudaGetDriverEntryPointByVersion(name, slot, 12000, cudaEnableDefault, &found);
      if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !*slot) {
        a.missing = std::string("the CUDA driver does not offer ") + name + " (" +
                    (e != cudaSuccess ? cudaGetErrorName(e) : "symbol not found") + ")";
        a.wait = nullptr;
        a.write = nullptr;
        break;
      }
    }
    return a;
  }();
  return api;
}

void check_cu(CUresult r, const char* call, int gpu) {
  if (r != CUDA_SUCCESS)
    throw_error(ErrorCode::kUnsupported, "{} failed on GPU {}: CUresult {}", call, gpu, static_cast<int>(r));
}

// The signal words, one allocation of their own in the receiver's device memory (exported
// whole): filled at byte 0, consumed at byte 128 (each on its own 128-byte line, as the two
// sides write them from different streams).
constexpr std::size_t kFilledAt = 0, kConsumedAt = 128, kSignalBytes = 256;
CUdeviceptr word(void* base, std::size_t at) { return reinterpret_cast<CUdeviceptr>(static_cast<char*>(base) + at); }
// Hand-off n is marked by the value n + 1 (0 means none yet); the comparison is cyclic, so the
// 32-bit truncation is exact for any n (at most one hand-off is in flight per boundary).
cuuint32_t mark(std::uint64_t n) { return static_cast<cuuint32_t>(n + 1); }

void wait_value(int gpu, void* stream, CUdeviceptr at, cuuint32_t value) {
  check_cu(stream_value_api().wait(reinterpret_cast<CUstream>(stream), at, value, CU_STREAM_WAIT_VALUE_GEQ),
           "cuStreamWaitValue32", gpu);
}
void write_value(int gpu, void* stream, CUdeviceptr at, cuuint32_t value) {
  // The default flags fence the stream's earlier writes (the copy) before this one.
  check_cu(stream_value_api().write(reinterpret_cast<CUstream>(stream), at, value, CU_STREAM_WRITE_VALUE_DEFAULT),
           "cuStreamWriteValue32", gpu);
}

// Whether the work before the event's latest record has finished: then a stream wait on it
// is one API call on the hand-off's critical path for nothing. The protocol makes the latest
// record the one the wait is for (stage_handoff.cpp); anything but success (not ready, or an
// error, which the stream wait then reports) means wait.
bool completed(cudaEvent_t e) { return cudaEventQuery(e) == cudaSuccess; }

class Target final : public IpcTarget {
 public:
  Target(int gpu, void* dst, std::size_t bytes, IpcSignal signal)
      : gpu_(gpu), dst_(dst), bytes_(bytes), signal_(signal) {
    if (!dst_) throw_error(ErrorCode::kInternal, "CUDA IPC hand-off: no destination buffer on GPU {}", gpu_);
    try {
      HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
      // The exported handle maps the whole allocation at the opener: `dst` must be its base,
      // or the sender would write at the wrong offset.
      cudaPointerAttributes attr{};
      HANDOFF_CUDA(gpu_, cudaPointerGetAttributes(&attr, dst_));
      if (attr.type != cudaMemoryTypeDevice)
        throw_error(ErrorCode::kInternal, "CUDA IPC hand-off: the destination is not device memory of GPU {}", gpu_);
      // Interprocess events must not time (cudaIpcGetEventHandle refuses timing events).
      HANDOFF_CUDA(gpu_, cudaEventCreateWithFlags(&filled_, cudaEventInterprocess | cudaEventDisableTiming));
      HANDOFF_CUDA(gpu_, cudaEventCreateWithFlags(&consumed_, cudaEventInterprocess | cudaEventDisableTiming));
      // Recorded once on the null stream so that a stray query sees a completed event (the
      // sender's first copy, put(n = 0), waits on nothing).
      HANDOFF_CUDA(gpu_, cudaEventRecord(consumed_, nullptr));
      HANDOFF_CUDA(gpu_, cudaEventCreateWithFlags(&passed_, cudaEventDisableTiming));
      HANDOFF_CUDA(gpu_, cudaMalloc(&words_, kSignalBytes));
      HANDOFF_CUDA(gpu_, cudaMemset(words_, 0, kSignalBytes));  // no hand-off filled or consumed yet
      HANDOFF_CUDA(gpu_, cudaDeviceSynchronize());
    } catch (...) {
      release();
      throw;
    }
  }
  ~Target() override { release(); }

  std::vector<std::byte> export_handles() const override {
    std::vector<std::byte> out(kIpcExportBytes);
    std::byte* p = out.data();
    for (void* mem : {dst_, words_}) {
      cudaIpcMemHandle_t mh;
      HANDOFF_CUDA(gpu_, cudaIpcGetMemHandle(&mh, mem));
      std::memcpy(p, &mh, kIpcHandleBytes);
      p += kIpcHandleBytes;
    }
    for (cudaEvent_t ev : {filled_, consumed_}) {
      cudaIpcEventHandle_t h;
      HANDOFF_CUDA(gpu_, cudaIpcGetEventHandle(&h, ev));
      std::memcpy(p, &h, kIpcHandleBytes);
      p += kIpcHandleBytes;
    }
    return out;
  }
  std::size_t bytes() const override { return bytes_; }

  void arrived(std::uint64_t n, void* stream) override {
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    if (signal_ == IpcSignal::kStreamValue) {
      wait_value(gpu_, stream, word(words_, kFilledAt), mark(n));
      waits_open_ = true;  // until a later consumed() covers it (see release())
      return;
    }
    if (!completed(filled_)) HANDOFF_CUDA(gpu_, cudaStreamWaitEvent(as_stream(stream), filled_, 0));
  }
  void consumed(std::uint64_t n, void* stream) override {
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    if (signal_ == IpcSignal::kStreamValue) {
      write_value(gpu_, stream, word(words_, kConsumedAt), mark(n));
      // Behind every wait on the filled word so far (the protocol marks a hand-off consumed on
      // the stream that waited for it); recorded here, off the hand-off's critical path.
      HANDOFF_CUDA(gpu_, cudaEventRecord(passed_, as_stream(stream)));
      waits_open_ = false;
      return;
    }
    HANDOFF_CUDA(gpu_, cudaEventRecord(consumed_, as_stream(stream)));
  }

 private:
  void release() noexcept {  // the destination belongs to the caller
    cudaSetDevice(gpu_);
    if (filled_) cudaEventDestroy(filled_);
    if (consumed_) cudaEventDestroy(consumed_);
    // cudaFree waits for the whole device. If a stream may still wait on the filled word (a
    // wait no consumed mark followed, or one not yet passed: a sender died between its ready
    // signal and its write), that wait may never end: then the 256 bytes are left to the
    // process's end rather than hanging the failing rank's exit. finish() always marks the
    // last hand-off consumed and synchronizes first.
    if (words_ && !waits_open_ && (!passed_ || cudaEventQuery(passed_) == cudaSuccess)) cudaFree(words_);
    if (passed_) cudaEventDestroy(passed_);
    filled_ = consumed_ = passed_ = nullptr;
    words_ = nullptr;
  }
  int gpu_;
  void* dst_;
  std::size_t bytes_;
  IpcSignal signal_;
  cudaEvent_t filled_ = nullptr, consumed_ = nullptr;
  cudaEvent_t passed_ = nullptr;  // recorded with each consumed mark, behind the waits before it
  bool waits_open_ = false;       // a wait on the filled word no consumed mark has followed yet
  void* words_ = nullptr;
};

class PeerTarget final : public IpcPeerTarget {
 public:
  PeerTarget(int gpu, std::span<const std::byte> handles, std::size_t bytes, IpcSignal signal)
      : gpu_(gpu), bytes_(bytes), signal_(signal) {
    if (handles.size() != kIpcExportBytes)
      throw_error(ErrorCode::kCorruptInput, "CUDA IPC handles: {} bytes, expected {}", handles.size(), kIpcExportBytes);
    try {
      HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
      const std::byte* p = handles.data();
      // Lazy peer access: the destination may live on another GPU of this host (NVLink or
      // PCIe peer-to-peer); on the same GPU nothing is enabled.
      for (void** mem : {&mem_, &words_}) {
        cudaIpcMemHandle_t mh;
        std::memcpy(&mh, p, kIpcHandleBytes);
        HANDOFF_CUDA(gpu_, cudaIpcOpenMemHandle(mem, mh, cudaIpcMemLazyEnablePeerAccess));
        p += kIpcHandleBytes;
      }
      for (cudaEvent_t* ev : {&filled_, &consumed_}) {
        cudaIpcEventHandle_t h;
        std::memcpy(&h, p, kIpcHandleBytes);
        HANDOFF_CUDA(gpu_, cudaIpcOpenEventHandle(ev, h));
        p += kIpcHandleBytes;
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~PeerTarget() override { release(); }

  void put(std::uint64_t n, const void* src, std::size_t bytes, void* stream) override {
    if (bytes > bytes_)
      throw_error(ErrorCode::kInternal, "CUDA IPC hand-off of {} bytes into a destination of {}", bytes, bytes_);
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    const bool values = signal_ == IpcSignal::kStreamValue;
    if (n > 0) {
      if (values) wait_value(gpu_, stream, word(words_, kConsumedAt), mark(n - 1));
      else if (!completed(consumed_)) HANDOFF_CUDA(gpu_, cudaStreamWaitEvent(as_stream(stream), consumed_, 0));
    }
    HANDOFF_CUDA(gpu_, cudaMemcpyAsync(mem_, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
    if (values) write_value(gpu_, stream, word(words_, kFilledAt), mark(n));
    else HANDOFF_CUDA(gpu_, cudaEventRecord(filled_, as_stream(stream)));
  }

 private:
  // Closed before the exporter lets go: the receiver destroys its events (and may free the
  // destination) only after the sender's end message, sent after this ran (stage_handoff.cpp).
  void release() noexcept {
    cudaSetDevice(gpu_);
    if (mem_) cudaIpcCloseMemHandle(mem_);
    if (words_) cudaIpcCloseMemHandle(words_);
    if (filled_) cudaEventDestroy(filled_);
    if (consumed_) cudaEventDestroy(consumed_);
    mem_ = words_ = nullptr;
    filled_ = consumed_ = nullptr;
  }
  int gpu_;
  std::size_t bytes_;
  IpcSignal signal_;
  void* mem_ = nullptr;
  void* words_ = nullptr;
  cudaEvent_t filled_ = nullptr, consumed_ = nullptr;
};

class Scratch final : public DeviceScratch {
 public:
  Scratch(int gpu, std::size_t bytes) : gpu_(gpu), bytes_(bytes) {
    try {
      HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
      HANDOFF_CUDA(gpu_, cudaMalloc(&mem_, std::max<std::size_t>(1, bytes_)));
      HANDOFF_CUDA(gpu_, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Scratch() override { release(); }
  void* data() const override { return mem_; }
  void* stream() const override { return stream_; }
  void upload(std::span<const std::byte> host) override {
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    HANDOFF_CUDA(gpu_, cudaMemcpy(mem_, host.data(), std::min(host.size(), bytes_), cudaMemcpyHostToDevice));
  }
  void download(std::span<std::byte> host) override {
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    HANDOFF_CUDA(gpu_, cudaStreamSynchronize(stream_));
    HANDOFF_CUDA(gpu_, cudaMemcpy(host.data(), mem_, std::min(host.size(), bytes_), cudaMemcpyDeviceToHost));
  }

 private:
  void release() noexcept {
    cudaSetDevice(gpu_);
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (mem_) cudaFree(mem_);
    stream_ = nullptr;
    mem_ = nullptr;
  }
  int gpu_;
  std::size_t bytes_;
  void* mem_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool cuda_ipc_compiled() { return true; }
std::string cuda_ipc_missing() { return {}; }

bool stream_values_usable(int gpu, std::string* why) {
  const auto& api = stream_value_api();
  if (!api.wait) {
    if (why) *why = api.missing;
    return false;
  }
  // A device may still refuse them (CUDA_ERROR_NOT_SUPPORTED): one write and one satisfied
  // wait on a scratch word, once per GPU and process.
  static std::mutex mu;
  static std::vector<std::pair<int, std::string>> probed;  // gpu, why not ("" = usable)
  std::lock_guard lock(mu);
  for (const auto& [g, w] : probed)
    if (g == gpu) {
      if (why) *why = w;
      return w.empty();
    }
  std::string failure;
  Scratch word_mem(gpu, sizeof(cuuint32_t));
  try {
    write_value(gpu, word_mem.stream(), word(word_mem.data(), 0), 1);
    wait_value(gpu, word_mem.stream(), word(word_mem.data(), 0), 1);
    sync_stream(gpu, word_mem.stream());
  } catch (const std::exception& e) {
    failure = std::string("stream memory operations refused: ") + e.what();
  }
  probed.emplace_back(gpu, failure);
  if (why) *why = failure;
  return failure.empty();
}

std::unique_ptr<IpcTarget> make_ipc_target(int gpu, void* dst, std::size_t bytes, IpcSignal signal) {
  return std::make_unique<Target>(gpu, dst, bytes, signal);
}

std::unique_ptr<IpcPeerTarget> open_ipc_target(int gpu, std::span<const std::byte> handles, std::size_t bytes,
                                               IpcSignal signal) {
  return std::make_unique<PeerTarget>(gpu, handles, bytes, signal);
}

void sync_stream(int gpu, void* stream) {
  HANDOFF_CUDA(gpu, cudaSetDevice(gpu));
  HANDOFF_CUDA(gpu, cudaStreamSynchronize(as_stream(stream)));
}

std::unique_ptr<DeviceScratch> make_device_scratch(int gpu, std::size_t bytes) {
  return std::make_unique<Scratch>(gpu, bytes);
}

CopyTimes time_device_copies(int gpu, std::size_t bytes, int iters, int warmup) {
  Scratch a(gpu, bytes), b(gpu, bytes);
  void* pinned = nullptr;
  HANDOFF_CUDA(gpu, cudaMallocHost(&pinned, std::max<std::size_t>(1, bytes)));
  std::vector<double> d2d, via_host;
  try {
    auto s = as_stream(a.stream());
    for (int it = -warmup; it < iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      HANDOFF_CUDA(gpu, cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
      HANDOFF_CUDA(gpu, cudaStreamSynchronize(s));
      const double t_d2d = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      HANDOFF_CUDA(gpu, cudaMemcpyAsync(pinned, a.data(), bytes, cudaMemcpyDeviceToHost, s));
      HANDOFF_CUDA(gpu, cudaStreamSynchronize(s));
      HANDOFF_CUDA(gpu, cudaMemcpyAsync(b.data(), pinned, bytes, cudaMemcpyHostToDevice, s));
      HANDOFF_CUDA(gpu, cudaStreamSynchronize(s));
      const double t_host = seconds_since(t0);
      if (it >= 0) {
        d2d.push_back(t_d2d);
        via_host.push_back(t_host);
      }
    }
  } catch (...) {
    cudaFreeHost(pinned);
    throw;
  }
  cudaFreeHost(pinned);
  return {median(d2d), median(via_host)};
}

}  // namespace trellis::runtime::detail
