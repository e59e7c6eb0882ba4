// Every CUDA op against the CPU kernel on the same random inputs (the ggml test-backend-ops
// pattern), with a bound per op and dtype. Needs a GPU: without one (or without the CUDA
// backend) main() prints "no CUDA device: <reason>" and exits 77, which CTest reports as
// skipped (SKIP_RETURN_CODE 77, label gpu).
//
// Bounds (|gpu - cpu| <= atol + rtol |cpu|, or in terms of s = sum_k |x_k w_k| for matmul):
//  * matmul, f32 weights (cuBLASLt f32) and the GEMV (x kept in f32): 1e-5 s + 1e-6; only the
//    order of the f32 sums differs.
//  * matmul through cuBLASLt with bf16 / f16 weights: x is rounded to the weight type
//    (relative error 2^-9 / 2^-12 per element), so 2^-8 s / 2^-10 s.
//  * convert, embedding, kv_write: bit-exact (the same round-to-nearest-even conversions).
//  * rms_norm, add_bias, add, swiglu, softmax_rows, RoPE: 2e-6 + 2e-6 relative (expf and the
//    order of the sums; RoPE's cos/sin come from the same double angles).
//  * attention: 2e-5 + 1e-4 relative, as the CPU attention test.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>

#include "../harness/gpu_main.hpp"
#include "kernel_test_util.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

using test::random_floats;
using test::store;

Context& gpu() {
  static Context ctx(Device::kCuda, 0);
  return ctx;
}
Context& cpu() {
  static Context ctx(2);
  return ctx;
}

Tensor to_gpu(const TensorView& host) {
  std::vector<std::int64_t> shape(host.shape.begin(), host.shape.begin() + host.ndim);
  Tensor t = Tensor::empty(host.dtype, shape, Device::kCuda);
  copy(gpu(), host, t);
  return t;
}

Tensor to_host(const TensorView& dev) {
  std::vector<std::int64_t> shape(dev.shape.begin(), dev.shape.begin() + dev.ndim);
  Tensor t = Tensor::empty(dev.dtype, shape);
  copy(gpu(), dev, t);  // waits for the stream
  return t;
}

void expect_near(const Tensor& got, const Tensor& want, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel());
  std::vector<double> w(static_cast<std::size_t>(want.numel()));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = want.ptr<float>()[i];
  test::expect_close(got.ptr<float>(), w, atol, rtol, what.c_str());
}

void expect_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.bytes(), want.bytes());
  const auto* a = got.ptr<unsigned char>();
  const auto* b = want.ptr<unsigned char>();
  for (std::size_t i = 0; i < got.bytes(); ++i)
    if (a[i] != b[i]) {
      ADD_FAILURE() << what << ": byte " << i << " differs";
      return;
    }
}

// ---- memory ----------------------------------------------------------------------------

TEST(Cuda, CopyRoundTripsStridedViews) {
  std::vector<float> v = random_floats(7 * 12, 1);
  Tensor host = test::f32_tensor(v, 7, 12);
  Tensor dev = to_gpu(host);
  Tensor part = Tensor::zeros(DType::kF32, {7, 5}, Device::kCuda);
  copy(gpu(), dev.view().slice_cols(4, 5), part);  // device to device, strided source
  Tensor back = to_host(part);
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 5; ++c) EXPECT_EQ(back.ptr<float>()[r * 5 + c], v[static_cast<std::size_t>(r * 12 + 4 + c)]);
}

