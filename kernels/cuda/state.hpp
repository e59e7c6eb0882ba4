// Internal to kernels/cuda/*.cpp: the per-context CUDA state, the one error check every
// CUDA and cuBLAS call goes through, and small helpers to hand views and host arrays to the
// launchers (launch.hpp).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>

#include "cuda/launch.hpp"
#include "trellis/kernels/context.hpp"

namespace trellis::kernels {

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
  // cuBLASLt heuristic results by (M, N, K, lds, types, alignments): the query costs more
  // than a small matmul.
  using GemmKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, int,
                             int, int, int>;
  std::map<GemmKey, cublasLtMatmulAlgo_t> algos;
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

// Copies a host array to device memory `dst` on the stream (pageable source: staged before
// the call returns, so the caller may reuse it).
void upload(CudaState& s, void* dst, const void* src, std::size_t bytes);

// The launchers' view of a validated matrix view.
Mat mat_of(const TensorView& m);

}  // namespace cuda
}  // namespace trellis::kernels

// The one check macro: the call's text goes into the message.
#define TRELLIS_CUDA_CHECK(gpu, call)                          \
  do {                                                         \
    ::trellis::kernels::cuda::check((call), #call, (gpu));     \
  } while (0)
