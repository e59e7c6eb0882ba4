// Elementwise/normalisation ops, RoPE, conversions, the thread pool and the triad, each
// against a scalar reference.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <numbers>
#include <thread>

#include "kernels/kernel_test_util.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

using test::expect_close;
using test::f32_tensor;
using test::random_floats;
using test::store;

class OpsTest : public ::testing::TestWithParam<int> {
 protected:
  Context ctx{GetParam()};
};

TEST_P(OpsTest, RmsNormPerWeightDtype) {
  const std::int64_t rows = 7, d = 333;
  auto xs = random_floats(static_cast<std::size_t>(rows * d), 1, 3.0f);
  auto ws = random_floats(static_cast<std::size_t>(d), 2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto x = f32_tensor(xs, rows, d);
    auto w = store(ws, t, 1, d);
    Tensor y = Tensor::empty(DType::kF32, {rows, d});
    rms_norm(ctx, x, w.tensor.view(), 1e-5f, y);
    std::vector<double> want;
    for (std::int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (std::int64_t i = 0; i < d; ++i) ss += double(xs[std::size_t(r * d + i)]) * xs[std::size_t(r * d + i)];
      double inv = 1.0 / std::sqrt(ss / d + 1e-5);
      for (std::int64_t i = 0; i < d; ++i) want.push_back(xs[std::size_t(r * d + i)] * inv * w.exact[std::size_t(i)]);
    }
    expect_close(y.ptr<float>(), want, 1e-5, 1e-5, "rms_norm");
    rms_norm(ctx, x, w.tensor.view(), 1e-5f, x);  // in place
    expect_close(x.ptr<float>(), want, 1e-5, 1e-5, "rms_norm in place");
  }
}

TEST_P(OpsTest, SwigluAddSoftmaxBias) {
  const std::int64_t rows = 5, n = 1001;
  auto gs = random_floats(std::size_t(rows * n), 3, 6.0f), us = random_floats(std::size_t(rows * n), 4);
  auto g = f32_tensor(gs, rows, n), u = f32_tensor(us, rows, n);
  Tensor o = Tensor::empty(DType::kF32, {rows, n});
  swiglu(ctx, g, u, o);
  std::vector<double> want(gs.size());
  for (std::size_t i = 0; i < gs.size(); ++i) want[i] = gs[i] / (1.0 + std::exp(-double(gs[i]))) * us[i];
  expect_close(o.ptr<float>(), want, 1e-6, 1e-5, "swiglu");

  add(ctx, g, u, g);  // out aliases a
  for (std::size_t i = 0; i < gs.size(); ++i) want[i] = double(gs[i]) + us[i];
  expect_close(g.ptr<float>(), want, 1e-6, 1e-6, "add");

  auto bias = store(random_floats(std::size_t(n), 5), DType::kBF16, 1, n);
  add_bias(ctx, u, bias.tensor.view());
  for (std::size_t i = 0; i < us.size(); ++i) want[i] = double(us[i]) + bias.exact[i % std::size_t(n)];
  expect_close(u.ptr<float>(), want, 1e-6, 1e-6, "add_bias");

  auto s = f32_tensor(gs, rows, n);
  s.ptr<float>()[3] = -INFINITY;  // a masked entry
  softmax_rows(ctx, s);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mx = -1e30, sum = 0;
    for (std::int64_t i = 0; i < n; ++i)
      if (!(r == 0 && i == 3)) mx = std::max(mx, double(gs[std::size_t(r * n + i)]));
    for (std::int64_t i = 0; i < n; ++i) sum += (r == 0 && i == 3) ? 0 : std::exp(gs[std::size_t(r * n + i)] - mx);
    for (std::int64_t i = 0; i < n; ++i)
      want[std::size_t(r * n + i)] = (r == 0 && i == 3) ? 0 : std::exp(gs[std::size_t(r * n + i)] - mx) / sum;
  }
  expect_close(s.ptr<float>(), want, 1e-7, 1e-5, "softmax");
}

TEST_P(OpsTest, EmbeddingVocabParallel) {
  const std::int64_t v = 50, d = 40, begin = 100;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto table = store(random_floats(std::size_t(v * d), 6), t, v, d);
    std::vector<std::int32_t> tokens = {100, 149, 99, 150, 120, 0};
    Tensor out = Tensor::empty(DType::kF32, {std::int64_t(tokens.size()), d});
    embedding(ctx, table.tensor.view(), tokens, begin, out);
    std::vector<double> want;
    for (auto tok : tokens)
      for (std::int64_t i = 0; i < d; ++i)
        want.push_back(tok >= begin && tok < begin + v ? table.exact[std::size_t((tok - begin) * d + i)] : 0.0);
    expect_close(out.ptr<float>(), want, 0, 0, "embedding");
  }
  Tensor table = Tensor::zeros(DType::kF32, {4, 4}), out = Tensor::empty(DType::kF32, {1, 4});
  std::vector<std::int32_t> bad = {-1};
  EXPECT_THROW(embedding(ctx, table, bad, 0, out), Error);
}

