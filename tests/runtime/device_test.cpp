// run.device / --device: parsing, the refusal without a GPU (with the CUDA runtime's reason),
// and the GPU a rank binds to. Pure functions of a CudaKernelsInfo, so no GPU is needed.
#include <gtest/gtest.h>

#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/device.hpp"

namespace trellis::runtime {
namespace {

kernels::CudaKernelsInfo gpus(int n) {
  kernels::CudaKernelsInfo info;
  info.built = true;
  for (int i = 0; i < n; ++i) info.gpus.push_back({i, "H100", 9, 0, 132, std::int64_t{80} << 30});
  if (n == 0) info.why = "cudaGetDeviceCount: no CUDA-capable device is detected";
  return info;
}

TEST(Device, ParsesTheThreeChoicesAndRefusesOthers) {
  EXPECT_EQ(parse_device_choice("auto"), DeviceChoice::kAuto);
  EXPECT_EQ(parse_device_choice("cpu"), DeviceChoice::kCpu);
  EXPECT_EQ(parse_device_choice("cuda"), DeviceChoice::kCuda);
  EXPECT_EQ(to_string(DeviceChoice::kCuda), "cuda");
  try {
    parse_device_choice("gpu", "run.device (--device)");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("run.device (--device): unknown device 'gpu'"), std::string::npos) << e.what();
  }
}

TEST(Device, SettingDefaultsToAuto) {
  Config c;
  EXPECT_EQ(c.get_string("run.device"), "auto");
  EXPECT_EQ(parse_device_choice(c.get_string("run.device")), DeviceChoice::kAuto);
}

TEST(Device, CudaWithoutAGpuIsRefusedWithTheRuntimesReason) {
  try {
    bind_device(DeviceChoice::kCuda, gpus(0), 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string m = e.what();
    EXPECT_NE(m.find("--device cuda"), std::string::npos) << m;
    EXPECT_NE(m.find("no CUDA-capable device is detected"), std::string::npos) << m;
  }
  kernels::CudaKernelsInfo unbuilt;
  unbuilt.why = "built without CUDA (TRELLIS_CUDA=OFF)";
  try {
    bind_device(DeviceChoice::kCuda, unbuilt, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA backend (built without CUDA"), std::string::npos) << e.what();
  }
}

TEST(Device, AutoFallsBackToTheCpuAndCpuStaysThere) {
  auto b = bind_device(DeviceChoice::kAuto, gpus(0), 0);
  EXPECT_EQ(b.device, kernels::Device::kCpu);
  EXPECT_NE(b.reason.find("no CUDA-capable device"), std::string::npos) << b.reason;
  EXPECT_EQ(bind_device(DeviceChoice::kCpu, gpus(4), 1).device, kernels::Device::kCpu);
  EXPECT_EQ(bind_device(DeviceChoice::kAuto, gpus(1), 0).device, kernels::Device::kCuda);
}

TEST(Device, LocalRankPicksTheGpuRoundRobin) {
  EXPECT_EQ(bind_device(DeviceChoice::kCuda, gpus(8), 3).gpu, 3);
  EXPECT_EQ(bind_device(DeviceChoice::kCuda, gpus(2), 3).gpu, 1);
  EXPECT_EQ(bind_device(DeviceChoice::kCuda, gpus(1), 1).gpu, 0);  // pp=2 sharing one GPU
  EXPECT_NE(bind_device(DeviceChoice::kCuda, gpus(2), 3).reason.find("GPU 1 of 2"), std::string::npos);
}

}  // namespace
}  // namespace trellis::runtime
