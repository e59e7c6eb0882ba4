// The CUDA side of graph.hpp. Capture: a sizing pass of the body in filling mode with an
// arena of no bytes (ops count what they would stage and grow the scratch, launching
// nothing), a pinned arena of that size, then the body again under stream capture, then
// instantiate and launch. Replay: the body in filling mode into the arena, then launch.
// Prefill: the same fill, kept pending; its launch first writes the real token ids over the
// ones the embedding op staged. The arena has a device twin of the same size: the graph's
// first node copies the whole arena into it and the kernels read their inputs there, so a
// launch holds one copy node, not one per upload (65 for a 16-layer decode step; each put a
// copy between two kernels on the GPU and a node more into every launch on the host).
#include <cstring>

#include "cuda/cuda_ops.hpp"
#include "cuda/state.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/graph.hpp"

namespace trellis::kernels {
namespace {

// Puts the context in a graph mode for a scope; back to kOff however the scope ends.
class ModeScope {
 public:
  ModeScope(CudaState& s, GraphMode m, GraphStaging& st) : s_(s) {
    s_.mode = m;
    s_.staging = &st;
  }
  ~ModeScope() {
    s_.mode = GraphMode::kOff;
    s_.staging = nullptr;
  }
  ModeScope(const ModeScope&) = delete;
  ModeScope& operator=(const ModeScope&) = delete;

 private:
  CudaState& s_;
};

}  // namespace

struct OpGraph::Impl {
  CudaState* s = nullptr;
  const Context* ctx = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::byte* arena = nullptr;         // pinned
  std::byte* device_arena = nullptr;  // its device twin, arena_bytes too
  std::size_t arena_bytes = 0, staged = 0;
  std::uint64_t scratch_at_capture = 0;  // CudaState::scratch_serial
  cudaEvent_t launched = nullptr;
  bool in_flight = false;
  // A prefill waiting for launch_prefilled(), and where its token ids lie in the arena.
  bool pending = false;
  std::size_t ids_at = GraphStaging::kNone, ids_count = 0;

