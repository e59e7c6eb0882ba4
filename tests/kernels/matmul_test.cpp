// matmul against a double-precision reference, for every algorithm, weight dtype and a set
// of odd shapes (tails in every blocking dimension), plus strided views and beta.
#include <cstring>
#include <gtest/gtest.h>

#include <tuple>

#include "kernels/kernel_test_util.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/library.hpp"

namespace trellis::kernels {
namespace {

using test::expect_close;
using test::random_floats;
using test::store;

struct Case {
  std::int64_t m, n, k;
};

// y = x w^T computed in double from the values the tensors hold (so bf16/f16 rounding of w is
// not counted as error: only the kernel's f32 summation is).
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, std::int64_t m,
                              std::int64_t n, std::int64_t k, double beta, const std::vector<float>& y0) {
  std::vector<double> y(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) s += static_cast<double>(x[static_cast<std::size_t>(i * k + p)]) * w[static_cast<std::size_t>(j * k + p)];
      y[static_cast<std::size_t>(i * n + j)] = s + beta * y0[static_cast<std::size_t>(i * n + j)];
    }
  return y;
}

Tensor f32_tensor_filled(std::int64_t rows, std::int64_t cols, float v) {
  Tensor t = Tensor::empty(DType::kF32, {rows, cols});
  for (std::int64_t i = 0; i < rows * cols; ++i) t.ptr<float>()[i] = v;
  return t;
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<MatmulAlgo, DType, int>> {};

// f32 accumulation of k products of values in [-1, 1): error grows ~ sqrt(k) * eps * k.
double tolerance(std::int64_t k) { return 2e-6 * static_cast<double>(k); }

TEST_P(MatmulTest, MatchesReference) {
  auto [algo, wtype, threads] = GetParam();
  Context ctx(threads);
  const Case cases[] = {{1, 1, 1}, {1, 37, 19}, {3, 64, 16}, {8, 100, 300}, {13, 33, 257},
                        {25, 70, 515}, {64, 96, 64}, {2, 513, 1000}, {40, 1030, 270},
                        // Rows so wide that the GEMV prefetches the next block of rows into
                        // L2 rather than L1 (gemv_typed): every weight type, M = 1 and 3.
                        {1, 37, 4100}, {3, 21, 2600}};
  std::uint32_t seed = 1;
  for (const auto& c : cases) {
    if (algo == MatmulAlgo::kGemv && c.m > 8) continue;
    auto xs = random_floats(static_cast<std::size_t>(c.m * c.k), seed++);
    auto ws = random_floats(static_cast<std::size_t>(c.n * c.k), seed++);
    auto y0 = random_floats(static_cast<std::size_t>(c.m * c.n), seed++);
    auto x = store(xs, DType::kF32, c.m, c.k);
    auto w = store(ws, wtype, c.n, c.k);
    for (float beta : {0.0f, 0.5f}) {
      auto y = store(y0, DType::kF32, c.m, c.n);
      matmul(ctx, x.tensor, w.tensor, y.tensor, {beta, algo});
      auto want = reference(x.exact, w.exact, c.m, c.n, c.k, beta, y0);
      std::string what = "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                         " beta=" + std::to_string(beta);
      expect_close(y.tensor.ptr<float>(), want, tolerance(c.k), 1e-5, what.c_str());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, MatmulTest,
                         ::testing::Combine(::testing::Values(MatmulAlgo::kAuto, MatmulAlgo::kGemv, MatmulAlgo::kGemm,
                                                              MatmulAlgo::kBlas, MatmulAlgo::kOnednn),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Values(1, 2)));

// Views with row strides wider than their columns: a column slice of x, a row-parallel
// (column) slice of w, and an output written into the middle of a wider buffer.
TEST(Matmul, StridedViews) {
  Context ctx(2);
  const std::int64_t m = 20, n = 45, k = 70, kfull = 100, nfull = 60;
  for (MatmulAlgo algo : {MatmulAlgo::kGemm, MatmulAlgo::kBlas, MatmulAlgo::kGemv, MatmulAlgo::kOnednn}) {
    std::int64_t rows = algo == MatmulAlgo::kGemv ? 5 : m;
    auto xs = random_floats(static_cast<std::size_t>(rows * kfull), 7);
    auto ws = random_floats(static_cast<std::size_t>(n * kfull), 8);
    auto xw = test::f32_tensor(xs, rows, kfull);
    auto ww = store(ws, DType::kBF16, n, kfull);
    Tensor yw = Tensor::zeros(DType::kF32, {rows, nfull});
    TensorView xv = xw.view().slice_cols(10, k), wv = ww.tensor.view().slice_cols(10, k);
    TensorView yv = yw.view().slice_cols(5, n);
    matmul(ctx, xv, wv, yv, {0.0f, algo});
    std::vector<float> xe, we;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t p = 0; p < k; ++p) xe.push_back(xs[static_cast<std::size_t>(i * kfull + 10 + p)]);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) we.push_back(ww.exact[static_cast<std::size_t>(j * kfull + 10 + p)]);
    auto want = reference(xe, we, rows, n, k, 0.0, std::vector<float>(static_cast<std::size_t>(rows * n)));
    for (std::int64_t i = 0; i < rows; ++i) {
      std::vector<double> row(want.begin() + i * n, want.begin() + (i + 1) * n);
      expect_close(static_cast<float*>(yv.row_ptr(i)), row, tolerance(k), 1e-5, "strided");
      EXPECT_EQ(yw.ptr<float>()[i * nfull + 4], 0.0f) << "wrote left of the output view";
      EXPECT_EQ(yw.ptr<float>()[i * nfull + 5 + n], 0.0f) << "wrote right of the output view";
    }
  }
}

// oneDNN's bf16 matmul rounds x to bf16; against a reference from the rounded x, the products
// of two bf16 values are exact in f32, so only the f32 summation order is error: the same
// bound as every other path. Odd M (1, 3, 17, 129), N and K not multiples of 16, strided
// views of x, w and y, and beta.
TEST(Matmul, OnednnBf16MatchesReferenceOfRoundedX) {
  const Case cases[] = {{1, 37, 19}, {3, 70, 515}, {17, 100, 300}, {129, 1030, 270}, {17, 33, 2049}};
  std::uint32_t seed = 40;
  for (int threads : {1, 2}) {
    Context ctx(threads);
    for (const auto& c : cases) {
      const std::int64_t kfull = c.k + 5, nfull = c.n + 3;
      auto xs = store(random_floats(static_cast<std::size_t>(c.m * kfull), seed++), DType::kBF16, c.m, kfull);
      auto ws = store(random_floats(static_cast<std::size_t>(c.n * kfull), seed++), DType::kBF16, c.n, kfull);
      auto y0 = random_floats(static_cast<std::size_t>(c.m * nfull), seed++);
      // x as f32 holding bf16-exact values, so the rounding is the identity and the reference
      // is exact; then the same x unrounded, against a reference from the rounded values.
      auto x_exact = test::f32_tensor(xs.exact, c.m, kfull);
      auto x_raw = test::f32_tensor(random_floats(static_cast<std::size_t>(c.m * kfull), seed++), c.m, kfull);
      for (const Tensor* x : {&x_exact, &x_raw}) {
        std::vector<float> xe, we, ye;
        for (std::int64_t i = 0; i < c.m; ++i)
          for (std::int64_t p = 0; p < c.k; ++p)
            xe.push_back(bf16_to_f32(f32_to_bf16(x->ptr<float>()[i * kfull + 2 + p])));
        for (std::int64_t j = 0; j < c.n; ++j)
          for (std::int64_t p = 0; p < c.k; ++p) we.push_back(ws.exact[static_cast<std::size_t>(j * kfull + 2 + p)]);
        for (std::int64_t i = 0; i < c.m; ++i)
          for (std::int64_t j = 0; j < c.n; ++j) ye.push_back(y0[static_cast<std::size_t>(i * nfull + 1 + j)]);
        for (float beta : {0.0f, 0.5f}) {
          Tensor yw = test::f32_tensor(y0, c.m, nfull);
          TensorView yv = yw.view().slice_cols(1, c.n);
          matmul(ctx, x->view().slice_cols(2, c.k), ws.tensor.view().slice_cols(2, c.k), yv,
                 {beta, MatmulAlgo::kOnednnBf16});
          auto want = reference(xe, we, c.m, c.n, c.k, beta, ye);
          std::string what = "onednn bf16 m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" +
                             std::to_string(c.k) + " beta=" + std::to_string(beta) + " threads=" + std::to_string(threads);
          for (std::int64_t i = 0; i < c.m; ++i) {
            std::vector<double> row(want.begin() + i * c.n, want.begin() + (i + 1) * c.n);
            expect_close(static_cast<float*>(yv.row_ptr(i)), row, tolerance(c.k), 1e-5, what.c_str());
            ASSERT_EQ(yw.ptr<float>()[i * nfull], y0[static_cast<std::size_t>(i * nfull)]) << "wrote left of y";
            ASSERT_EQ(yw.ptr<float>()[i * nfull + nfull - 1], y0[static_cast<std::size_t>(i * nfull + nfull - 1)])
                << "wrote right of y";
          }
        }
      }
    }
  }
  // Only bf16 weights: anything else is refused, naming the weight.
  Context ctx(1);
  Tensor x = Tensor::zeros(DType::kF32, {16, 8}), w = Tensor::zeros(DType::kF32, {4, 8}), y = Tensor::zeros(DType::kF32, {16, 4});
  try {
    matmul(ctx, x, w.view().named("lm_head.weight"), y, {0.0f, MatmulAlgo::kOnednnBf16});
    FAIL() << "kOnednnBf16 took f32 weights";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
}

// kAuto's prefill choice is reported by name (trellis info, bench kernels), and oneDNN says
// what it runs on.
TEST(Matmul, PrefillChoiceIsReported) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::string choice = prefill_gemm_choice(t);
    EXPECT_TRUE(choice.rfind("oneDNN", 0) == 0 || choice.rfind("OpenBLAS", 0) == 0 || choice.rfind("ours", 0) == 0)
        << to_string(t) << ": " << choice;
  }
  EXPECT_NE(onednn_description().find("oneDNN "), std::string::npos) << onednn_description();
  EXPECT_NE(onednn_description().find("ISA "), std::string::npos) << onednn_description();
}

