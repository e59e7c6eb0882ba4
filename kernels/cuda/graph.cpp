// The CUDA side of graph.hpp. Capture: a sizing pass of the body in filling mode with an
// arena of no bytes (ops count what they would stage and grow the scratch, launching
// nothing), a pinned arena of that size, then the body again under stream capture, then
// instantiate and launch. Replay: the body in filling mode into the arena, then launch.
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
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::byte* arena = nullptr;  // pinned
  std::size_t arena_bytes = 0, staged = 0;
  std::uint64_t scratch_at_capture = 0;  // CudaState::scratch_serial
  cudaEvent_t launched = nullptr;
  bool in_flight = false;

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
    if (launched) cudaEventDestroy(launched);
  }
};

OpGraph::OpGraph(const Context& ctx) : impl_(std::make_unique<Impl>()) {
  if (ctx.device() != Device::kCuda) throw_error(ErrorCode::kUnsupported, "OpGraph: needs a CUDA context (this one is on the CPU)");
  impl_->s = &ctx.cuda_state();
  TRELLIS_CUDA_CHECK(impl_->s->gpu, cudaEventCreateWithFlags(&impl_->launched, cudaEventDisableTiming));
}

OpGraph::~OpGraph() = default;

bool OpGraph::captured() const { return impl_->exec != nullptr; }
std::size_t OpGraph::staged_bytes() const { return impl_->staged; }

void OpGraph::capture(const std::function<void()>& body) {
  Impl& d = *impl_;
  CudaState& s = *d.s;
  if (s.mode != GraphMode::kOff) throw_error(ErrorCode::kInternal, "OpGraph::capture inside another graph's body");
  d.wait_last_launch();
  d.drop();
  GraphStaging sizing;
  {
    ModeScope scope(s, GraphMode::kFilling, sizing);
    body();
  }
  if (sizing.used > d.arena_bytes) {
    if (d.arena) TRELLIS_CUDA_CHECK(s.gpu, cudaFreeHost(d.arena));
    d.arena = nullptr;
    d.arena_bytes = 0;
    TRELLIS_CUDA_CHECK(s.gpu, cudaHostAlloc(reinterpret_cast<void**>(&d.arena), sizing.used, cudaHostAllocDefault));
    d.arena_bytes = sizing.used;
  }
  GraphStaging rec{d.arena, d.arena_bytes, 0};
  {
    ModeScope scope(s, GraphMode::kRecording, rec);
    TRELLIS_CUDA_CHECK(s.gpu, cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    try {
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

bool OpGraph::replay(const std::function<void()>& body, const std::function<bool()>& still_valid) {
  Impl& d = *impl_;
  CudaState& s = *d.s;
  if (!d.exec || s.scratch_serial != d.scratch_at_capture) return false;
  if (s.mode != GraphMode::kOff) throw_error(ErrorCode::kInternal, "OpGraph::replay inside another graph's body");
  d.wait_last_launch();
  GraphStaging fill{d.arena, d.arena_bytes, 0};
  {
    ModeScope scope(s, GraphMode::kFilling, fill);
    body();
  }
  if (s.scratch_serial != d.scratch_at_capture) return false;  // the body grew it: shapes changed
  if (still_valid && !still_valid()) return false;
  if (fill.used != d.staged)
    throw_error(ErrorCode::kInternal, "OpGraph::replay: the body staged {} bytes, the capture {} (different ops)", fill.used,
                d.staged);
  d.launch();
  return true;
}

}  // namespace trellis::kernels