TEST(Cuda, AllocationFailureSaysBytes) {
  try {
    (void)Tensor::empty(DType::kF32, {std::int64_t{1} << 46}, Device::kCuda);  // 256 TiB
    ADD_FAILURE() << "allocated 256 TiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
    EXPECT_NE(std::string(e.what()).find("bytes requested"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free"), std::string::npos) << e.what();
  }
  Tensor ok = Tensor::zeros(DType::kF32, {4}, Device::kCuda);  // the GPU still works after it
  EXPECT_EQ(to_host(ok).ptr<float>()[3], 0.0f);
}

TEST(Cuda, RefusesHostOperands) {
  Tensor x = Tensor::zeros(DType::kF32, {2, 8}), y = Tensor::zeros(DType::kF32, {2, 8}, Device::kCuda);
  EXPECT_THROW(add(gpu(), x, y, y), Error);
}

// A Download's copy starts only after the work queued on the context's stream before
// start() (here a chain of adds into y), runs on its own stream, and its two slots hold
// independent copies; waiting on a slot with no copy started is refused.
TEST(Cuda, DownloadWaitsForQueuedWorkAndKeepsSlotsApart) {
  const std::int64_t n = 1 << 22;
  Tensor one = to_gpu(test::f32_tensor(std::vector<float>(static_cast<std::size_t>(n), 1.0f), 1, n));
  Tensor y = Tensor::zeros(DType::kF32, {1, n}, Device::kCuda), z = Tensor::zeros(DType::kF32, {1, n}, Device::kCuda);
  Download d(gpu(), 2);
  EXPECT_EQ(d.slots(), 2);
  EXPECT_THROW(d.wait(0), Error);
  for (int i = 0; i < 50; ++i) add(gpu(), y, one, y);  // y = 50 when the copy may start
  d.start(0, y);
  add(gpu(), y, one, z);  // z = 51, queued after the copy's start
  d.start(1, z);
  Tensor w = Tensor::zeros(DType::kF32, {1, n}, Device::kCuda);
  for (int i = 0; i < 10; ++i) add(gpu(), w, one, w);  // more work while the copies run
  const auto* a = static_cast<const float*>(d.wait(0));
  const auto* b = static_cast<const float*>(d.wait(1));
  for (std::int64_t i = 0; i < n; i += 4099) {
    ASSERT_EQ(a[i], 50.0f) << "slot 0 element " << i;
    ASSERT_EQ(b[i], 51.0f) << "slot 1 element " << i;
  }
  EXPECT_EQ(a[n - 1], 50.0f);
  EXPECT_THROW(d.wait(0), Error) << "the slot's copy was already waited for";
  EXPECT_THROW(d.start(2, y), Error);
  Tensor wide = Tensor::zeros(DType::kF32, {2, 16}, Device::kCuda), host = Tensor::zeros(DType::kF32, {2, 16});
  EXPECT_THROW(d.start(0, wide.view().slice_cols(0, 8)), Error) << "a strided view is refused";
  EXPECT_THROW(d.start(0, host), Error) << "a host view is refused";
  gpu().synchronize();
}

// ---- matmul ----------------------------------------------------------------------------

struct MatmulCase {
  std::int64_t m, n, k;
  DType w;
  MatmulAlgo algo;
};

class CudaMatmul : public testing::TestWithParam<MatmulCase> {};

TEST_P(CudaMatmul, MatchesCpu) {
  const MatmulCase c = GetParam();
  std::vector<float> xf = random_floats(static_cast<std::size_t>(c.m * c.k), 3);
  std::vector<float> wf = random_floats(static_cast<std::size_t>(c.n * c.k), 4);
  std::vector<float> y0 = random_floats(static_cast<std::size_t>(c.m * c.n), 5);
  test::Stored x = store(xf, DType::kF32, c.m, c.k), w = store(wf, c.w, c.n, c.k);
  for (float beta : {0.0f, 0.5f}) {
    Tensor y_cpu = test::f32_tensor(y0, c.m, c.n);
    matmul(cpu(), x.tensor, w.tensor, y_cpu, {beta, MatmulAlgo::kAuto});
    Tensor xd = to_gpu(x.tensor), wd = to_gpu(w.tensor), yd = to_gpu(test::f32_tensor(y0, c.m, c.n));
    matmul(gpu(), xd, wd, yd, {beta, c.algo});
    Tensor y = to_host(yd);
    // The GEMV (M <= 8, 16-bit weights, K a multiple of 8, aligned rows) keeps x in f32;
    // cuBLASLt with 16-bit weights rounds x to their type.
    const bool gemv = c.w != DType::kF32 && c.k % 8 == 0 &&
                      (c.algo == MatmulAlgo::kGemv || (c.algo == MatmulAlgo::kAuto && c.m <= 8));
    const bool rounds_x = c.w != DType::kF32 && !gemv;
    const double rel = !rounds_x ? 1e-5 : c.w == DType::kBF16 ? 1.0 / 256 : 1.0 / 1024;
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j) {
        double s = 0;
        for (std::int64_t q = 0; q < c.k; ++q)
          s += std::abs(static_cast<double>(x.exact[static_cast<std::size_t>(i * c.k + q)]) *
                        w.exact[static_cast<std::size_t>(j * c.k + q)]);
        const double got = y.ptr<float>()[i * c.n + j], want = y_cpu.ptr<float>()[i * c.n + j];
        ASSERT_LE(std::abs(got - want), rel * s + 1e-6 + 1e-6 * std::abs(want))
            << "y[" << i << "," << j << "] beta " << beta << " M=" << c.m << " N=" << c.n << " K=" << c.k << " "
            << to_string(c.w);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMatmul,
    testing::Values(MatmulCase{1, 67, 96, DType::kBF16, MatmulAlgo::kAuto},     // GEMV, N not a multiple of 16
                    MatmulCase{3, 257, 520, DType::kBF16, MatmulAlgo::kGemv},   // GEMV, K not a multiple of 256
                    MatmulCase{8, 512, 2048, DType::kBF16, MatmulAlgo::kAuto},  // GEMV, the largest M
                    MatmulCase{5, 130, 264, DType::kF16, MatmulAlgo::kAuto},    // GEMV, f16
                    MatmulCase{4, 96, 128, DType::kBF16, MatmulAlgo::kGemm},    // small M forced to cuBLASLt
                    MatmulCase{2, 100, 200, DType::kF32, MatmulAlgo::kAuto},    // f32 weights: cuBLASLt
                    MatmulCase{33, 100, 200, DType::kF32, MatmulAlgo::kAuto},
                    MatmulCase{64, 384, 1024, DType::kBF16, MatmulAlgo::kAuto}, // prefill, bf16
                    MatmulCase{17, 96, 72, DType::kF16, MatmulAlgo::kAuto},
                    MatmulCase{7, 64, 3, DType::kBF16, MatmulAlgo::kAuto},      // K % 8 != 0: cuBLASLt
                    // The GEMV's blocks split K over 8 warps (2048 weights a step) and own 8
                    // rows at M <= 2, 4 above: one weight chunk, a ragged last step, ragged rows.
                    MatmulCase{1, 1, 8, DType::kBF16, MatmulAlgo::kAuto},
                    MatmulCase{2, 9, 4104, DType::kBF16, MatmulAlgo::kAuto},
                    MatmulCase{8, 3, 2056, DType::kF16, MatmulAlgo::kAuto},
                    MatmulCase{1, 2050, 2048, DType::kBF16, MatmulAlgo::kAuto},
                    MatmulCase{6, 70, 8192, DType::kBF16, MatmulAlgo::kGemv}));

TEST(Cuda, MatmulColumnSliceAndErrors) {
  // A column slice of x (a fused buffer) and of y: leading dimensions larger than the columns.
  std::vector<float> xf = random_floats(4 * 160, 6), wf = random_floats(48 * 128, 7);
  test::Stored x = store(xf, DType::kF32, 4, 160), w = store(wf, DType::kBF16, 48, 128);
  Tensor y_cpu = Tensor::zeros(DType::kF32, {4, 64});
  matmul(cpu(), x.tensor.view().slice_cols(32, 128), w.tensor, y_cpu.view().slice_cols(8, 48));
  Tensor xd = to_gpu(x.tensor), wd = to_gpu(w.tensor), yd = Tensor::zeros(DType::kF32, {4, 64}, Device::kCuda);
  matmul(gpu(), xd.view().slice_cols(32, 128), wd, yd.view().slice_cols(8, 48));
  expect_near(to_host(yd), y_cpu, 1e-4, 1e-5, "sliced gemv");
  Tensor q = Tensor::zeros(DType::kQ8_0, {48, 128}, Device::kCuda);
  Tensor xs = Tensor::zeros(DType::kF32, {4, 128}, Device::kCuda);
  EXPECT_THROW(matmul(gpu(), xs, q, Tensor::zeros(DType::kF32, {4, 48}, Device::kCuda)), Error);
}

// ---- elementwise -----------------------------------------------------------------------

TEST(Cuda, ElementwiseOps) {
  const std::int64_t rows = 5, cols = 1000;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  Tensor a = test::f32_tensor(random_floats(n, 10, 4.0f), rows, cols), b = test::f32_tensor(random_floats(n, 11), rows, cols);
  Tensor ad = to_gpu(a), bd = to_gpu(b), od = Tensor::empty(DType::kF32, {rows, cols}, Device::kCuda);
  Tensor o = Tensor::empty(DType::kF32, {rows, cols});
  add(cpu(), a, b, o);
  add(gpu(), ad, bd, od);
  expect_near(to_host(od), o, 0, 0, "add");
  swiglu(cpu(), a, b, o);
  swiglu(gpu(), ad, bd, od);
  expect_near(to_host(od), o, 2e-6, 2e-6, "swiglu");
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    test::Stored w = store(random_floats(static_cast<std::size_t>(cols), 12), t, 1, cols);
    Tensor wd = to_gpu(w.tensor);
    rms_norm(cpu(), a, w.tensor, 1e-5f, o);
    rms_norm(gpu(), ad, wd, 1e-5f, od);
    expect_near(to_host(od), o, 2e-6, 2e-6, "rms_norm " + std::string(to_string(t)));
    Tensor y = test::f32_tensor(random_floats(n, 13), rows, cols), yd = to_gpu(y);
    add_bias(cpu(), y, w.tensor);
    add_bias(gpu(), yd, wd);
    expect_near(to_host(yd), y, 0, 0, "add_bias " + std::string(to_string(t)));
  }
  std::vector<float> s = random_floats(n, 14, 20.0f);
  for (std::int64_t c = 0; c < cols; ++c) s[static_cast<std::size_t>(2 * cols + c)] = -INFINITY;  // a masked row
  Tensor sm = test::f32_tensor(s, rows, cols), smd = to_gpu(sm);
  softmax_rows(cpu(), sm);
  softmax_rows(gpu(), smd);
  expect_near(to_host(smd), sm, 2e-6, 2e-6, "softmax_rows");
}

TEST(Cuda, ConvertAndDequantise) {
  const std::int64_t rows = 6, cols = 96;
  std::vector<float> v = random_floats(static_cast<std::size_t>(rows * cols), 20, 3.0f);
  Tensor f = test::f32_tensor(v, rows, cols), fd = to_gpu(f);
  for (DType t : {DType::kBF16, DType::kF16}) {
    Tensor h = Tensor::empty(t, {rows, cols}), hd = Tensor::empty(t, {rows, cols}, Device::kCuda);
    convert(cpu(), f, h);
    convert(gpu(), fd, hd);
    expect_bits(to_host(hd), h, "convert f32 -> " + std::string(to_string(t)));
    Tensor back = Tensor::empty(DType::kF32, {rows, cols}), backd = Tensor::empty(DType::kF32, {rows, cols}, Device::kCuda);
    convert(cpu(), h, back);
    convert(gpu(), hd, backd);
    expect_bits(to_host(backd), back, "convert back to f32");
  }
  Tensor q4 = Tensor::empty(DType::kQ4_1, {rows, cols}), q8 = Tensor::empty(DType::kQ8_0, {rows, cols});
  for (std::int64_t r = 0; r < rows; ++r) {
    quantize_row_q4_1(v.data() + r * cols, static_cast<BlockQ4_1*>(q4.view().row_ptr(r)), cols);
    quantize_row_q8_0(v.data() + r * cols, static_cast<BlockQ8_0*>(q8.view().row_ptr(r)), cols);
  }
  for (const Tensor* q : {&q4, &q8}) {
    Tensor qd = to_gpu(*q);
    for (DType t : {DType::kBF16, DType::kF32}) {
      Tensor h = Tensor::empty(t, {rows, cols}), hd = Tensor::empty(t, {rows, cols}, Device::kCuda);
      convert(cpu(), *q, h);
      convert(gpu(), qd, hd);
      expect_bits(to_host(hd), h, "dequantise " + std::string(to_string(q->view().dtype)) + " -> " + std::string(to_string(t)));
    }
  }
}

// Activations already in the weight's 16-bit type go to cuBLASLt as they are: the result
// equals the CPU's matmul on those rounded activations (f32 accumulation, another order).
TEST(Cuda, MatmulTakesSixteenBitActivations) {
  const std::int64_t m = 24, n = 80, k = 264;
  std::vector<float> xf = random_floats(static_cast<std::size_t>(m * k), 30), wf = random_floats(static_cast<std::size_t>(n * k), 31);
  for (DType t : {DType::kBF16, DType::kF16}) {
    test::Stored w = store(wf, t, n, k);
    Tensor x32 = test::f32_tensor(xf, m, k), x16 = Tensor::empty(t, {m, k}), xr = Tensor::empty(DType::kF32, {m, k});
    convert(cpu(), x32, x16);
    convert(cpu(), x16, xr);  // the activations as the GPU sees them
    Tensor y_cpu = Tensor::zeros(DType::kF32, {m, n});
    matmul(cpu(), xr, w.tensor, y_cpu);
    Tensor yd = Tensor::zeros(DType::kF32, {m, n}, Device::kCuda);
    matmul(gpu(), to_gpu(x16), to_gpu(w.tensor), yd);
    expect_near(to_host(yd), y_cpu, 1e-4, 1e-5, "16-bit x " + std::string(to_string(t)));
    EXPECT_THROW(matmul(cpu(), x16, w.tensor, y_cpu), Error) << "the CPU takes f32 activations only";
  }
}

// The model's prefill asks rms_norm and swiglu for 16-bit output, which the GEMM after them
// takes as it is: it must be exactly the f32 result rounded, as matmul's own conversion
// rounds it (so tokens do not change), and the CPU must keep refusing it.
TEST(Cuda, NormAndSwigluWriteSixteenBitForTheGemm) {
  const std::int64_t rows = 17, cols = 520;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  Tensor ad = to_gpu(test::f32_tensor(random_floats(n, 40, 4.0f), rows, cols));
  Tensor bd = to_gpu(test::f32_tensor(random_floats(n, 41), rows, cols));
  Tensor wd = to_gpu(store(random_floats(static_cast<std::size_t>(cols), 42), DType::kBF16, 1, cols).tensor);
  Tensor f32 = Tensor::empty(DType::kF32, {rows, cols}, Device::kCuda);
  for (DType t : {DType::kBF16, DType::kF16}) {
    Tensor half = Tensor::empty(t, {rows, cols}, Device::kCuda), want = Tensor::empty(t, {rows, cols}, Device::kCuda);
    rms_norm(gpu(), ad, wd, 1e-5f, f32);
    convert(gpu(), f32, want);
    rms_norm(gpu(), ad, wd, 1e-5f, half);
    expect_bits(to_host(half), to_host(want), "rms_norm -> " + std::string(to_string(t)));
    swiglu(gpu(), ad, bd, f32);
    convert(gpu(), f32, want);
    swiglu(gpu(), ad, bd, half);
    expect_bits(to_host(half), to_host(want), "swiglu -> " + std::string(to_string(t)));
    EXPECT_THROW(rms_norm(cpu(), to_host(ad), to_host(wd), 1e-5f, Tensor::empty(t, {rows, cols})), Error);
  }
  EXPECT_THROW(add(gpu(), ad, bd, Tensor::empty(DType::kBF16, {rows, cols}, Device::kCuda)), Error) << "add stays f32";
}

// f32 -> 16-bit conversion has a vectorised path (columns and leading dimensions multiples
// of 8, 16-byte aligned rows) and a general one; both round exactly as the CPU does.
TEST(Cuda, ConvertVectorisedAndGeneralPaths) {
  const std::int64_t rows = 5, width = 2072;
  std::vector<float> v = random_floats(static_cast<std::size_t>(rows * width), 40, 1e4f);
  v[7] = std::numeric_limits<float>::infinity();
  v[9] = -0.0f;
  v[11] = 3.0e38f;  // rounds to bf16 infinity
  Tensor f = test::f32_tensor(v, rows, width), fd = to_gpu(f);
  struct Slice {
    std::int64_t begin, cols;
  };
  // Vectorised: whole rows, an aligned slice past 2048 columns; general: a ragged width, a
  // slice whose rows start 4 bytes off.
  for (Slice sl : {Slice{0, width}, Slice{8, 2056}, Slice{0, 100}, Slice{1, 96}}) {
    for (DType t : {DType::kBF16, DType::kF16}) {
      Tensor h = Tensor::empty(t, {rows, sl.cols}), hd = Tensor::empty(t, {rows, sl.cols}, Device::kCuda);
      convert(cpu(), f.view().slice_cols(sl.begin, sl.cols), h);
      convert(gpu(), fd.view().slice_cols(sl.begin, sl.cols), hd);
      expect_bits(to_host(hd), h, "convert f32 -> " + std::string(to_string(t)) + " cols " + std::to_string(sl.begin) + "+" +
                                      std::to_string(sl.cols));
    }
  }
}

// Host arrays reach the GPU through the context's pinned ring (two 1 MiB halves): 600
// uploads of 4 KiB queued without a wait wrap it twice while earlier copies may still be
// pending, and every lookup must still see its own tokens.
TEST(Cuda, UploadsWrapThePinnedRing) {
  const std::int64_t vocab = 300, dim = 16, n = 1024;
  Tensor table = test::f32_tensor(random_floats(static_cast<std::size_t>(vocab * dim), 50), vocab, dim);
  Tensor td = to_gpu(table);
  std::vector<std::vector<std::int32_t>> ids(600);
  std::vector<Tensor> outs;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i].resize(static_cast<std::size_t>(n));
    for (std::int64_t t = 0; t < n; ++t) ids[i][static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7 + i * 13) % vocab);
    outs.push_back(Tensor::empty(DType::kF32, {n, dim}, Device::kCuda));
    embedding(gpu(), td, ids[i], 0, outs.back());
    for (auto& v : ids[i]) v = -1;  // the caller may reuse its array at once
  }
  for (std::size_t i = 0; i < ids.size(); i += 37) {
    for (std::int64_t t = 0; t < n; ++t) ids[i][static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7 + i * 13) % vocab);
    Tensor o = Tensor::empty(DType::kF32, {n, dim});
    embedding(cpu(), table, ids[i], 0, o);
    expect_bits(to_host(outs[i]), o, "lookup " + std::to_string(i));
  }
}

