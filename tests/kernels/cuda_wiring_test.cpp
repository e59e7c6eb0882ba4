// The CUDA backend's wiring, checked on any machine (no GPU needed): a CUDA context or device
// tensor without a device (or without the backend) fails with the reason, ops refuse operands
// on another device naming the op and the view, copy() and the dequantising convert() work
// on the CPU. The GPU numerics are in cuda_kernels_test.cpp (label gpu).
#include <cstring>

#include "kernel_test_util.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

bool have_gpu() { return !cuda_kernels_info().gpus.empty(); }

// Runs f, expects a trellis::Error with `code` whose message holds every one of `parts`.
template <typename F>
void expect_error(F&& f, ErrorCode code, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

TEST(CudaWiring, InfoSaysBuiltOrWhy) {
  CudaKernelsInfo i = cuda_kernels_info();
  if (i.built) {
    EXPECT_FALSE(i.architectures.empty());
    EXPECT_FALSE(i.runtime.empty());
    EXPECT_TRUE(!i.gpus.empty() || !i.why.empty()) << "no GPUs must come with a reason";
  } else {
    EXPECT_FALSE(i.why.empty());
    EXPECT_TRUE(i.gpus.empty());
  }
}

TEST(CudaWiring, CudaContextWithoutDeviceSaysWhy) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is visible: the context is made (cuda_kernels_test covers it)";
  const char* reason = cuda_kernels_info().built ? "no CUDA device" : "not built";
  expect_error([] { Context ctx(Device::kCuda, 0); }, ErrorCode::kUnsupported, {"cuda", reason});
  expect_error([] { (void)Context::cuda(1); }, ErrorCode::kUnsupported, {reason});
  expect_error([] { (void)Tensor::empty(DType::kF32, {4, 4}, Device::kCuda); }, ErrorCode::kUnsupported,
               {"Tensor on cuda", reason});
}

TEST(CudaWiring, CpuContextIsStillACpuContext) {
  Context a(Device::kCpu, 2);
  EXPECT_EQ(a.device(), Device::kCpu);
  EXPECT_EQ(a.threads(), 2);
  EXPECT_EQ(a.gpu(), -1);
  EXPECT_EQ(a.cuda_stream(), nullptr);
  a.synchronize();  // a no-op on the CPU
  Context b = std::move(a);
  EXPECT_EQ(b.threads(), 2);
  expect_error([&] { (void)b.cuda_state(); }, ErrorCode::kInternal, {"cpu"});
}

// The GPU-only helpers refuse a CPU context, on every build and machine.
TEST(CudaWiring, DeviceHelpersRefuseACpuContext) {
  Context cpu(Device::kCpu, 1);
  expect_error([&] { Download d(cpu, 2); }, ErrorCode::kUnsupported, {"Download"});
  expect_error([&] { DeviceTimer t(cpu); }, ErrorCode::kUnsupported, {"DeviceTimer"});
  expect_error([&] { (void)measure_device_bandwidth(cpu); }, ErrorCode::kUnsupported, {"measure_device_bandwidth"});
}

// A view that claims to be GPU memory; never dereferenced, since the check comes first.
TensorView fake_gpu(std::int64_t rows, std::int64_t cols, const char* name) {
  static float dummy[1];
  return TensorView::matrix(dummy, DType::kF32, rows, cols, -1, Device::kCuda).named(name);
}

TEST(CudaWiring, MixedDevicesAreRefusedNamingTheOp) {
  Context ctx(1);
  Tensor x = Tensor::zeros(DType::kF32, {2, 8}), y = Tensor::zeros(DType::kF32, {2, 4});
  expect_error([&] { matmul(ctx, x, fake_gpu(4, 8, "w_on_gpu"), y); }, ErrorCode::kInvalidArgument,
               {"matmul", "w_on_gpu", "cuda", "cpu"});
  expect_error([&] { add(ctx, x, fake_gpu(2, 8, "resid"), x); }, ErrorCode::kInvalidArgument, {"add", "resid"});
  Tensor w = Tensor::zeros(DType::kF32, {8});
  expect_error([&] { rms_norm(ctx, fake_gpu(2, 8, "h"), w, 1e-5f, x); }, ErrorCode::kInvalidArgument, {"rms_norm", "h"});
  expect_error([&] { copy(ctx, x, fake_gpu(2, 8, "dst")); }, ErrorCode::kInvalidArgument, {"copy", "dst"});
  KvCache cache(1, 1, 2, 8, 4);
  KvView kv = cache.view(0, 0);
  kv.k.device = kv.v.device = Device::kCuda;
  Tensor q = Tensor::zeros(DType::kF32, {1, 8}), out = Tensor::zeros(DType::kF32, {1, 8});
  std::int64_t len = 1;
  expect_error([&] { attention_decode(ctx, {2, 2, 4}, q, {&kv, 1}, {&len, 1}, out); }, ErrorCode::kInvalidArgument,
               {"attention_decode", "cuda"});
}

TEST(CudaWiring, CopyOnTheCpu) {
  std::vector<float> v = test::random_floats(6 * 10, 7);
  Tensor src = test::f32_tensor(v, 6, 10), dst = Tensor::zeros(DType::kF32, {6, 4});
  Context ctx(1);
  copy(ctx, src.view().slice_cols(3, 4), dst);  // a strided column slice into a dense tensor
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(dst.ptr<float>()[r * 4 + c], v[static_cast<std::size_t>(r * 10 + 3 + c)]);
  Tensor other = Tensor::zeros(DType::kBF16, {6, 4});
  expect_error([&] { copy(ctx, dst, other); }, ErrorCode::kInvalidArgument, {"copy", "dtype"});
}

TEST(CudaWiring, ConvertDequantisesBlockTypes) {
  const std::int64_t rows = 3, cols = 64;
  std::vector<float> v = test::random_floats(static_cast<std::size_t>(rows * cols), 11);
  Tensor q4 = Tensor::empty(DType::kQ4_1, {rows, cols}), q8 = Tensor::empty(DType::kQ8_0, {rows, cols});
  for (std::int64_t r = 0; r < rows; ++r) {
    quantize_row_q4_1(v.data() + r * cols, static_cast<BlockQ4_1*>(q4.view().row_ptr(r)), cols);
    quantize_row_q8_0(v.data() + r * cols, static_cast<BlockQ8_0*>(q8.view().row_ptr(r)), cols);
  }
  Context ctx(1);
  for (const Tensor* q : {&q4, &q8}) {
    Tensor out = Tensor::empty(DType::kBF16, {rows, cols});
    convert(ctx, *q, out);
    std::vector<float> want(static_cast<std::size_t>(cols));
    for (std::int64_t r = 0; r < rows; ++r) {
      dequantize_row(q->view().dtype, q->view().row_ptr(r), want.data(), cols);
      for (std::int64_t c = 0; c < cols; ++c)
        EXPECT_EQ(out.ptr<std::uint16_t>()[r * cols + c], f32_to_bf16(want[static_cast<std::size_t>(c)]));
    }
  }
  Tensor f = Tensor::zeros(DType::kF32, {rows, cols});
  expect_error([&] { convert(ctx, f, q8); }, ErrorCode::kUnsupported, {"convert", "q8_0"});
}

}  // namespace
}  // namespace trellis::kernels
