// Built with the CUDA/NCCL path. Runs on machines without a GPU or driver too: those
// report "no driver"/0 devices instead of failing.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "trellis/transport/libraries.hpp"

namespace trellis::transport {

CudaInfo query_cuda() {
  CudaInfo info;
  info.built = true;
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) info.runtime = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
  int d = 0;
  cudaError_t derr = cudaDriverGetVersion(&d);
  info.driver = (derr == cudaSuccess && d > 0) ? fmt::format("{}.{}", d / 1000, (d % 1000) / 10) : "no driver";
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess) {
    info.device_count = n;
  } else {
    info.device_count = 0;
    info.why = cudaGetErrorString(err);
  }
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess) {
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    info.nccl = fmt::format("{}.{}.{}", nv / 10000, (nv % 10000) / 100, nv % 100);
  }
  return info;
}

}  // namespace trellis::transport
