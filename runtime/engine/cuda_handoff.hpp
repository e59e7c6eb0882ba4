// Internal to runtime/engine: the CUDA side of the device stage hand-off (stage_handoff.hpp
// says what it is for). The protocol over the host link is in stage_handoff.cpp, which knows
// no CUDA types; these primitives are implemented in cuda_handoff.cpp (CUDA builds) or
// refused by cuda_handoff_none.cpp ("built without CUDA"). Streams are cudaStream_t passed
// as void*; every call first makes the object's GPU current (the caller's thread may have
// another). Errors throw trellis::Error naming the CUDA call, its error and the GPU.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace trellis::runtime::detail {

// cudaIpcMemHandle_t and cudaIpcEventHandle_t are 64-byte opaque blobs (CUDA_IPC_HANDLE_SIZE).
inline constexpr std::size_t kIpcHandleBytes = 64;
// The exported set: the destination's memory handle, then the "filled" and "consumed" events.
inline constexpr std::size_t kIpcExportBytes = kIpcHandleBytes * 3;

bool cuda_ipc_compiled();
std::string cuda_ipc_missing();  // why not, when not compiled

// The receiver's side: exports its own destination buffer (the device memory its forward
// reads the hidden state from, so the sender's copy is the only one) and owns two
// interprocess events. `dst` must be the base of a cudaMalloc allocation of at least `bytes`
// that outlives this object and stays where it is.
class IpcTarget {
 public:
  virtual ~IpcTarget() = default;  // destroys the events: only after the opener closed them
  virtual std::vector<std::byte> export_handles() const = 0;  // kIpcExportBytes
  virtual std::size_t bytes() const = 0;
  // On `stream`: wait for the "filled" event the sender recorded before its ready signal.
  virtual void arrived(void* stream) = 0;
  // On `stream`: record "consumed" behind everything enqueued so far that reads or writes the
  // destination (the sender's next copy waits for it).
  virtual void consumed(void* stream) = 0;
};
std::unique_ptr<IpcTarget> make_ipc_target(int gpu, void* dst, std::size_t bytes);

// The sender's side: the peer's destination and events, opened from their handles; closed
// (the memory handle with cudaIpcCloseMemHandle, the events destroyed) when destroyed.
class IpcPeerTarget {
 public:
  virtual ~IpcPeerTarget() = default;
  // On `stream`: unless `first`, wait for the "consumed" event (the receiver recorded it
  // before the credit the caller waited for); copy `bytes` from `src` into the destination;
  // record "filled".
  virtual void put(bool first, const void* src, std::size_t bytes, void* stream) = 0;
};
std::unique_ptr<IpcPeerTarget> open_ipc_target(int gpu, std::span<const std::byte> handles, std::size_t bytes);

// Waits (host) until everything enqueued on `stream` so far has finished.
void sync_stream(int gpu, void* stream);

// The device side as the protocol in stage_handoff.cpp calls it: the three functions above
// (CUDA's, or the refusals of a build without CUDA). A test may point them elsewhere to run
// the protocol (credits, ready signals, their order) without a GPU, and must restore them;
// nothing else changes them.
struct IpcDevice {
  std::unique_ptr<IpcTarget> (*make_target)(int gpu, void* dst, std::size_t bytes) = make_ipc_target;
  std::unique_ptr<IpcPeerTarget> (*open_target)(int gpu, std::span<const std::byte> handles,
                                                std::size_t bytes) = open_ipc_target;
  void (*sync)(int gpu, void* stream) = sync_stream;
};
IpcDevice& ipc_device();

// For `trellis bench handoff`: a device buffer with its own stream.
class DeviceScratch {
 public:
  virtual ~DeviceScratch() = default;
  virtual void* data() const = 0;
  virtual void* stream() const = 0;
  virtual void upload(std::span<const std::byte> host) = 0;  // synchronous
  virtual void download(std::span<std::byte> host) = 0;      // synchronous
};
std::unique_ptr<DeviceScratch> make_device_scratch(int gpu, std::size_t bytes);
// Medians over `iters` timed copies of `bytes` in this process: a device -> device
// cudaMemcpyAsync + synchronize, and the host path's device -> host -> device (pinned).
struct CopyTimes {
  double d2d_s = 0, via_host_s = 0;
};
CopyTimes time_device_copies(int gpu, std::size_t bytes, int iters, int warmup);

}  // namespace trellis::runtime::detail
