// The CUDA side of async_copy.hpp: pinned buffers (cudaHostAlloc), one non-blocking copy
// stream per Download, an event per slot for "ready to copy" and one for "copied".
#include <vector>

#include "cuda/state.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/async_copy.hpp"

namespace trellis::kernels {

struct Download::Impl {
  CudaState* s = nullptr;
  cudaStream_t copy = nullptr;
  struct Slot {
    void* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t ready = nullptr, done = nullptr;
    bool pending = false;
  };
  std::vector<Slot> slots;
  ~Impl() {
    if (copy) cudaStreamSynchronize(copy);
    for (Slot& sl : slots) {
      if (sl.host) cudaFreeHost(sl.host);
      if (sl.ready) cudaEventDestroy(sl.ready);
      if (sl.done) cudaEventDestroy(sl.done);
    }
    if (copy) cudaStreamDestroy(copy);
  }
};

Download::Download(const Context& ctx, int slots) : impl_(std::make_unique<Impl>()) {
  if (ctx.device() != Device::kCuda)
    throw_error(ErrorCode::kUnsupported, "Download: needs a CUDA context (this one is on the CPU)");
  if (slots < 1 || slots > 16) throw_error(ErrorCode::kInvalidArgument, "Download: slots must be in 1..16, got {}", slots);
  Impl& d = *impl_;
  d.s = &ctx.cuda_state();
  const int g = d.s->gpu;
  TRELLIS_CUDA_CHECK(g, cudaSetDevice(g));
  TRELLIS_CUDA_CHECK(g, cudaStreamCreateWithFlags(&d.copy, cudaStreamNonBlocking));
  d.slots.resize(static_cast<std::size_t>(slots));
  for (auto& sl : d.slots) {
    TRELLIS_CUDA_CHECK(g, cudaEventCreateWithFlags(&sl.ready, cudaEventDisableTiming));
    TRELLIS_CUDA_CHECK(g, cudaEventCreateWithFlags(&sl.done, cudaEventDisableTiming));
  }
}

Download::~Download() = default;

int Download::slots() const { return static_cast<int>(impl_->slots.size()); }

void Download::start(int slot, const TensorView& src) {
  Impl& d = *impl_;
  const int g = d.s->gpu;
  if (slot < 0 || slot >= slots()) throw_error(ErrorCode::kInvalidArgument, "Download: slot {} of {}", slot, slots());
  if (src.device != Device::kCuda || !src.is_contiguous())
    throw_error(ErrorCode::kInvalidArgument, "Download: the source must be a dense device view, got {}", src.describe());
  Impl::Slot& sl = d.slots[static_cast<std::size_t>(slot)];
  const std::size_t bytes = dtype_bytes(src.dtype, src.numel());
  if (sl.pending) TRELLIS_CUDA_CHECK(g, cudaEventSynchronize(sl.done));  // the buffer is still being written
  sl.pending = false;
  if (bytes > sl.bytes) {
    if (sl.host) TRELLIS_CUDA_CHECK(g, cudaFreeHost(sl.host));
    sl.host = nullptr;
    sl.bytes = 0;
    TRELLIS_CUDA_CHECK(g, cudaHostAlloc(&sl.host, bytes, cudaHostAllocDefault));
    sl.bytes = bytes;
  }
  TRELLIS_CUDA_CHECK(g, cudaEventRecord(sl.ready, d.s->stream));
  TRELLIS_CUDA_CHECK(g, cudaStreamWaitEvent(d.copy, sl.ready, 0));
  TRELLIS_CUDA_CHECK(g, cudaMemcpyAsync(sl.host, src.data, bytes, cudaMemcpyDeviceToHost, d.copy));
  TRELLIS_CUDA_CHECK(g, cudaEventRecord(sl.done, d.copy));
  sl.pending = true;
}

const void* Download::wait(int slot) {
  Impl& d = *impl_;
  if (slot < 0 || slot >= slots()) throw_error(ErrorCode::kInvalidArgument, "Download: slot {} of {}", slot, slots());
  Impl::Slot& sl = d.slots[static_cast<std::size_t>(slot)];
  if (!sl.pending) throw_error(ErrorCode::kInvalidArgument, "Download: wait on slot {} with no copy started", slot);
  TRELLIS_CUDA_CHECK(d.s->gpu, cudaEventSynchronize(sl.done));
  sl.pending = false;
  return sl.host;
}

}  // namespace trellis::kernels
