// What the kernels layer was built with: the BLAS library and the CPU features it uses.
#pragma once

#include <string>

namespace trellis::kernels {

// e.g. "OpenBLAS 0.3.21 (Haswell, 2 threads)".
std::string blas_description();
// The instruction-set extensions this binary was compiled for, e.g. "AVX2 FMA AVX512F".
std::string compiled_isa();
// The CPU's marketing name ("model name" in /proc/cpuinfo, as lscpu prints it), or
// "unknown CPU"; for benchmark reports.
std::string cpu_model_name();

}  // namespace trellis::kernels