// A captured decode-shaped step (embedding, RoPE, KV write, decode attention, GEMV, add)
// replayed with new tokens, positions and slots computes what the same ops compute eagerly:
// the KV caches end bit-identical and every step's output agrees (the graph splits the keys
// by capacity, eager by length: another summation order). A replay whose body stages a
// different amount of input is refused; one after the scratch moved returns false. Every
// third step is filled ahead (prefill) with wrong token ids and launched with the right ones
// written in (launch_prefilled), as the engine does while the step before still runs.
TEST(Cuda, GraphReplayMatchesEagerSteps) {
  const int heads = 4, kv_heads = 2, hd = 32, B = 2;
  const std::int64_t vocab = 50, H = heads * hd, kvw = kv_heads * hd, cap = 300;
  const AttentionDims dims{heads, kv_heads, hd};
  RopeConfig rc;
  rc.head_dim = hd;
  RopeTable rope(rc, cap);
  Tensor table = to_gpu(test::f32_tensor(random_floats(static_cast<std::size_t>(vocab * (H + 2 * kvw)), 60), vocab, H + 2 * kvw));
  Tensor w = to_gpu(store(random_floats(static_cast<std::size_t>(H * H), 61), DType::kBF16, H, H).tensor);
  KvCache graph_kv(1, 3, kv_heads, cap, hd, DType::kBF16, Device::kCuda), eager_kv(1, 3, kv_heads, cap, hd, DType::kBF16, Device::kCuda);
  Tensor x = Tensor::empty(DType::kF32, {B, H + 2 * kvw}, Device::kCuda), attn = Tensor::empty(DType::kF32, {B, H}, Device::kCuda);
  Tensor y = Tensor::empty(DType::kF32, {B, H}, Device::kCuda);
  std::vector<std::int32_t> tokens(B), pos(B);
  std::vector<int> slots(B);
  auto step = [&](KvCache& kv) {
    embedding(gpu(), table, tokens, 0, x);
    apply_rope(gpu(), rope, x.view().slice_cols(0, H), heads, pos);
    apply_rope(gpu(), rope, x.view().slice_cols(H, kvw), kv_heads, pos);
    std::vector<KvView> views;
    std::vector<std::int64_t> lengths;
    for (int b = 0; b < B; ++b) {
      views.push_back(kv.view(0, slots[static_cast<std::size_t>(b)]));
      kv_write(gpu(), views.back(), x.view().slice_rows(b, 1).slice_cols(H, kvw), x.view().slice_rows(b, 1).slice_cols(H + kvw, kvw),
               pos[static_cast<std::size_t>(b)]);
      lengths.push_back(pos[static_cast<std::size_t>(b)] + 1);
    }
    attention_decode(gpu(), dims, x.view().slice_cols(0, H), views, lengths, attn);
    matmul(gpu(), attn, w, y);
    add(gpu(), y, attn, y);
  };
  // Diagnostics for a crash seen only on a GPU (docs/gpu-runs/README.md): with
  // TRELLIS_GRAPH_TEST_TRACE set each step is printed before it runs; with
  // TRELLIS_GRAPH_TEST_WARMUP set one eager step (into a third cache) runs before the capture,
  // as the engine does (it captures a batch size the second time it comes).
  const bool trace = std::getenv("TRELLIS_GRAPH_TEST_TRACE") != nullptr;
  if (std::getenv("TRELLIS_GRAPH_TEST_WARMUP") != nullptr) {
    KvCache warm_kv(1, 3, kv_heads, cap, hd, DType::kBF16, Device::kCuda);
    for (int b = 0; b < B; ++b) slots[static_cast<std::size_t>(b)] = b;
    step(warm_kv);
    gpu().synchronize();
  }
  OpGraph g(gpu());
  EXPECT_FALSE(g.captured());
  EXPECT_FALSE(g.replay([&] { step(graph_kv); })) << "nothing captured yet";
  for (int it = 0; it < 90; ++it) {
    if (trace) std::fprintf(stderr, "graph test: step %d (%s)\n", it, it == 0 ? "capture" : "replay"), std::fflush(stderr);
    for (int b = 0; b < B; ++b) {
      tokens[static_cast<std::size_t>(b)] = static_cast<std::int32_t>((it * 7 + b * 11) % vocab);
      pos[static_cast<std::size_t>(b)] = it + 40 * b;  // sequence 1 is 40 positions ahead
      slots[static_cast<std::size_t>(b)] = (b + (it >= 45 ? 1 : 0)) % 3;  // the slots move half way
    }
    if (it == 0) {
      g.capture([&] { step(graph_kv); });
    } else if (it % 3 == 0) {
      const std::vector<std::int32_t> real = tokens;
      for (auto& t : tokens) t = static_cast<std::int32_t>((t + 1 + it) % vocab);  // what a guess cannot know
      ASSERT_TRUE(g.prefill([&] { step(graph_kv); })) << "step " << it;
      EXPECT_TRUE(g.prefilled());
      tokens = real;
      ASSERT_TRUE(g.launch_prefilled(tokens)) << "step " << it;
      EXPECT_FALSE(g.prefilled());
      EXPECT_FALSE(g.launch_prefilled(tokens)) << "a fill launches once";
    } else {
      ASSERT_TRUE(g.replay([&] { step(graph_kv); })) << "step " << it;
    }
    Tensor got = to_host(y);
    step(eager_kv);
    expect_near(got, to_host(y), 1e-5, 1e-4, "step " + std::to_string(it));
  }
  for (int slot = 0; slot < 3; ++slot) {
    expect_bits(to_host(graph_kv.view(0, slot).k), to_host(eager_kv.view(0, slot).k), "K of slot " + std::to_string(slot));
    expect_bits(to_host(graph_kv.view(0, slot).v), to_host(eager_kv.view(0, slot).v), "V of slot " + std::to_string(slot));
  }
  if (trace) std::fprintf(stderr, "graph test: %s\n", "caches compared"), std::fflush(stderr);
  EXPECT_GT(g.staged_bytes(), 0u);
  // A fill for other token counts is not launched (and is dropped); nor is a dropped one.
  ASSERT_TRUE(g.prefill([&] { step(graph_kv); }));
  EXPECT_FALSE(g.launch_prefilled(std::span<const std::int32_t>(tokens).first(1)));
  EXPECT_FALSE(g.prefilled());
  ASSERT_TRUE(g.prefill([&] { step(graph_kv); }));
  g.drop_prefill();
  EXPECT_FALSE(g.launch_prefilled(tokens));
  EXPECT_THROW(g.replay([&] { embedding(gpu(), table, tokens, 0, x); }), Error) << "a different body";
  if (trace) std::fprintf(stderr, "graph test: %s\n", "a different body refused"), std::fflush(stderr);
  EXPECT_THROW(g.replay([&] { (void)to_host(y); }), Error) << "host copies are refused in a body";
  if (trace) std::fprintf(stderr, "graph test: %s\n", "a host copy refused"), std::fflush(stderr);
  // The scratch grows (a larger upload elsewhere): the graph's addresses are stale.
  std::vector<std::int32_t> many(1 << 18, 1);
  Tensor big = Tensor::empty(DType::kF32, {1 << 18, H + 2 * kvw}, Device::kCuda);
  embedding(gpu(), table, many, 0, big);
  if (trace) std::fprintf(stderr, "graph test: %s\n", "scratch grown"), std::fflush(stderr);
  EXPECT_FALSE(g.replay([&] { step(graph_kv); }));
  if (trace) std::fprintf(stderr, "graph test: %s\n", "stale replay refused"), std::fflush(stderr);
  EXPECT_FALSE(g.prefill([&] { step(graph_kv); })) << "nor filled ahead";
  gpu().synchronize();
}

