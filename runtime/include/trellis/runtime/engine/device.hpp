// Which device a rank of `trellis run` / `trellis serve` computes on (setting run.device,
// flag --device): the choice, its validation, and the GPU a rank binds to. Pure functions of
// what the CUDA runtime reports (kernels::cuda_kernels_info), so they are testable anywhere.
#pragma once

#include <string>
#include <string_view>

#include "trellis/core/config.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::runtime {

// auto: a GPU when the rank sees one, else the CPU; cpu; cuda: a GPU or a refusal.
enum class DeviceChoice { kAuto, kCpu, kCuda };

// "auto" / "cpu" / "cuda"; throws kInvalidArgument naming `what` (e.g. "run.device") otherwise.
DeviceChoice parse_device_choice(std::string_view text, std::string_view what = "run.device");
std::string_view to_string(DeviceChoice c);

struct DeviceBinding {
  kernels::Device device = kernels::Device::kCpu;
  int gpu = -1;        // index among the GPUs this process sees (CUDA_VISIBLE_DEVICES applied)
  std::string reason;  // why: "GPU 1 of 2 (local rank 3)", "no GPU visible: <CUDA's reason>"
};

// The device for a rank that is the `local_index`-th rank of its host (0-based, world rank
// order, as the NCCL link counts) given what the CUDA runtime sees: GPU local_index modulo
// the visible GPUs, so ranks share GPUs round-robin when there are more ranks than GPUs.
// Throws kUnsupported for kCuda when no GPU is visible, with the CUDA runtime's reason
// (info.why: backend not built, no driver, no device) — before anything is loaded.
DeviceBinding bind_device(DeviceChoice choice, const kernels::CudaKernelsInfo& info, int local_index);

// A CPU context as the settings ask for it: kernels.threads, kernels.spin_us (`spin_us` >= 0
// overrides it) and kernels.huge_pages. Every command that loads a model on the CPU makes its
// context here, so that none of them forgets a setting.
kernels::Context cpu_context(const Config& config, int spin_us = -1);

}  // namespace trellis::runtime
