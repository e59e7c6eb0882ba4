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

class Slots final : public IpcSlots {
 public:
  Slots(int gpu, std::size_t bytes) : gpu_(gpu), bytes_(bytes) {
    try {
      HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
      for (int i = 0; i < kIpcSlots; ++i) {
        HANDOFF_CUDA(gpu_, cudaMalloc(&mem_[i], bytes_));
        // Interprocess events must not time (cudaIpcGetEventHandle refuses timing events).
        HANDOFF_CUDA(gpu_, cudaEventCreateWithFlags(&filled_[i], cudaEventInterprocess | cudaEventDisableTiming));
        HANDOFF_CUDA(gpu_, cudaEventCreateWithFlags(&consumed_[i], cudaEventInterprocess | cudaEventDisableTiming));
        // Recorded once on the null stream so that the sender's first wait on it (never
        // before a credit, see stage_handoff.cpp) and a stray query see a completed event.
        HANDOFF_CUDA(gpu_, cudaEventRecord(consumed_[i], nullptr));
      }
      HANDOFF_CUDA(gpu_, cudaDeviceSynchronize());
    } catch (...) {
      release();
      throw;
    }
  }
  ~Slots() override { release(); }

  std::vector<std::byte> export_handles() const override {
    std::vector<std::byte> out(kIpcExportBytes);
    std::byte* p = out.data();
    for (int i = 0; i < kIpcSlots; ++i, p += kIpcHandleBytes) {
      cudaIpcMemHandle_t h;
      HANDOFF_CUDA(gpu_, cudaIpcGetMemHandle(&h, mem_[i]));
      std::memcpy(p, &h, kIpcHandleBytes);
    }
    for (cudaEvent_t const* evs : {filled_, consumed_})
      for (int i = 0; i < kIpcSlots; ++i, p += kIpcHandleBytes) {
        cudaIpcEventHandle_t h;
        HANDOFF_CUDA(gpu_, cudaIpcGetEventHandle(&h, evs[i]));
        std::memcpy(p, &h, kIpcHandleBytes);
      }
    return out;
  }
  std::size_t slot_bytes() const override { return bytes_; }

  void take(int slot, void* dst, std::size_t bytes, void* stream) override {
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    HANDOFF_CUDA(gpu_, cudaStreamWaitEvent(as_stream(stream), filled_[slot], 0));
    HANDOFF_CUDA(gpu_, cudaMemcpyAsync(dst, mem_[slot], bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
    HANDOFF_CUDA(gpu_, cudaEventRecord(consumed_[slot], as_stream(stream)));
  }

 private:
  void release() noexcept {
    cudaSetDevice(gpu_);
    for (int i = 0; i < kIpcSlots; ++i) {
      if (filled_[i]) cudaEventDestroy(filled_[i]);
      if (consumed_[i]) cudaEventDestroy(consumed_[i]);
      if (mem_[i]) cudaFree(mem_[i]);
      filled_[i] = consumed_[i] = nullptr;
      mem_[i] = nullptr;
    }
  }
  int gpu_;
  std::size_t bytes_;
  void* mem_[kIpcSlots] = {};
  cudaEvent_t filled_[kIpcSlots] = {};
  cudaEvent_t consumed_[kIpcSlots] = {};
};

class PeerSlots final : public IpcPeerSlots {
 public:
  PeerSlots(int gpu, std::span<const std::byte> handles, std::size_t bytes) : gpu_(gpu), bytes_(bytes) {
    if (handles.size() != kIpcExportBytes)
      throw_error(ErrorCode::kCorruptInput, "CUDA IPC handles: {} bytes, expected {}", handles.size(), kIpcExportBytes);
    try {
      HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
      const std::byte* p = handles.data();
      for (int i = 0; i < kIpcSlots; ++i, p += kIpcHandleBytes) {
        cudaIpcMemHandle_t h;
        std::memcpy(&h, p, kIpcHandleBytes);
        // Lazy peer access: the slots may live on another GPU of this host (NVLink or PCIe
        // peer-to-peer); on the same GPU nothing is enabled.
        HANDOFF_CUDA(gpu_, cudaIpcOpenMemHandle(&mem_[i], h, cudaIpcMemLazyEnablePeerAccess));
      }
      for (cudaEvent_t* evs : {filled_, consumed_})
        for (int i = 0; i < kIpcSlots; ++i, p += kIpcHandleBytes) {
          cudaIpcEventHandle_t h;
          std::memcpy(&h, p, kIpcHandleBytes);
          HANDOFF_CUDA(gpu_, cudaIpcOpenEventHandle(&evs[i], h));
        }
    } catch (...) {
      release();
      throw;
    }
  }
  ~PeerSlots() override { release(); }

  void put(int slot, bool reused, const void* src, std::size_t bytes, void* stream) override {
    if (bytes > bytes_)
      throw_error(ErrorCode::kInternal, "CUDA IPC hand-off of {} bytes into a slot of {}", bytes, bytes_);
    HANDOFF_CUDA(gpu_, cudaSetDevice(gpu_));
    if (reused) HANDOFF_CUDA(gpu_, cudaStreamWaitEvent(as_stream(stream), consumed_[slot], 0));
    HANDOFF_CUDA(gpu_, cudaMemcpyAsync(mem_[slot], src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
    HANDOFF_CUDA(gpu_, cudaEventRecord(filled_[slot], as_stream(stream)));
  }

 private:
  // Closed before the exporter frees: the receiver frees its slots only after the sender's
  // end message, which the sender sends after this ran (stage_handoff.cpp).
  void release() noexcept {
    cudaSetDevice(gpu_);
    for (int i = 0; i < kIpcSlots; ++i) {
      if (mem_[i]) cudaIpcCloseMemHandle(mem_[i]);
      if (filled_[i]) cudaEventDestroy(filled_[i]);
      if (consumed_[i]) cudaEventDestroy(consumed_[i]);
      mem_[i] = nullptr;
      filled_[i] = consumed_[i] = nullptr;
    }
  }
  int gpu_;
  std::size_t bytes_;
  void* mem_[kIpcSlots] = {};
  cudaEvent_t filled_[kIpcSlots] = {};
  cudaEvent_t consumed_[kIpcSlots] = {};
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

std::unique_ptr<IpcSlots> make_ipc_slots(int gpu, std::size_t slot_bytes) {
  return std::make_unique<Slots>(gpu, slot_bytes);
}

std::unique_ptr<IpcPeerSlots> open_ipc_slots(int gpu, std::span<const std::byte> handles, std::size_t slot_bytes) {
  return std::make_unique<PeerSlots>(gpu, handles, slot_bytes);
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
