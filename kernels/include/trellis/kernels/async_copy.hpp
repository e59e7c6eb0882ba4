// Device -> host copies that overlap later GPU work (SiPipe §5.1): the last stage's logits go
// to pinned host memory on a second stream while the compute stream already runs the next
// microbatch, and the host waits for them only when it needs them.
//
// A Download owns `slots` pinned host buffers, a copy stream and an event per slot. start()
// orders the copy after everything enqueued on the context's stream so far (an event the
// copy stream waits on) and returns at once; wait() blocks until that slot's copy is done and
// returns its bytes, valid until the next start() on the slot. The source must stay unchanged
// until wait() returns: the caller gives each in-flight slot its own device buffer.
//
// CUDA contexts only: the constructor throws kUnsupported on a CPU context or in a build
// without the CUDA backend; every CUDA error names the call and the GPU.
#pragma once

#include <cstddef>
#include <memory>

#include "trellis/kernels/context.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

class Download {
 public:
  Download(const Context& ctx, int slots = 2);
  ~Download();
  Download(const Download&) = delete;
  Download& operator=(const Download&) = delete;

  int slots() const;
  // Enqueues src (a dense device view on ctx's GPU) -> slot's pinned buffer (grown to fit,
  // which waits for the slot's previous copy first). Throws kInvalidArgument for a bad slot,
  // a host or strided view.
  void start(int slot, const TensorView& src);
  // Waits for the slot's copy (kInvalidArgument if none was started since the last wait) and
  // returns the pinned bytes.
  const void* wait(int slot);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::kernels
