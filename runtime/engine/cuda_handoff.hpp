// Internal to runtime/engine: the CUDA side of the device stage hand-off (stage_handoff.hpp
// says what it is for). The protocol over the host link is in stage_handoff.cpp, which knows
// no CUDA types; these primitives are implemented in cuda_handoff.cpp (CUDA builds) or
// refused by cuda_handoff_none.cpp ("built without CUDA"). Streams are cudaStream_t passed
// as void*; every call first makes the object's GPU current (the caller's thread may have
// another). Errors throw trellis::Error naming the CUDA call, its error and the GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace trellis::runtime::detail {

// cudaIpcMemHandle_t and cudaIpcEventHandle_t are 64-byte opaque blobs (CUDA_IPC_HANDLE_SIZE).
inline constexpr std::size_t kIpcHandleBytes = 64;
// The exported set: the destination's memory handle, the signal words' memory handle, then
// the "filled" and "consumed" events. Both signals' objects are always exported, so the
// message has one layout; the set-up header says which signal the pair uses.
inline constexpr std::size_t kIpcExportBytes = kIpcHandleBytes * 4;

bool cuda_ipc_compiled();
std::string cuda_ipc_missing();  // why not, when not compiled

// How the GPU work of the two sides is ordered (comm.handoff_signal):
//  * kEvent: interprocess CUDA events: the sender records "filled" after its copy and the
//    receiver's stream waits on it; the receiver records "consumed" and the sender's next copy
//    waits on it.
//  * kStreamValue: two 32-bit words in the receiver's device memory written and waited on by
//    the streams themselves (cuStreamWriteValue32 / cuStreamWaitValue32, the driver's stream
//    memory operations): the sender's stream writes "filled = n + 1" behind its copy of
//    hand-off n, the receiver's stream waits for filled >= n + 1 (a cyclic comparison, so the
//    counters may wrap); the receiver's stream writes "consumed = n + 1" behind its last use
//    and the sender's copy of n + 1 waits for consumed >= n + 1. No event API on the path.
enum class IpcSignal { kEvent = 1, kStreamValue = 2 };
const char* to_string(IpcSignal s);
// Whether this process can use kStreamValue on `gpu` (the driver's entry points are found and
// the device supports stream memory operations); `why` says what is missing.
bool stream_values_usable(int gpu, std::string* why);

// The receiver's side: exports its own destination buffer (the device memory its forward
// reads the hidden state from, so the sender's copy is the only one) and owns two
// interprocess events. `dst` must be the base of a cudaMalloc allocation of at least `bytes`
// that outlives this object and stays where it is.
class IpcTarget {
 public:
  virtual ~IpcTarget() = default;  // destroys the events: only after the opener closed them
  virtual std::vector<std::byte> export_handles() const = 0;  // kIpcExportBytes
  virtual std::size_t bytes() const = 0;
  // On `stream`: wait for the sender's copy of hand-off `n` (0-based): the "filled" event it
  // recorded before its ready signal, or the filled word reaching n + 1.
  virtual void arrived(std::uint64_t n, void* stream) = 0;
  // On `stream`: mark hand-off `n` consumed ("consumed" event or word) behind everything
  // enqueued so far that reads or writes the destination (the sender's next copy waits for it).
  virtual void consumed(std::uint64_t n, void* stream) = 0;
};
std::unique_ptr<IpcTarget> make_ipc_target(int gpu, void* dst, std::size_t bytes, IpcSignal signal);

// The sender's side: the peer's destination and events, opened from their handles; closed
// (the memory handle with cudaIpcCloseMemHandle, the events destroyed) when destroyed.
class IpcPeerTarget {
 public:
  virtual ~IpcPeerTarget() = default;
  // On `stream`, for hand-off `n` (0-based): unless it is the first, wait until hand-off
  // n - 1 is consumed (the event the receiver recorded before the credit the caller waited
  // for, or the consumed word reaching n); copy `bytes` from `src` into the destination; mark
  // it filled.
  virtual void put(std::uint64_t n, const void* src, std::size_t bytes, void* stream) = 0;
};
std::unique_ptr<IpcPeerTarget> open_ipc_target(int gpu, std::span<const std::byte> handles, std::size_t bytes,
                                               IpcSignal signal);

// Waits (host) until everything enqueued on `stream` so far has finished.
void sync_stream(int gpu, void* stream);

// The device side as the protocol in stage_handoff.cpp calls it: the three functions above
// (CUDA's, or the refusals of a build without CUDA). A test may point them elsewhere to run
// the protocol (credits, ready signals, their order) without a GPU, and must restore them;
// nothing else changes them.
struct IpcDevice {
  std::unique_ptr<IpcTarget> (*make_target)(int gpu, void* dst, std::size_t bytes, IpcSignal signal) =
      make_ipc_target;
  std::unique_ptr<IpcPeerTarget> (*open_target)(int gpu, std::span<const std::byte> handles, std::size_t bytes,
                                                IpcSignal signal) = open_ipc_target;
  void (*sync)(int gpu, void* stream) = sync_stream;
  bool (*stream_values)(int gpu, std::string* why) = stream_values_usable;
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
