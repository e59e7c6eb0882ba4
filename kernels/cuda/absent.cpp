// Built when the CUDA backend is not (no toolkit, or -DTRELLIS_CUDA=OFF): a CUDA context or
// device tensor cannot be made, and says why; the ops below are then unreachable, but are
// defined so that kernels/src/ dispatches the same way in every build.
#include "cuda/cuda_ops.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/async_copy.hpp"
#include "trellis/kernels/device_bench.hpp"
#include "trellis/kernels/graph.hpp"

namespace trellis::kernels::cuda {

[[noreturn]] static void absent(const char* what) {
  throw_error(ErrorCode::kUnsupported, "{}: the CUDA backend is not built into this trellis ({})", what,
              TRELLIS_CUDA_KERNELS_WHY);
}

CudaState* create_state(int) { absent("Context(cuda)"); }
void destroy_state(CudaState*) noexcept {}
void synchronize(const CudaState&) { absent("synchronize"); }
void* stream_of(const CudaState&) { absent("cuda_stream"); }
void* device_alloc(std::size_t) { absent("Tensor on cuda"); }
void device_free(void*) noexcept {}
void device_zero(void*, std::size_t) { absent("Tensor on cuda"); }
void copy(const Context&, const TensorView&, const TensorView&) { absent("copy"); }

CudaKernelsInfo info() {
  CudaKernelsInfo i;
  i.why = TRELLIS_CUDA_KERNELS_WHY;
  return i;
}

void matmul(const Context&, const TensorView&, const TensorView&, const TensorView&, const MatmulOptions&) { absent("matmul"); }
void add_bias(const Context&, const TensorView&, const TensorView&) { absent("add_bias"); }
void rms_norm(const Context&, const TensorView&, const TensorView&, float, const TensorView&) { absent("rms_norm"); }
void swiglu(const Context&, const TensorView&, const TensorView&, const TensorView&) { absent("swiglu"); }
void add(const Context&, const TensorView&, const TensorView&, const TensorView&) { absent("add"); }
void softmax_rows(const Context&, const TensorView&) { absent("softmax_rows"); }
void embedding(const Context&, const TensorView&, std::span<const std::int32_t>, std::int64_t, const TensorView&) {
  absent("embedding");
}
void convert(const Context&, const TensorView&, const TensorView&) { absent("convert"); }
void apply_rope(const Context&, const RopeTable&, const TensorView&, int, std::span<const std::int32_t>) {
  absent("apply_rope");
}
void kv_write(const Context&, const KvView&, const TensorView&, const TensorView&, std::int64_t) { absent("kv_write"); }
void attention_prefill(const Context&, const AttentionDims&, const TensorView&, const KvView&, std::int64_t,
                       const TensorView&) {
  absent("attention_prefill");
}
void attention_decode(const Context&, const AttentionDims&, const TensorView&, std::span<const KvView>,
                      std::span<const std::int64_t>, const TensorView&) {
  absent("attention_decode");
}
void attention_tree(const Context&, const AttentionDims&, const TensorView&, const KvView&, std::int64_t, std::int64_t,
                    std::span<const std::int32_t>, const TensorView&) {
  absent("attention_tree");
}
void kv_copy(const Context&, const KvView&, std::int64_t, std::int64_t, std::int64_t) { absent("kv_copy"); }

}  // namespace trellis::kernels::cuda

// device_bench.hpp: nothing to measure without the backend.
namespace trellis::kernels {

DeviceTimer::DeviceTimer(const Context& ctx) : ctx_(ctx) { cuda::absent("DeviceTimer"); }
double time_graph_launches(const Context&, const std::function<void()>&, int, int) { cuda::absent("time_graph_launches"); }
DeviceTimer::~DeviceTimer() = default;
void DeviceTimer::start() { cuda::absent("DeviceTimer"); }
double DeviceTimer::stop() { cuda::absent("DeviceTimer"); }
DeviceBandwidth measure_device_bandwidth(const Context&, std::size_t, int) { cuda::absent("measure_device_bandwidth"); }
struct DirectGemm::Impl {};
DirectGemm::DirectGemm(const Context&, const TensorView&, const TensorView&, const TensorView&) {
  cuda::absent("DirectGemm");
}
DirectGemm::~DirectGemm() = default;
void DirectGemm::run() { cuda::absent("DirectGemm"); }

}  // namespace trellis::kernels

// async_copy.hpp: no copies without the backend.
namespace trellis::kernels {

struct Download::Impl {};
Download::Download(const Context&, int) { cuda::absent("Download"); }
Download::~Download() = default;
int Download::slots() const { return 0; }
void Download::start(int, const TensorView&) { cuda::absent("Download"); }
const void* Download::wait(int) { cuda::absent("Download"); }

}  // namespace trellis::kernels

// graph.hpp: nothing to capture without the backend.
namespace trellis::kernels {

struct OpGraph::Impl {};
OpGraph::OpGraph(const Context&) { cuda::absent("OpGraph"); }
OpGraph::~OpGraph() = default;
void OpGraph::capture(const std::function<void()>&) { cuda::absent("OpGraph"); }
bool OpGraph::replay(const std::function<void()>&, const std::function<bool()>&) { cuda::absent("OpGraph"); }
bool OpGraph::captured() const { return false; }
std::size_t OpGraph::staged_bytes() const { return 0; }
bool OpGraph::prefill(const std::function<void()>&) { cuda::absent("OpGraph"); }
bool OpGraph::prefilled() const { return false; }
bool OpGraph::launch_prefilled(std::span<const std::int32_t>) { cuda::absent("OpGraph"); }
void OpGraph::drop_prefill() {}

}  // namespace trellis::kernels