TEST_P(OpsTest, ConvertRoundTrips) {
  auto xs = random_floats(300, 7, 100.0f);
  xs[0] = 1.0f + 1.0f / 256;  // a bf16 tie: rounds to even (1.0)
  auto src = f32_tensor(xs, 3, 100);
  for (DType t : {DType::kBF16, DType::kF16}) {
    Tensor mid = Tensor::empty(t, {3, 100}), back = Tensor::empty(DType::kF32, {3, 100});
    convert(ctx, src, mid);
    convert(ctx, mid, back);
    std::vector<double> want(xs.begin(), xs.end());
    expect_close(back.ptr<float>(), want, 0, t == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048, "round trip");
    auto ref = store(xs, t, 3, 100);  // scalar conversion
    std::vector<double> exact(ref.exact.begin(), ref.exact.end());
    expect_close(back.ptr<float>(), exact, 0, 0, "same as scalar conversion");
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST_P(OpsTest, RopeRotatesPairsHalfApart) {
  RopeConfig cfg;
  cfg.head_dim = 8;
  cfg.theta = 500000.0;
  RopeTable table(cfg, 64);
  const int heads = 3;
  const std::int64_t t = 4, stride = heads * 8 + 5;  // a view into a wider (fused qkv) buffer
  auto xs = random_floats(std::size_t(t * stride), 8);
  auto x = f32_tensor(xs, t, stride);
  std::vector<std::int32_t> pos = {0, 1, 17, 63};
  apply_rope(ctx, table, x.view().slice_cols(0, heads * 8), heads, pos);
  auto inv = rope_inv_freq(cfg);
  for (std::int64_t r = 0; r < t; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < 4; ++i) {
        std::size_t base = std::size_t(r * stride + h * 8);
        double a = xs[base + std::size_t(i)], b = xs[base + std::size_t(i) + 4], ang = pos[std::size_t(r)] * inv[std::size_t(i)];
        EXPECT_NEAR(x.ptr<float>()[base + std::size_t(i)], a * std::cos(ang) - b * std::sin(ang), 1e-5);
        EXPECT_NEAR(x.ptr<float>()[base + std::size_t(i) + 4], b * std::cos(ang) + a * std::sin(ang), 1e-5);
      }
  for (std::int64_t r = 0; r < t; ++r)  // the 5 columns past the view are untouched
    for (std::int64_t c = heads * 8; c < stride; ++c) EXPECT_EQ(x.ptr<float>()[r * stride + c], xs[std::size_t(r * stride + c)]);
  std::vector<std::int32_t> far = {0, 1, 2, 64};
  EXPECT_THROW(apply_rope(ctx, table, x.view().slice_cols(0, heads * 8), heads, far), Error);
}

INSTANTIATE_TEST_SUITE_P(Threads, OpsTest, ::testing::Values(1, 2, 3));

// Llama 3.1's published rope_scaling (factor 8, low 1, high 4, original 8192, theta 500000):
// each frequency band follows the rule written out independently here.
TEST(Rope, Llama3ScalingBands) {
  RopeConfig cfg{128, 500000.0, RopeScaling::kLlama3, 8.0, 1.0, 4.0, 8192};
  auto inv = rope_inv_freq(cfg);
  ASSERT_EQ(inv.size(), 64u);
  int low = 0, mid = 0, high = 0;
  for (int i = 0; i < 64; ++i) {
    double base = std::pow(500000.0, -2.0 * i / 128);
    double wavelen = 2 * std::numbers::pi / base;
    double want;
    if (wavelen < 8192.0 / 4) {
      want = base, ++high;
    } else if (wavelen > 8192.0) {
      want = base / 8, ++low;
    } else {
      double s = (8192.0 / wavelen - 1) / 3;
      want = (1 - s) * base / 8 + s * base, ++mid;
    }
    EXPECT_NEAR(inv[std::size_t(i)], want, 1e-12 * base) << "frequency " << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
  RopeConfig bad = cfg;
  bad.high_freq_factor = 0.5;
  EXPECT_THROW(rope_inv_freq(bad), Error);
  bad = cfg;
  bad.head_dim = 7;
  EXPECT_THROW(rope_inv_freq(bad), Error);
}

TEST(ThreadPool, CoversRangeAndPropagatesErrors) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) hits[std::size_t(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(pool.parallel_for(10, [](std::int64_t lo, std::int64_t) {
    if (lo > 0) throw_error(ErrorCode::kInternal, "boom");
  }), Error);
  std::atomic<int> after{0};  // the pool still works after an error
  pool.parallel_for(3, [&](std::int64_t lo, std::int64_t hi) { after += int(hi - lo); });
  EXPECT_EQ(after.load(), 3);
}

TEST(ThreadPool, SpinningHandOffsPublishResults) {
  // Two threads spinning between jobs (the decode path): thousands of back-to-back tiny jobs,
  // each reading what the previous one wrote. A chunk's writes must be visible to the caller
  // as soon as parallel_for returns, whether the worker was spinning or asleep.
  ThreadPool pool(2, 2000);
  std::vector<std::int64_t> a(64, 0);
  for (int round = 0; round < 5000; ++round) {
    pool.parallel_for(64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) a[std::size_t(i)] += 1;
    });
    if (round % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // workers fall asleep
  }
  for (auto v : a) ASSERT_EQ(v, 5000);
  ThreadPool one(1, 2000);
  EXPECT_EQ(one.spin_us(), 0) << "a pool without workers has nobody to spin";
  ThreadPool spare(64, 50);  // more threads than this machine's CPUs
  EXPECT_EQ(spare.spin_us(), 0) << "an oversubscribed pool must not spin";
  ThreadPool zero(2, 0);
  EXPECT_EQ(zero.spin_us(), 0);
  zero.parallel_for(8, [&](std::int64_t lo, std::int64_t hi) { a[std::size_t(lo)] = hi; });
  EXPECT_EQ(a[7], 8);
}

TEST(Triad, MeasuresAndChecks) {
  Context ctx(2);
  TriadResult r = measure_triad(ctx, std::size_t{4} << 20, 3);
  EXPECT_EQ(r.samples.size(), 3u);
  EXPECT_GT(r.median_bytes_per_s, 0);
  EXPECT_GE(r.best_bytes_per_s, r.median_bytes_per_s);
  EXPECT_THROW(measure_triad(ctx, 1000, 3), Error);
}

TEST(ReadStream, MeasuresChecksAndRefuses) {
  // An odd thread count and a size that is not a whole number of lines per thread: the
  // buffer is rounded down, and every pass's sum (checked inside) still matches.
  Context ctx(3);
  TriadResult r = measure_read(ctx, (std::size_t{3} << 20) + 100, 4);
  EXPECT_EQ(r.samples.size(), 4u);
  EXPECT_EQ(r.threads, 3);
  EXPECT_EQ(r.array_bytes % (3 * 64), 0u);
  EXPECT_LE(r.array_bytes, (std::size_t{3} << 20) + 100);
  EXPECT_GT(r.median_bytes_per_s, 0);
  EXPECT_GE(r.best_bytes_per_s, r.median_bytes_per_s);
  EXPECT_THROW(measure_read(ctx, 1000, 3), Error);
  EXPECT_THROW(measure_read(ctx, std::size_t{4} << 20, 0), Error);
}

TEST(Tensor, ViewsAndErrors) {
  Tensor t = Tensor::zeros(DType::kBF16, {2, 3, 4});
  EXPECT_EQ(t.view().rows(), 6);
  EXPECT_EQ(t.view().cols(), 4);
  EXPECT_EQ(t.bytes(), 48u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_THROW(parse_dtype("int8", "--dtype"), Error);
  TensorView v = t.view().named("w");
  EXPECT_NE(v.describe().find("'w' [2, 3, 4] bf16"), std::string::npos) << v.describe();
  EXPECT_THROW(v.slice_rows(1, 2), Error);
  TensorView m = TensorView::matrix(t.view().data, DType::kBF16, 6, 4).slice_cols(1, 2);
  EXPECT_EQ(m.row_stride(), 4);
  Context ctx(1);
  TensorView on_gpu = m;
  on_gpu.device = Device::kCuda;
  Tensor y = Tensor::zeros(DType::kF32, {6, 6});
  EXPECT_THROW(matmul(ctx, on_gpu, m, y), Error);
}

// Graph caches compare allocations by serial, since freed memory can come back at the same
// address (Tensor::serial; a CUDA graph launched over such a reuse crashed the driver).
TEST(Tensor, SerialsDifferAcrossReallocationsAtOneAddress) {
  EXPECT_EQ(Tensor().serial(), 0u);
  bool same_address_seen = false;
  std::uint64_t last = 0;
  const void* last_data = nullptr;
  for (int i = 0; i < 8; ++i) {
    Tensor t = Tensor::empty(DType::kF32, {256, 64});
    EXPECT_NE(t.serial(), 0u);
    EXPECT_GT(t.serial(), last) << "allocation " << i;
    same_address_seen |= t.view().data == last_data;
    last = t.serial();
    last_data = t.view().data;
  }
  // glibc hands the freed block straight back; were it not to, the check above still holds.
  if (!same_address_seen) GTEST_LOG_(INFO) << "the allocator never reused an address here";
  Tensor a = Tensor::empty(DType::kF32, {4});
  const std::uint64_t s = a.serial();
  Tensor b = std::move(a);
  EXPECT_EQ(b.serial(), s) << "a move keeps the allocation and its serial";
}

}  // namespace
}  // namespace trellis::kernels
