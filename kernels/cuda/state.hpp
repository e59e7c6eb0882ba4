// Internal to kernels/cuda/*.cpp: the per-context CUDA state, the one error check every
// CUDA and cuBLAS call goes through, and small helpers to hand views and host arrays to the
// launchers (launch.hpp).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>

#include "cuda/launch.hpp"
#include "trellis/kernels/context.hpp"

namespace trellis::kernels {

// The cuBLASLt descriptors and algorithm of one GEMM shape; destroys them.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// What ops do while an OpGraph (graph.hpp) records or fills: kRecording enqueues under
// stream capture, kFilling stages host inputs and launches nothing.
enum class GraphMode : std::uint8_t { kOff, kRecording, kFilling };

// The arena ops stage their host inputs in while a graph records or fills. `base` null (or
// too small): only count the bytes (`used`), the sizing pass of a capture.
struct GraphStaging {
  std::byte* base = nullptr;
  std::size_t capacity = 0, used = 0;
  // The graph's device copy of the arena (same offsets): kernels read their staged inputs
  // there, and the graph's first node copies the whole arena into it, one copy per launch
  // instead of one per input (OpGraph). Null while sizing.
  std::byte* device = nullptr;
  // Recording without the one copy (Context::graph_one_copy false): a copy node per input.
  bool copy_each = false;
  // Where the embedding op staged its token ids (OpGraph::launch_prefilled overwrites them);
  // ids_count kSeveral when the body embedded more than once.
  static constexpr std::size_t kNone = ~std::size_t{0}, kSeveral = kNone - 1;
  std::size_t ids_at = kNone, ids_count = 0;
  void note_ids(std::size_t count) {
    if (ids_at != kNone) {
      ids_count = kSeveral;
      return;
    }
    ids_at = used;
    ids_count = count;
  }
};

// One per CUDA Context. Scratch memory is reused by every op in stream order: an op's
// uploads and temporaries are consumed by kernels enqueued before the next op's uploads.
struct CudaState {
  int gpu = 0;
  int sm_count = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLASLt's
  std::size_t workspace_bytes = 0;
  void* scratch = nullptr;
  std::size_t scratch_bytes = 0;
  // Counts the scratch's allocations: a graph compares this, not the address, which a new
  // allocation can reuse (Tensor::serial says why).
  std::uint64_t scratch_serial = 0;
  // cuBLASLt descriptors and heuristic result by (M, N, K, lds, type, alignments), made on
  // first use (ops.cpp lt_matmul): both cost more host time than a small GEMM takes.
  using GemmKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, int,
                             int, int, int>;
  static constexpr std::size_t kMaxPlans = 4096;
  std::map<GemmKey, std::unique_ptr<LtPlan>> plans;
  // Pinned staging for upload(), two halves used in turn. A copy from pageable memory may
  // make the driver wait for the stream to drain first; the decode forward uploads tokens,
  // positions and cache descriptors a few times per layer, and those waits kept the host
  // from ever running ahead of the GPU (the first H200 trace: 93 us of host time per layer
  // of a 1B model). Copies from pinned memory are plain DMA in stream order. A half is
  // refilled only after the event recorded when it was last left has passed.
  struct UploadRing {
    std::byte* host = nullptr;  // 2 * half bytes, cudaHostAlloc
    std::size_t half = 0, used = 0;
    int current = 0;
    cudaEvent_t left[2] = {nullptr, nullptr};
    bool recorded[2] = {false, false};
  } ring;
  GraphMode mode = GraphMode::kOff;
  GraphStaging* staging = nullptr;  // set while mode != kOff
};

namespace cuda {

// Throw trellis::Error naming the call, the error (string and enum name) and the GPU when
// `e` is not success. Out-of-memory errors are kResourceExhausted, a missing driver or
// device kUnsupported, anything else kIo.
void check(cudaError_t e, const char* call, int gpu);
void check(cublasStatus_t e, const char* call, int gpu);

// At least `bytes` of the context's scratch (grows it: waits for the stream first, since
// enqueued kernels may still use the old buffer).
void* scratch(CudaState& s, std::size_t bytes);
inline std::size_t align_up(std::size_t n) { return (n + 255) / 256 * 256; }

// A kernel's host input: copied to device memory on the stream; returns where the kernel
// must read it. Eagerly that is `dst` (the source staged in the context's pinned ring first,
// so the caller may reuse its array at once). While a graph records or fills, the input is
// staged in the graph's arena and read from the arena's device copy, which the graph's one
// copy node fills at launch (null while sizing: nothing is launched then).
const void* upload(CudaState& s, void* dst, const void* src, std::size_t bytes);

// The cuBLASLt descriptors and algorithm (the heuristic's first) of y[M,N] f32 = x[M,K]
// w[N,K]^T with x and w of type t, row-major leading dimensions and the operands' alignments
// in bytes (ops.cpp; DirectGemm uses it too, so the peer runs the same algorithm).
std::unique_ptr<LtPlan> make_lt_plan(CudaState& s, cudaDataType_t t, std::int64_t m, std::int64_t n, std::int64_t k,
                                     std::int64_t ldw, std::int64_t ldx, std::int64_t ldy, int al_a, int al_b, int al_c);
// The largest power of two (<= 256) dividing the address.
int alignment(const void* p);

// True while an OpGraph fills: an op stages its uploads and returns before launching.
inline bool filling(const CudaState& s) { return s.mode == GraphMode::kFilling; }

// The launchers' view of a validated matrix view.
Mat mat_of(const TensorView& m);

}  // namespace cuda
}  // namespace trellis::kernels

// The one check macro: the call's text goes into the message.
#define TRELLIS_CUDA_CHECK(gpu, call)                          \
  do {                                                         \
    ::trellis::kernels::cuda::check((call), #call, (gpu));     \
  } while (0)