TEST(Cuda, EmbeddingVocabParallel) {
  const std::int64_t vocab = 40, dim = 64, begin = 100;
  std::vector<float> v = random_floats(static_cast<std::size_t>(vocab * dim), 30);
  const std::vector<std::int32_t> tokens = {100, 139, 5, 120, 140, 101};  // 5 and 140 are outside the slice
  Tensor q8 = Tensor::empty(DType::kQ8_0, {vocab, dim});
  for (std::int64_t r = 0; r < vocab; ++r)
    quantize_row_q8_0(v.data() + r * dim, static_cast<BlockQ8_0*>(q8.view().row_ptr(r)), dim);
  std::vector<Tensor> tables;
  tables.push_back(store(v, DType::kF32, vocab, dim).tensor);
  tables.push_back(store(v, DType::kBF16, vocab, dim).tensor);
  tables.push_back(std::move(q8));
  for (const Tensor& t : tables) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    Tensor o = Tensor::empty(DType::kF32, {n, dim}), od = Tensor::empty(DType::kF32, {n, dim}, Device::kCuda);
    embedding(cpu(), t, tokens, begin, o);
    embedding(gpu(), to_gpu(t), tokens, begin, od);
    expect_bits(to_host(od), o, "embedding " + std::string(to_string(t.view().dtype)));
  }
}

