#include "trellis/runtime/engine/device.hpp"

#include <fmt/format.h>

#include "trellis/core/error.hpp"

namespace trellis::runtime {

DeviceChoice parse_device_choice(std::string_view text, std::string_view what) {
  if (text == "auto") return DeviceChoice::kAuto;
  if (text == "cpu") return DeviceChoice::kCpu;
  if (text == "cuda") return DeviceChoice::kCuda;
  throw_error(ErrorCode::kInvalidArgument, "{}: unknown device '{}' (expected auto, cpu or cuda)", what, text);
}

std::string_view to_string(DeviceChoice c) {
  switch (c) {
    case DeviceChoice::kAuto: return "auto";
    case DeviceChoice::kCpu: return "cpu";
    case DeviceChoice::kCuda: return "cuda";
  }
  return "?";
}

DeviceBinding bind_device(DeviceChoice choice, const kernels::CudaKernelsInfo& info, int local_index) {
  DeviceBinding b;
  const int n = static_cast<int>(info.gpus.size());
  const std::string why = !info.built ? fmt::format("this trellis has no CUDA backend ({})", info.why)
                                      : n == 0 ? (info.why.empty() ? std::string("no GPU visible") : info.why)
                                               : std::string();
  if (choice == DeviceChoice::kCpu) {
    b.reason = "--device cpu";
    return b;
  }
  if (n == 0) {
    if (choice == DeviceChoice::kCuda)
      throw_error(ErrorCode::kUnsupported,
                  "--device cuda (run.device) but this rank has no usable GPU: {} (CUDA_VISIBLE_DEVICES, when set, "
                  "limits the GPUs a rank sees); use --device cpu or auto", why);
    b.reason = fmt::format("no GPU visible: {}", why);
    return b;
  }
  b.device = kernels::Device::kCuda;
  b.gpu = (local_index < 0 ? 0 : local_index) % n;
  b.reason = fmt::format("GPU {} of {} ({}, local rank {})", b.gpu, n, info.gpus[static_cast<std::size_t>(b.gpu)].name,
                         local_index);
  return b;
}

kernels::Context cpu_context(const Config& config, int spin_us) {
  kernels::Context ctx(static_cast<int>(config.get_int("kernels.threads")),
                       spin_us >= 0 ? spin_us : static_cast<int>(config.get_int("kernels.spin_us")));
  ctx.set_huge_pages(config.get_bool("kernels.huge_pages"));
  return ctx;
}

}  // namespace trellis::runtime
