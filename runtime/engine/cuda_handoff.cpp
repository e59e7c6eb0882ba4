// The CUDA side of the device stage hand-off (cuda_handoff.hpp), compiled in CUDA builds
// only (runtime/CMakeLists.txt); cuda_handoff_none.cpp stands in elsewhere.
#include "cuda_handoff.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>

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

// Whether the work before the event's latest record has finished: then a stream wait on it
// is one API call on the hand-off's critical path for nothing. The protocol makes the latest
// record the one the wait is for (stage_handoff.cpp); anything but success (not ready, or an
// error, which the stream wait then reports) means wait.
bool completed(cudaEvent_t e) { return cudaEventQuery(e) == cudaSuccess; }

class Target final : public IpcTarget {
 public:
  Target(int gpu, void* dst, std::size_t bytes) : gpu_(gpu), dst_(dst), bytes_(bytes) {
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
      // sender's first copy waits on nothing: put(first = true)).
      HANDOFF_CUDA(gpu_, cudaEventRecord(consumed_, nullptr));
      HANDOFF_CUDA(gpu_, cudaDeviceSynchronize());
    } catch (...) {
      release();
      throw;
    }
  }
  ~Target() override { release(); }

  std::vector<std::byte> export_handles() const override {
    std::vector<std::byte> out(kIpcExportBytes);
    cudaIpcMemHandle_t mh;
    HANDOFF_CUDA(gpu_, cudaIpcGetMemHandle(&mh, dst_));
    std::memcpy(out.data(), &mh, kIpcHandleBytes);
    std::byte* p = out.data() + kIpcHandleBytes;
    for (cudaEvent_t ev : {filled_, consumed_}) {
      cudaIpcEventHandle_t h;
      HANDOFF_CUDA(gpu_, cudaIpcGetEventHandle(&h, ev));
      std::memcpy(p, &h, kIpcHandleBytes);
      p += kIpcHandleBytes;
    }
    return out;
  }
  std::size_t bytes() const override { return bytes_; }

  void arrived(void* stream) override {
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    if (!completed(filled_)) HANDOFF_CUDA(gpu_, cudaStreamWaitEvent(as_stream(stream), filled_, 0));
  }
  void consumed(void* stream) override {
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    HANDOFF_CUDA(gpu_, cudaEventRecord(consumed_, as_stream(stream)));
  }

 private:
  void release() noexcept {  // the destination belongs to the caller
    cudaSetDevice(gpu_);
    if (filled_) cudaEventDestroy(filled_);
    if (consumed_) cudaEventDestroy(consumed_);
    filled_ = consumed_ = nullptr;
  }
  int gpu_;
  void* dst_;
  std::size_t bytes_;
  cudaEvent_t filled_ = nullptr, consumed_ = nullptr;
};

class PeerTarget final : public IpcPeerTarget {
 public:
  PeerTarget(int gpu, std::span<const std::byte> handles, std::size_t bytes) : gpu_(gpu), bytes_(bytes) {
    if (handles.size() != kIpcExportBytes)
      throw_error(ErrorCode::kCorruptInput, "CUDA IPC handles: {} bytes, expected {}", handles.size(), kIpcExportBytes);
    try {
      HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
      cudaIpcMemHandle_t mh;
      std::memcpy(&mh, handles.data(), kIpcHandleBytes);
      // Lazy peer access: the destination may live on another GPU of this host (NVLink or
      // PCIe peer-to-peer); on the same GPU nothing is enabled.
      HANDOFF_CUDA(gpu_, cudaIpcOpenMemHandle(&mem_, mh, cudaIpcMemLazyEnablePeerAccess));
      const std::byte* p = handles.data() + kIpcHandleBytes;
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

  void put(bool first, const void* src, std::size_t bytes, void* stream) override {
    if (bytes > bytes_)
      throw_error(ErrorCode::kInternal, "CUDA IPC hand-off of {} bytes into a destination of {}", bytes, bytes_);
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    if (!first && !completed(consumed_)) HANDOFF_CUDA(gpu_, cudaStreamWaitEvent(as_stream(stream), consumed_, 0));
    HANDOFF_CUDA(gpu_, cudaMemcpyAsync(mem_, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
    HANDOFF_CUDA(gpu_, cudaEventRecord(filled_, as_stream(stream)));
  }

 private:
  // Closed before the exporter lets go: the receiver destroys its events (and may free the
  // destination) only after the sender's end message, sent after this ran (stage_handoff.cpp).
  void release() noexcept {
    cudaSetDevice(gpu_);
    if (mem_) cudaIpcCloseMemHandle(mem_);
    if (filled_) cudaEventDestroy(filled_);
    if (consumed_) cudaEventDestroy(consumed_);
    mem_ = nullptr;
    filled_ = consumed_ = nullptr;
  }
  int gpu_;
  std::size_t bytes_;
  void* mem_ = nullptr;
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

std::unique_ptr<IpcTarget> make_ipc_target(int gpu, void* dst, std::size_t bytes) {
  return std::make_unique<Target>(gpu, dst, bytes);
}

std::unique_ptr<IpcPeerTarget> open_ipc_target(int gpu, std::span<const std::byte> handles, std::size_t bytes) {
  return std::make_unique<PeerTarget>(gpu, handles, bytes);
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