TEST(Cuda, RopeMatchesTheTable) {
  RopeConfig cfg;
  cfg.head_dim = 128;
  cfg.theta = 500000.0;
  cfg.scaling = RopeScaling::kLlama3;
  RopeTable table(cfg, 4096);
  const int heads = 3;
  const std::vector<std::int32_t> pos = {0, 1, 17, 4095, 2048};
  std::vector<float> v = random_floats(pos.size() * heads * 128, 40);
  // A column slice (the q part of a fused qkv buffer): row stride > columns.
  Tensor wide = test::f32_tensor(std::vector<float>(pos.size() * 500, 0.0f), static_cast<std::int64_t>(pos.size()), 500);
  for (std::size_t r = 0; r < pos.size(); ++r)
    std::memcpy(wide.ptr<float>() + r * 500 + 7, v.data() + r * heads * 128, heads * 128 * sizeof(float));
  Tensor wd = to_gpu(wide);
  apply_rope(cpu(), table, wide.view().slice_cols(7, heads * 128), heads, pos);
  apply_rope(gpu(), table, wd.view().slice_cols(7, heads * 128), heads, pos);
  expect_near(to_host(wd), wide, 2e-6, 2e-6, "rope");
}

// ---- attention -------------------------------------------------------------------------

struct AttnCase {
  int heads, kv_heads, head_dim;
  DType cache;
};