TEST(Matmul, ShapeErrorsNameTheTensors) {
  Context ctx(1);
  Tensor x = Tensor::zeros(DType::kF32, {2, 8}), w = Tensor::zeros(DType::kBF16, {4, 9}),
         y = Tensor::zeros(DType::kF32, {2, 4});
  try {
    matmul(ctx, x.view().named("hidden"), w.view().named("layers.0.mlp.up_proj.weight"), y);
    FAIL() << "no error for mismatched inner dimensions";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("layers.0.mlp.up_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hidden"), std::string::npos) << e.what();
  }
  Tensor x9 = Tensor::zeros(DType::kF32, {9, 9});
  Tensor y9 = Tensor::zeros(DType::kF32, {9, 4});
  EXPECT_THROW(matmul(ctx, x9, w, y9, {0.0f, MatmulAlgo::kGemv}), Error);
  Tensor x0 = Tensor::zeros(DType::kF32, {2, 0}), w0 = Tensor::zeros(DType::kBF16, {3, 0});
  Tensor y0 = f32_tensor_filled(2, 3, 4.0f);
  matmul(ctx, x0, w0, y0, {0.5f});  // K = 0: y = beta * y
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y0.ptr<float>()[i], 2.0f);
  Tensor bad_out = Tensor::zeros(DType::kF32, {2, 5});
  Tensor w8 = Tensor::zeros(DType::kF32, {4, 8});
  EXPECT_THROW(matmul(ctx, x, w8, bad_out), Error);
}

