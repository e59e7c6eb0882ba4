// CUDA graphs of a sequence of ops (SiPipe §5.2; issue 18.3): a decode step is hundreds of
// small launches, and on an H200 a 1B model's step spent 92 us of host time per layer
// launching them while the GPU waited. An OpGraph records what a piece of host code (the
// "body": ops on one CUDA context) enqueues, once, and then replays it as one launch.
//
// The body's host inputs (token ids, positions, KV-cache descriptors: what ops upload) are
// staged in the graph's own pinned arena; the graph's first node copies the whole arena to
// the device, where the kernels read them (one copy a launch, however many inputs). To
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
// The fill can also run ahead (prefill): while the GPU still runs step i, the host fills the
// other graph of the pair with a guess of step i+1's inputs, and when the step comes as
// guessed launches it after writing in only the values a guess cannot know, the token ids the
// body's embedding op staged. Whether the step came as guessed is the caller's to check
// (kernels cannot know which inputs the guess got right).
//
// CUDA contexts only (kUnsupported otherwise, or without the backend). Not thread-safe; the
// context must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

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

  // Fills the arena through body's host side without launching (waiting first for this
  // graph's last launch, which reads the arena). False, nothing kept, where replay() would
  // return false before launching. The fill stays pending until launch_prefilled(),
  // replay(), capture() or drop_prefill().
  bool prefill(const std::function<void()>& body);
  bool prefilled() const;
  // Writes `tokens` over the token ids the pending fill's embedding op staged, then launches.
  // `tokens` must have as many ids as were staged (none where the body embeds nothing); the
  // caller validates their values. False, nothing launched and the fill dropped: none
  // pending, the scratch moved since, or the count differs (or the body embedded twice).
  bool launch_prefilled(std::span<const std::int32_t> tokens);
  void drop_prefill();

  struct Impl;

 private:
  bool fill(const std::function<void()>& body, const char* what);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::kernels
