#include "trellis/kernels/library.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <fstream>
#include <string>

#include "cpu/cpu_ops.hpp"
#include "cuda/cuda_ops.hpp"

namespace trellis::kernels {

std::string blas_description() {
  std::string s = openblas_get_config();
  return s + " (core " + openblas_get_corename() + ", " + std::to_string(openblas_get_num_threads()) + " threads)";
}

std::string prefill_gemm_choice(DType t) {
  const std::string widened = t == DType::kF32 ? "" : fmt::format(", {} weights widened to f32 per 256 rows", to_string(t));
  switch (cpu::prefill_algo(t)) {
    case MatmulAlgo::kOnednn: return "oneDNN f32 matmul" + widened + " (oneDNN runs AVX-512 brgemm here)";
    case MatmulAlgo::kBlas:
      return fmt::format("OpenBLAS sgemm{} (its core {} has AVX-512 kernels)", widened, openblas_get_corename());
    default:
      return fmt::format("ours (gemm_packed{})", t == DType::kF32 ? "" : ", weights widened while packing");
  }
}

std::string compiled_isa() {
  std::string s;
#ifdef __AVX2__
  s += "AVX2 ";
#endif
#ifdef __FMA__
  s += "FMA ";
#endif
#ifdef __AVX512F__
  s += "AVX512F ";
#endif
#ifdef __AVX512BF16__
  s += "AVX512BF16 ";
#endif
  if (s.empty()) return "baseline x86-64";
  s.pop_back();
  return s;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) break;
    auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown CPU" : line.substr(start);
  }
  return "unknown CPU";
}

CudaKernelsInfo cuda_kernels_info() {
  try {
    return cuda::info();
  } catch (const std::exception& e) {  // the contract is "never throws"
    CudaKernelsInfo i;
    i.why = e.what();
    return i;
  }
}

}  // namespace trellis::kernels
