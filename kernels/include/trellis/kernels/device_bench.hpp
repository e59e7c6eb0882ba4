// GPU measurements behind `trellis bench kernels --device cuda`: time on the device (CUDA
// events on the context's stream, so host launch gaps are not counted), the card's own
// memory ceilings measured in the same run (a device-to-device copy and a read-only stream),
// and cuBLASLt called directly with nothing around it, as the peer our matmul is held to.
// Every function needs a CUDA context; in a build without the CUDA backend, or on a CPU
// context, they throw kUnsupported saying why.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "trellis/kernels/context.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

// Elapsed device time between start() and stop() on `ctx`'s stream. Not thread-safe; the
// context must outlive it.
class DeviceTimer {
 public:
  explicit DeviceTimer(const Context& ctx);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  void start();
  // Seconds of device time since start(); waits for the stream to reach this point.
  double stop();

 private:
  const Context& ctx_;
  void* begin_ = nullptr;  // cudaEvent_t
  void* end_ = nullptr;
};

struct DeviceBandwidth {
  std::size_t bytes = 0;  // buffer size
  int reps = 0;
  // Device-to-device copy of `bytes`, counting bytes read plus bytes written.
  double copy_median_bytes_per_s = 0, copy_best_bytes_per_s = 0;
  // A read-only pass over `bytes` with 16-byte loads (the ceiling a weight-streaming GEMV
  // faces); its XOR of every word is checked against the value the fill pattern predicts,
  // so the reads cannot be dropped (a mismatch throws kInternal).
  double read_median_bytes_per_s = 0, read_best_bytes_per_s = 0;
};

// Both ceilings on `ctx`'s GPU with buffers of `bytes` (rounded down to 64 bytes; at least
// 64 MiB, reps >= 1, else kInvalidArgument). Allocates two buffers of `bytes` for the copy.
DeviceBandwidth measure_device_bandwidth(const Context& ctx, std::size_t bytes = std::size_t{1} << 30, int reps = 20);

// Median device seconds per run of `body` when it is recorded once as a plain CUDA graph and
// the graph is launched `launches` times back to back, over `reps` samples: what an op gets
// in a decode step replayed as a graph, where the host's launch cost is off the GPU's path
// (timing eager launches of a 2 us kernel measures the host's launch rate instead). body runs
// once eagerly first (scratch, cuBLASLt plans), then under stream capture: it may enqueue
// device work only (no host copies or uploads), else the capture fails with the CUDA error.
double time_graph_launches(const Context& ctx, const std::function<void()>& body, int launches = 20, int reps = 5);

// y[M,N] (f32) = x[M,K] w[N,K]^T through one cublasLtMatmul per run(), x and w of one type
// (f32, bf16 or f16; f32 computes in full f32), with the descriptors, workspace and the
// heuristic's first algorithm that our matmul would use for these operands, made once here:
// the gap between the two is what our matmul does around cuBLASLt. Views must be dense device
// matrices on ctx's GPU; they must outlive the object.
class DirectGemm {
 public:
  DirectGemm(const Context& ctx, const TensorView& x, const TensorView& w, const TensorView& y);
  ~DirectGemm();
  DirectGemm(const DirectGemm&) = delete;
  DirectGemm& operator=(const DirectGemm&) = delete;
  void run();  // enqueues one product on ctx's stream

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::kernels