  void drop() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
  // The arena is read by the last launch's copy nodes until that launch has run.
  void wait_last_launch() {
    if (in_flight) TRELLIS_CUDA_CHECK(s->gpu, cudaEventSynchronize(launched));
    in_flight = false;
  }
  void launch() {
    TRELLIS_CUDA_CHECK(s->gpu, cudaGraphLaunch(exec, s->stream));
    TRELLIS_CUDA_CHECK(s->gpu, cudaEventRecord(launched, s->stream));
    in_flight = true;
  }
  ~Impl() {
    if (in_flight) cudaEventSynchronize(launched);
    drop();
    if (arena) cudaFreeHost(arena);
    cuda::device_free(device_arena);
    if (launched) cudaEventDestroy(launched);
  }
};

OpGraph::OpGraph(const Context& ctx) : impl_(std::make_unique<Impl>()) {
  if (ctx.device() != Device::kCuda) throw_error(ErrorCode::kUnsupported, "OpGraph: needs a CUDA context (this one is on the CPU)");
  impl_->s = &ctx.cuda_state();
  impl_->ctx = &ctx;
  TRELLIS_CUDA_CHECK(impl_->s->gpu, cudaEventCreateWithFlags(&impl_->launched, cudaEventDisableTiming));
}

OpGraph::~OpGraph() = default;

bool OpGraph::captured() const { return impl_->exec != nullptr; }
std::size_t OpGraph::staged_bytes() const { return impl_->staged; }

void OpGraph::capture(const std::function<void()>& body) {
  Impl& d = *impl_;
  CudaState& s = *d.s;
  if (s.mode != GraphMode::kOff) throw_error(ErrorCode::kInternal, "OpGraph::capture inside another graph's body");
  d.pending = false;
  d.wait_last_launch();
  d.drop();
  GraphStaging sizing;
  {
    ModeScope scope(s, GraphMode::kFilling, sizing);
    body();
  }
  if (sizing.used > d.arena_bytes) {
    if (d.arena) TRELLIS_CUDA_CHECK(s.gpu, cudaFreeHost(d.arena));
    cuda::device_free(d.device_arena);
    d.arena = nullptr;
    d.device_arena = nullptr;
    d.arena_bytes = 0;
    TRELLIS_CUDA_CHECK(s.gpu, cudaHostAlloc(reinterpret_cast<void**>(&d.arena), sizing.used, cudaHostAllocDefault));
    d.device_arena = static_cast<std::byte*>(cuda::device_alloc(sizing.used));
    d.arena_bytes = sizing.used;
  }
  GraphStaging rec{d.arena, d.arena_bytes, 0};
  rec.device = d.device_arena;
  rec.copy_each = !d.ctx->graph_one_copy();
  {
    ModeScope scope(s, GraphMode::kRecording, rec);
    TRELLIS_CUDA_CHECK(s.gpu, cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    try {
      // The inputs the body stages below, all of them, in one copy before its first kernel
      // (the node reads the arena when the launch runs, after each fill).
      if (sizing.used > 0 && !rec.copy_each)
        TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpyAsync(d.device_arena, d.arena, sizing.used, cudaMemcpyHostToDevice, s.stream));
      body();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(s.stream, &broken);  // ends the capture whatever the body left
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    TRELLIS_CUDA_CHECK(s.gpu, cudaStreamEndCapture(s.stream, &d.graph));
  }
  if (rec.used != sizing.used)
    throw_error(ErrorCode::kInternal, "OpGraph::capture: the body staged {} bytes when sized and {} when captured",
                sizing.used, rec.used);
  TRELLIS_CUDA_CHECK(s.gpu, cudaGraphInstantiate(&d.exec, d.graph, 0));
  d.staged = rec.used;
  d.scratch_at_capture = s.scratch_serial;
  d.launch();
}

// The body in filling mode into the arena; false where the scratch moved (before or during).
bool OpGraph::fill(const std::function<void()>& body, const char* what) {
  Impl& d = *impl_;
  CudaState& s = *d.s;
  d.pending = false;
  if (!d.exec || s.scratch_serial != d.scratch_at_capture) return false;
  if (s.mode != GraphMode::kOff) throw_error(ErrorCode::kInternal, "OpGraph::{} inside another graph's body", what);
  d.wait_last_launch();
  GraphStaging fill{d.arena, d.arena_bytes, 0};
  fill.device = d.device_arena;
  {
    ModeScope scope(s, GraphMode::kFilling, fill);
    body();
  }
  if (s.scratch_serial != d.scratch_at_capture) return false;  // the body grew it: shapes changed
  if (fill.used != d.staged)
    throw_error(ErrorCode::kInternal, "OpGraph::{}: the body staged {} bytes, the capture {} (different ops)", what,
                fill.used, d.staged);
  d.ids_at = fill.ids_at;
  d.ids_count = fill.ids_count;
  return true;
}

bool OpGraph::replay(const std::function<void()>& body, const std::function<bool()>& still_valid) {
  if (!fill(body, "replay")) return false;
  if (still_valid && !still_valid()) return false;
  impl_->launch();
  return true;
}

bool OpGraph::prefill(const std::function<void()>& body) {
  if (!fill(body, "prefill")) return false;
  impl_->pending = true;
  return true;
}

bool OpGraph::prefilled() const { return impl_->pending; }
void OpGraph::drop_prefill() { impl_->pending = false; }

bool OpGraph::launch_prefilled(std::span<const std::int32_t> tokens) {
  Impl& d = *impl_;
  if (!d.pending) return false;
  d.pending = false;
  if (!d.exec || d.s->scratch_serial != d.scratch_at_capture) return false;
  const std::size_t staged = d.ids_at == GraphStaging::kNone ? 0 : d.ids_count;
  if (tokens.size() != staged) return false;  // kSeveral never equals a span's size
  // The arena is pinned host memory the graph's copy nodes read when the launch runs; the
  // fill waited for this graph's last launch, so nothing reads it now.
  if (!tokens.empty()) std::memcpy(d.arena + d.ids_at, tokens.data(), tokens.size_bytes());
  d.launch();
  return true;
}

}  // namespace trellis::kernels
