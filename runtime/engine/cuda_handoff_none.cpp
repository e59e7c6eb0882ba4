// The device stage hand-off in a build without CUDA (cuda_handoff.hpp): every entry refuses
// with the reason, so comm.stage_handoff=cuda-ipc and `trellis bench handoff` say it.
#include "cuda_handoff.hpp"

#include "trellis/core/error.hpp"

#ifndef TRELLIS_CUDA_HANDOFF_WHY
#define TRELLIS_CUDA_HANDOFF_WHY "no CUDA toolkit at configure time"
#endif

namespace trellis::runtime::detail {
namespace {

[[noreturn]] void refuse(const char* what) {
  throw_error(ErrorCode::kUnsupported, "{}: built without CUDA ({})", what, TRELLIS_CUDA_HANDOFF_WHY);
}

}  // namespace

bool cuda_ipc_compiled() { return false; }
std::string cuda_ipc_missing() { return std::string("built without CUDA (") + TRELLIS_CUDA_HANDOFF_WHY + ")"; }

bool stream_values_usable(int, std::string* why) {
  if (why) *why = cuda_ipc_missing();
  return false;
}
std::unique_ptr<IpcTarget> make_ipc_target(int, void*, std::size_t, IpcSignal) {
  refuse("CUDA IPC hand-off target");
}
std::unique_ptr<IpcPeerTarget> open_ipc_target(int, std::span<const std::byte>, std::size_t, IpcSignal) {
  refuse("CUDA IPC hand-off target");
}
void sync_stream(int, void*) { refuse("CUDA stream synchronize"); }
std::unique_ptr<DeviceScratch> make_device_scratch(int, std::size_t) { refuse("CUDA device buffer"); }
CopyTimes time_device_copies(int, std::size_t, int, int) { refuse("CUDA copies"); }

}  // namespace trellis::runtime::detail
