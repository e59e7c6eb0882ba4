// What the kernels layer was built with: the BLAS library, the CPU features it uses and the
// CUDA backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

// e.g. "OpenBLAS 0.3.21 (Haswell, 2 threads)".
std::string blas_description();
// e.g. "oneDNN 2.6.3 (OpenMP runtime, ISA avx512_core_bf16)": the version, its threading
// runtime and the instruction set its JIT kernels use on this CPU.
std::string onednn_description();
// The library matmul's kAuto runs for prefill (M > 8 rows) with weights of type t, and why,
// e.g. "oneDNN f32 matmul (oneDNN ISA avx512_core_bf16)". Decode (M <= 8) is always our GEMV.
std::string prefill_gemm_choice(DType t);
// The instruction-set extensions this binary was compiled for, e.g. "AVX2 FMA AVX512F".
std::string compiled_isa();
// The CPU's marketing name ("model name" in /proc/cpuinfo, as lscpu prints it), or
// "unknown CPU"; for benchmark reports.
std::string cpu_model_name();

// One GPU as the CUDA runtime sees it.
struct GpuInfo {
  int index = 0;
  std::string name;                // "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;        // compute capability
  int multiprocessors = 0;
  std::int64_t memory_bytes = 0;   // total
};

// Whether this kernels library has its CUDA backend (kernels/cuda/) and what it sees.
struct CudaKernelsInfo {
  bool built = false;
  std::string architectures;  // the CUDA architectures compiled for, "80;90"
  std::string runtime;        // CUDA runtime version, "13.0"
  std::string cublaslt;       // cuBLASLt version, "13.0.2"
  std::vector<GpuInfo> gpus;  // visible GPUs (empty with `why` when none)
  std::string why;            // not built, or no device: the reason
};
// Never throws: a missing driver or GPU is reported in `why`.
CudaKernelsInfo cuda_kernels_info();

}  // namespace trellis::kernels
