#include "trellis/kernels/library.hpp"

#include <cblas.h>

#include <string>

namespace trellis::kernels {

std::string blas_description() {
  std::string s = openblas_get_config();
  return s + " (core " + openblas_get_corename() + ", " + std::to_string(openblas_get_num_threads()) + " threads)";
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

}  // namespace trellis::kernels