// Context::batch_invariant: every row of an M-row product equals, bit for bit, the product of
// that row alone (what SWIFT's verification relies on), for f32 and bf16 weights, K with and
// without a tail, N not a multiple of the column block, and M across the 8-row gemv limit.
TEST(Matmul, BatchInvariantRowsEqualTheRowAlone) {
  for (int threads : {1, 2}) {
    Context ctx(threads);
    ctx.set_batch_invariant(true);
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (std::int64_t k : {64, 70, 576}) {
        const std::int64_t n = 300;
        auto ws = store(random_floats(static_cast<std::size_t>(n * k), 3), t, n, k);
        for (std::int64_t m : {2, 5, 9, 17, 40}) {
          auto xs = random_floats(static_cast<std::size_t>(m * k), 4 + static_cast<std::uint32_t>(m));
          auto x = test::f32_tensor(xs, m, k);
          Tensor y = Tensor::zeros(DType::kF32, {m, n}), y1 = Tensor::zeros(DType::kF32, {1, n});
          matmul(ctx, x.view(), ws.tensor.view(), y.view());
          for (std::int64_t i = 0; i < m; ++i) {
            matmul(ctx, x.view().slice_rows(i, 1), ws.tensor.view(), y1.view());
            ASSERT_EQ(std::memcmp(y.view().row_ptr(i), y1.view().row_ptr(0), static_cast<std::size_t>(n) * 4), 0)
                << to_string(t) << " k " << k << " m " << m << " row " << i << " threads " << threads;
          }
        }
      }
    }
  }
  // (Without the mode, M = 9 already differs from the row alone here: the GEMM path.)
}

}  // namespace
}  // namespace trellis::kernels
