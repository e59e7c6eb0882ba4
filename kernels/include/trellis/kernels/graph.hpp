// CUDA graphs of a sequence of ops (SiPipe §5.2; issue 18.3): a decode step is hundreds of
// small launches, and on an H200 a 1B model's step spent 92 us of host time per layer
// launching them while the GPU waited. An OpGraph records what a piece of host code (the
// "body": ops on one CUDA context) enqueues, once, and then replays it as one launch.
//
// The body's host inputs (token ids, positions, KV-cache descriptors: what ops upload) are
// staged in the graph's own pinned arena; the graph's copy nodes read them from there. To
// replay, the body's host code runs again in "filling" mode: each op validates its arguments
// and stages its inputs at the same place in the arena but launches nothing; then the graph
// is launched. So a replay computes exactly what running the body eagerly would, provided the
// body makes the same ops on the same device buffers (same shapes, same addresses); only the
// uploaded values may change. What the ops read from device memory (weights, the KV cache,
// activations) is read at replay time, as eager execution would.
//
// While recording or filling, ops size attention's key splits by the KV cache's capacity,
// not the current lengths (which change every step; the kernels skip empty splits), and a
// copy to or from host memory is refused. The context's scratch must not move between
// capture and replay: replay() returns false without launching when it did (scratch grew for
// a larger batch) and the caller captures again. Two OpGraphs over the same body, used in
// turn, let the host fill one while the GPU still runs the other (each has its own arena).
//
// CUDA contexts only (kUnsupported otherwise, or without the backend). Not thread-safe; the
// context must outlive it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "trellis/kernels/context.hpp"

namespace trellis::kernels {

class OpGraph {
 public:
  explicit OpGraph(const Context& ctx);
  ~OpGraph();
  OpGraph(const OpGraph&) = delete;
  OpGraph& operator=(const OpGraph&) = delete;

  // Records body into a graph and launches it (this call's step is computed by the launch).
  // Runs the body's host side twice: once to size the arena and the scratch (launching
  // nothing), once under stream capture. Replaces an earlier capture.
  void capture(const std::function<void()>& body);
  // Fills the arena through body's host side and launches the graph; false (nothing
  // launched, nothing to undo) when there is no capture, the context's scratch moved since,
  // or `still_valid` (asked after the fill: the caller's own buffers, say) says false.
  // Throws kInternal when body staged a different amount of input than at capture.
  bool replay(const std::function<void()>& body, const std::function<bool()>& still_valid = {});
  bool captured() const;
  // Bytes of host input the captured body stages per replay.
  std::size_t staged_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::kernels
