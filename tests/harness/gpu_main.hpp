// The main of a `gpu`-labelled GoogleTest binary: exit 77 (CTest: skipped) with the reason
// when there is no CUDA device or no CUDA backend, else name the card and run the tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "trellis/kernels/library.hpp"

namespace trellis::test {

inline int gpu_test_main(int argc, char** argv) {
  const kernels::CudaKernelsInfo info = kernels::cuda_kernels_info();
  if (!info.built || info.gpus.empty()) {
    const std::string why = info.built ? info.why : "the CUDA backend is not built (" + info.why + ")";
    std::printf("no CUDA device: %s\n", why.c_str());
    return 77;
  }
  std::printf("GPU 0: %s (sm_%d%d), CUDA runtime %s, cuBLASLt %s, built for %s\n", info.gpus[0].name.c_str(),
              info.gpus[0].major, info.gpus[0].minor, info.runtime.c_str(), info.cublaslt.c_str(),
              info.architectures.c_str());
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace trellis::test