class CudaAttention : public testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, PrefillChunksThenDecode) {
  const AttnCase c = GetParam();
  const AttentionDims dims{c.heads, c.kv_heads, c.head_dim};
  const std::int64_t cap = 1100, qw = std::int64_t{c.heads} * c.head_dim, kw = std::int64_t{c.kv_heads} * c.head_dim;
  const std::vector<std::int64_t> lengths = {1, 300, 1030};  // decode lengths after prefill
  KvCache hc(1, 3, c.kv_heads, cap, c.head_dim, c.cache);
  KvCache dc(1, 3, c.kv_heads, cap, c.head_dim, c.cache, Device::kCuda);
  std::uint32_t seed = 50;
  for (int b = 0; b < 3; ++b) {
    // Prefill lengths[b] - 1 tokens in chunks (the second starts at an offset), then decode one.
    const std::int64_t total = lengths[static_cast<std::size_t>(b)] - 1;
    for (std::int64_t start = 0; start < total;) {
      const std::int64_t t = std::min<std::int64_t>(total - start, start == 0 ? 13 : 700);
      Tensor k = test::f32_tensor(random_floats(static_cast<std::size_t>(t * kw), seed++), t, kw);
      Tensor v = test::f32_tensor(random_floats(static_cast<std::size_t>(t * kw), seed++), t, kw);
      Tensor q = test::f32_tensor(random_floats(static_cast<std::size_t>(t * qw), seed++), t, qw);
      kv_write(cpu(), hc.view(0, b), k, v, start);
      kv_write(gpu(), dc.view(0, b), to_gpu(k), to_gpu(v), start);
      Tensor o = Tensor::empty(DType::kF32, {t, qw}), od = Tensor::empty(DType::kF32, {t, qw}, Device::kCuda);
      attention_prefill(cpu(), dims, q, hc.view(0, b), start, o);
      attention_prefill(gpu(), dims, to_gpu(q), dc.view(0, b), start, od);
      expect_near(to_host(od), o, 2e-5, 1e-4, "prefill chunk at " + std::to_string(start));
      // A 16-bit output (the model's prefill, for the o-projection GEMM): the f32 result rounded.
      Tensor o16 = Tensor::empty(DType::kBF16, {t, qw}, Device::kCuda), want16 = Tensor::empty(DType::kBF16, {t, qw}, Device::kCuda);
      attention_prefill(gpu(), dims, to_gpu(q), dc.view(0, b), start, o16);
      convert(gpu(), od, want16);
      expect_bits(to_host(o16), to_host(want16), "bf16 prefill output at " + std::to_string(start));
      start += t;
    }
  }
  Tensor kn = test::f32_tensor(random_floats(static_cast<std::size_t>(3 * kw), seed++), 3, kw);
  Tensor vn = test::f32_tensor(random_floats(static_cast<std::size_t>(3 * kw), seed++), 3, kw);
  Tensor q = test::f32_tensor(random_floats(static_cast<std::size_t>(3 * qw), seed++), 3, qw);
  Tensor knd = to_gpu(kn), vnd = to_gpu(vn);
  std::vector<KvView> hv, dv;
  for (int b = 0; b < 3; ++b) {
    const std::int64_t pos = lengths[static_cast<std::size_t>(b)] - 1;
    kv_write(cpu(), hc.view(0, b), kn.view().slice_rows(b, 1), vn.view().slice_rows(b, 1), pos);
    kv_write(gpu(), dc.view(0, b), knd.view().slice_rows(b, 1), vnd.view().slice_rows(b, 1), pos);
    hv.push_back(hc.view(0, b));
    dv.push_back(dc.view(0, b));
  }
  // kv_write stored the same bits (whole planes: unused positions are zero on both).
  for (int b = 0; b < 3; ++b) {
    Tensor k_back = to_host(dc.view(0, b).k), v_back = to_host(dc.view(0, b).v);
    Tensor k_want = Tensor::empty(c.cache, {c.kv_heads, cap, c.head_dim}), v_want = Tensor::empty(c.cache, {c.kv_heads, cap, c.head_dim});
    copy(cpu(), hc.view(0, b).k, k_want);
    copy(cpu(), hc.view(0, b).v, v_want);
    expect_bits(k_back, k_want, "kv_write keys");
    expect_bits(v_back, v_want, "kv_write values");
  }
  Tensor o = Tensor::empty(DType::kF32, {3, qw}), od = Tensor::empty(DType::kF32, {3, qw}, Device::kCuda);
  attention_decode(cpu(), dims, q, hv, lengths, o);
  attention_decode(gpu(), dims, to_gpu(q), dv, lengths, od);
  expect_near(to_host(od), o, 2e-5, 1e-4, "decode");
  // One sequence alone (the split-K path with few rows).
  Tensor o1 = Tensor::empty(DType::kF32, {1, qw}), od1 = Tensor::empty(DType::kF32, {1, qw}, Device::kCuda);
  Tensor qd = to_gpu(q);
  attention_decode(cpu(), dims, q.view().slice_rows(2, 1), {&hv[2], 1}, {&lengths[2], 1}, o1);
  attention_decode(gpu(), dims, qd.view().slice_rows(2, 1), {&dv[2], 1}, {&lengths[2], 1}, od1);
  expect_near(to_host(od1), o1, 2e-5, 1e-4, "decode, one long sequence");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         testing::Values(AttnCase{8, 2, 64, DType::kF32}, AttnCase{8, 2, 64, DType::kBF16},
                                         AttnCase{4, 4, 128, DType::kBF16}, AttnCase{32, 2, 80, DType::kF32},
                                         AttnCase{6, 1, 256, DType::kBF16}));

}  // namespace
}  // namespace trellis::kernels

// Exit 77 (CTest: skipped) with the reason when there is nothing to run on.
int main(int argc, char** argv) { return trellis::test::gpu_test_main(argc, argv); }
