// The main of a `gpu`-labelled GoogleTest binary: exit 77 (CTest: skipped) with the reason
// when there is no CUDA device or no CUDA backend, else name the card and run the tests.
#pragma once

#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "trellis/kernels/library.hpp"

namespace trellis::test {

// A crash in a GPU test must say which test crashed: stdout unbuffered (a pipe's buffer dies
// with the process) and SIGSEGV/SIGABRT reported with the running test's name first.
inline void report_fatal_signal(int sig) {
  const auto* t = testing::UnitTest::GetInstance()->current_test_info();
  std::fprintf(stderr, "\nfatal signal %d in test %s.%s\n", sig, t ? t->test_suite_name() : "?", t ? t->name() : "?");
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

inline int gpu_test_main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::signal(SIGSEGV, report_fatal_signal);
  std::signal(SIGABRT, report_fatal_signal);
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
