// Block-quantised weights (quant.hpp): the activation quantisation against its definition,
// the SIMD dot products against the scalar reference, the matmul against a double-precision
// product of the quantised operands, the Q8_0 embedding lookup, views of block types, and the
// errors for shapes that are not whole blocks.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernel_test_util.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/quant.hpp"

namespace trellis::kernels {
namespace {

using test::random_floats;

// Activations with the spread of real hidden states: mostly small, a few large outliers.
std::vector<float> activations(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = random_floats(n, seed);
  for (std::size_t i = 0; i < n; i += 37) v[i] *= 20.0f;
  return v;
}

TEST(Quant, Q8_1MatchesItsDefinition) {
  std::vector<float> x = activations(96, 1);
  x[40] = 0.0f;
  std::fill(x.begin() + 64, x.end(), 0.0f);  // an all-zero block: d = 0, all q = 0
  std::vector<BlockQ8_1> y(3);
  quantize_row_q8_1(x.data(), y.data(), 96);
  for (int b = 0; b < 3; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(32 * b + j)]));
    const float d = amax / 127.0f;
    EXPECT_EQ(y[static_cast<std::size_t>(b)].d, f32_to_f16(d)) << "block " << b;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = y[static_cast<std::size_t>(b)].qs[j];
      sum += q;
      EXPECT_LE(std::abs(q), 127);
      // round to nearest: |x - q d| <= d / 2 (plus f32 slack)
      EXPECT_LE(std::fabs(x[static_cast<std::size_t>(32 * b + j)] - static_cast<float>(q) * d), d * 0.5001f + 1e-7f);
    }
    EXPECT_EQ(y[static_cast<std::size_t>(b)].s, f32_to_f16(d * static_cast<float>(sum))) << "block " << b;
  }
  EXPECT_EQ(f16_to_f32(y[2].d), 0.0f);
}

// The vectorised activation quantisation (where compiled) is the scalar specification bit for
// bit: llama.cpp agreement depends on every rounding of it.
TEST(Quant, ActivationQuantisationIsTheReferenceBitForBit) {
  std::vector<float> x = activations(32 * 40, 13);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
  // amax 127 makes 127 / amax = 1: the halves are exact ties, rounded to even.
  for (std::size_t i = 96; i < 128; ++i) x[i] = static_cast<float>(static_cast<int>(i) - 112) + 0.5f;
  x[96] = 127.0f;
  x[200] = -x[200] * 1000.0f;  // one outlier sets a block's scale
  std::vector<BlockQ8_1> a(40), b(40);
  std::vector<BlockQ8_0> c(40), d(40);
  quantize_row_q8_1(x.data(), a.data(), 32 * 40);
  ref::quantize_row_q8_1(x.data(), b.data(), 32 * 40);
  quantize_row_q8_0(x.data(), c.data(), 32 * 40);
  ref::quantize_row_q8_0(x.data(), d.data(), 32 * 40);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(BlockQ8_1)), 0);
  EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * sizeof(BlockQ8_0)), 0);
}

TEST(Quant, Q4_1RoundTripsWithinHalfAStep) {
  std::vector<float> x = random_floats(64, 2, 0.3f);
  std::vector<BlockQ4_1> w(2);
  quantize_row_q4_1(x.data(), w.data(), 64);
  std::vector<float> back(64);
  dequantize_row(DType::kQ4_1, w.data(), back.data(), 64);
  for (std::size_t i = 0; i < 64; ++i) {
    const float d = f16_to_f32(w[i / 32].d);
    EXPECT_LE(std::fabs(back[i] - x[i]), 0.5f * d + 2e-3f) << i;  // + the f16 rounding of d and m
  }
}

// The fast dot products compute the same integer sums as the scalar specification, so they
// differ only in the order of the f32 additions of block results.
TEST(Quant, SimdDotsMatchTheScalarReference) {
  for (std::int64_t nb : {1, 2, 7, 18, 48}) {
    const std::int64_t k = nb * 32;
    std::vector<float> wf = random_floats(static_cast<std::size_t>(k), 3, 0.1f), xf = activations(static_cast<std::size_t>(k), 4);
    std::vector<BlockQ4_1> w4(static_cast<std::size_t>(nb));
    std::vector<BlockQ8_0> w8(static_cast<std::size_t>(nb)), x8(static_cast<std::size_t>(nb));
    std::vector<BlockQ8_1> x81(static_cast<std::size_t>(nb));
    quantize_row_q4_1(wf.data(), w4.data(), k);
    quantize_row_q8_0(wf.data(), w8.data(), k);
    quantize_row_q8_0(xf.data(), x8.data(), k);
    quantize_row_q8_1(xf.data(), x81.data(), k);
    // Scale of the terms, for a relative bound on f32 reordering.
    double mag = 0;
    for (std::int64_t i = 0; i < k; ++i) mag += std::fabs(wf[static_cast<std::size_t>(i)] * xf[static_cast<std::size_t>(i)]);
    const float r4 = ref::vec_dot_q4_1_q8_1(w4.data(), x81.data(), nb), f4 = vec_dot_q4_1_q8_1(w4.data(), x81.data(), nb);
    const float r8 = ref::vec_dot_q8_0_q8_0(w8.data(), x8.data(), nb), f8 = vec_dot_q8_0_q8_0(w8.data(), x8.data(), nb);
    EXPECT_NEAR(f4, r4, 1e-5 * (mag + 1)) << "q4_1 x q8_1, " << nb << " blocks, path " << quant_dot_path();
    EXPECT_NEAR(f8, r8, 1e-5 * (mag + 1)) << "q8_0 x q8_0, " << nb << " blocks, path " << quant_dot_path();
    // And the reference is the product of the dequantised operands (exactly, up to f32 sums).
    std::vector<float> wd(static_cast<std::size_t>(k)), xd(static_cast<std::size_t>(k));
    dequantize_row(DType::kQ4_1, w4.data(), wd.data(), k);
    double want = 0;
    for (std::int64_t b = 0; b < nb; ++b) {
      double dx = f16_to_f32(x81[static_cast<std::size_t>(b)].d);
      for (int j = 0; j < 32; ++j) want += wd[static_cast<std::size_t>(32 * b + j)] * dx * x81[static_cast<std::size_t>(b)].qs[j];
    }
    // Q4_1's m * s term uses s = f16(d * sum q), not the exact sum: allow its rounding.
    EXPECT_NEAR(r4, want, 2e-3 * (mag + 1)) << nb;
  }
}

struct QuantCase {
  DType w_type;
  std::int64_t m, n, k;
};

class QuantMatmul : public ::testing::TestWithParam<QuantCase> {};

// y = x w^T with quantised w: compared with the double product of the dequantised weights and
// the dequantised 8-bit activations (what the kernel must compute), and loosely with the f32
// activations (the size of the activation-quantisation error).
TEST_P(QuantMatmul, MatchesDoubleProductOfQuantisedOperands) {
  const QuantCase c = GetParam();
  const std::int64_t nb = c.k / 32;
  std::vector<float> wf = random_floats(static_cast<std::size_t>(c.n * c.k), 5, 0.1f);
  std::vector<float> xf = activations(static_cast<std::size_t>(c.m * c.k), 6);
  Tensor w = Tensor::empty(c.w_type, {c.n, c.k});
  for (std::int64_t r = 0; r < c.n; ++r) {
    if (c.w_type == DType::kQ4_1)
      quantize_row_q4_1(wf.data() + r * c.k, static_cast<BlockQ4_1*>(w.view().row_ptr(r)), c.k);
    else
      quantize_row_q8_0(wf.data() + r * c.k, static_cast<BlockQ8_0*>(w.view().row_ptr(r)), c.k);
  }
  Tensor x = test::f32_tensor(xf, c.m, c.k), y = Tensor::empty(DType::kF32, {c.m, c.n});
  Context ctx(2);
  matmul(ctx, x, w, y);
  std::vector<float> wrow(static_cast<std::size_t>(c.k)), xq(static_cast<std::size_t>(c.k));
  for (std::int64_t i = 0; i < c.m; ++i) {
    // The activations as the kernel sees them.
    std::vector<BlockQ8_1> b1(static_cast<std::size_t>(nb));
    std::vector<BlockQ8_0> b0(static_cast<std::size_t>(nb));
    if (c.w_type == DType::kQ4_1) {
      quantize_row_q8_1(xf.data() + i * c.k, b1.data(), c.k);
      for (std::int64_t p = 0; p < c.k; ++p)
        xq[static_cast<std::size_t>(p)] = f16_to_f32(b1[static_cast<std::size_t>(p / 32)].d) * b1[static_cast<std::size_t>(p / 32)].qs[p % 32];
    } else {
      quantize_row_q8_0(xf.data() + i * c.k, b0.data(), c.k);
      dequantize_row(DType::kQ8_0, b0.data(), xq.data(), c.k);
    }
    for (std::int64_t j = 0; j < c.n; ++j) {
      dequantize_row(c.w_type, w.view().row_ptr(j), wrow.data(), c.k);
      double want = 0, want_f32_x = 0, mag = 0;
      for (std::int64_t p = 0; p < c.k; ++p) {
        const double wv = wrow[static_cast<std::size_t>(p)];
        want += wv * xq[static_cast<std::size_t>(p)];
        want_f32_x += wv * xf[static_cast<std::size_t>(i * c.k + p)];
        mag += std::fabs(wv * xf[static_cast<std::size_t>(i * c.k + p)]);
      }
      const float got = y.ptr<float>()[i * c.n + j];
      // Q4_1: the m * s term uses s rounded to f16 (relative 2^-11 of d * sum q per block).
      const double tol = (c.w_type == DType::kQ4_1 ? 2e-3 : 1e-5) * (mag + 1e-3);
      ASSERT_NEAR(got, want, tol) << "row " << i << " col " << j;
      ASSERT_NEAR(got, want_f32_x, 0.05 * (mag + 1e-3)) << "row " << i << " col " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantMatmul,
                         ::testing::Values(QuantCase{DType::kQ4_1, 1, 37, 64}, QuantCase{DType::kQ4_1, 5, 96, 576},
                                           QuantCase{DType::kQ4_1, 17, 33, 1536}, QuantCase{DType::kQ8_0, 1, 50, 576},
                                           QuantCase{DType::kQ8_0, 16, 19, 96}));

// At M = 1 the matmul takes several weight rows per pass (4 on AVX-512 VNNI, with the block
// scales of 16 blocks converted at once): every output must still be the single-row dot of its
// weight row, up to f32 order. Awkward sizes: N not a multiple of 4 (1-3 rows left over), one
// block, odd block counts, groups of 16 blocks with 1 or 2 left over, a row stride larger than
// the row (a column slice), and beta = 1.
TEST(Quant, OneActivationRowMatchesTheSingleRowDots) {
  Context ctx(2);
  for (DType type : {DType::kQ4_1, DType::kQ8_0}) {
    for (std::int64_t nb : {1, 2, 3, 4, 5, 9, 15, 16, 17, 18, 33, 48}) {
      for (std::int64_t n : {1, 2, 3, 5, 6, 7, 13, 64}) {
        const std::int64_t k = nb * 32, kw = k + 64;  // weights 2 blocks wider: sliced off below
        std::vector<float> wf = random_floats(static_cast<std::size_t>(n * kw), 11, 0.1f);
        const std::vector<float> xf = activations(static_cast<std::size_t>(k), 12);
        Tensor w = Tensor::empty(type, {n, kw});
        for (std::int64_t r = 0; r < n; ++r) {
          if (type == DType::kQ4_1)
            quantize_row_q4_1(wf.data() + r * kw, static_cast<BlockQ4_1*>(w.view().row_ptr(r)), kw);
          else
            quantize_row_q8_0(wf.data() + r * kw, static_cast<BlockQ8_0*>(w.view().row_ptr(r)), kw);
        }
        const TensorView ws = w.view().slice_cols(32, k);  // starts one block in, stride kw
        Tensor x = test::f32_tensor(xf, 1, k), y = Tensor::empty(DType::kF32, {1, n});
        for (std::int64_t j = 0; j < n; ++j) y.ptr<float>()[j] = 0.5f;
        matmul(ctx, x, ws, y, {.beta = 1.0f});
        std::vector<BlockQ8_1> x81(static_cast<std::size_t>(nb));
        std::vector<BlockQ8_0> x80(static_cast<std::size_t>(nb));
        quantize_row_q8_1(xf.data(), x81.data(), k);
        quantize_row_q8_0(xf.data(), x80.data(), k);
        for (std::int64_t j = 0; j < n; ++j) {
          double mag = 0;
          for (std::int64_t p = 0; p < k; ++p)
            mag += std::fabs(wf[static_cast<std::size_t>(j * kw + 32 + p)] * xf[static_cast<std::size_t>(p)]);
          const void* row = ws.row_ptr(j);
          const float want = type == DType::kQ4_1 ? ref::vec_dot_q4_1_q8_1(static_cast<const BlockQ4_1*>(row), x81.data(), nb)
                                                  : ref::vec_dot_q8_0_q8_0(static_cast<const BlockQ8_0*>(row), x80.data(), nb);
          const float fast = type == DType::kQ4_1 ? vec_dot_q4_1_q8_1(static_cast<const BlockQ4_1*>(row), x81.data(), nb)
                                                  : vec_dot_q8_0_q8_0(static_cast<const BlockQ8_0*>(row), x80.data(), nb);
          const float got = y.ptr<float>()[j] - 0.5f;
          ASSERT_NEAR(got, want, 1e-5 * (mag + 1)) << to_string(type) << " nb " << nb << " n " << n << " row " << j;
          ASSERT_NEAR(got, fast, 1e-5 * (mag + 1)) << to_string(type) << " nb " << nb << " n " << n << " row " << j;
        }
      }
    }
  }
}

// Weights placed against inaccessible pages: the M = 1 kernel reads whole cache lines and
// realigns them, so a last line that is not masked to the matrix's own bytes faults here (an
// unmasked first line stays on the first block's page, where no guard can see it). The matrix
// first ends at a PROT_NONE page, then starts right after one, and for Q4_1 also ends 2 bytes
// short of one (a base that is not 4-byte aligned, which takes the general path). Every
// output must be the scalar reference's single-row dot.
class GuardedBytes {
 public:
  explicit GuardedBytes(std::size_t bytes) {
    page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    data_ = (bytes + page_ - 1) / page_ * page_;
    void* p = mmap(nullptr, data_ + 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
    if (base_ != nullptr && (mprotect(base_, page_, PROT_NONE) != 0 || mprotect(base_ + page_ + data_, page_, PROT_NONE) != 0)) {
      munmap(base_, data_ + 2 * page_);
      base_ = nullptr;
    }
  }
  ~GuardedBytes() {
    if (base_ != nullptr) munmap(base_, data_ + 2 * page_);
  }
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;
  bool ok() const { return base_ != nullptr; }
  std::byte* first() const { return base_ + page_; }         // a guard page just before
  std::byte* end() const { return base_ + page_ + data_; }   // a guard page from here

 private:
  std::size_t page_ = 0, data_ = 0;
  std::byte* base_ = nullptr;
};

TEST(Quant, OneActivationRowReadsOnlyItsBlocks) {
  Context ctx(2);
  for (DType type : {DType::kQ4_1, DType::kQ8_0}) {
    const std::size_t block = type == DType::kQ4_1 ? sizeof(BlockQ4_1) : sizeof(BlockQ8_0);
    for (std::int64_t nb : {1, 2, 3, 4, 5, 17, 18, 33, 48}) {
      for (std::int64_t n : {1, 2, 3, 5, 6, 7, 13}) {
        const std::int64_t k = nb * 32;
        const std::size_t bytes = static_cast<std::size_t>(n * nb) * block;
        std::vector<float> wf = random_floats(static_cast<std::size_t>(n * k), 21, 0.1f);
        const std::vector<float> xf = activations(static_cast<std::size_t>(k), 22);
        std::vector<std::byte> src(bytes);
        for (std::int64_t r = 0; r < n; ++r) {
          if (type == DType::kQ4_1)
            quantize_row_q4_1(wf.data() + r * k, reinterpret_cast<BlockQ4_1*>(src.data()) + r * nb, k);
          else
            quantize_row_q8_0(wf.data() + r * k, reinterpret_cast<BlockQ8_0*>(src.data()) + r * nb, k);
        }
        std::vector<BlockQ8_1> x81(static_cast<std::size_t>(nb));
        std::vector<BlockQ8_0> x80(static_cast<std::size_t>(nb));
        quantize_row_q8_1(xf.data(), x81.data(), k);
        quantize_row_q8_0(xf.data(), x80.data(), k);
        GuardedBytes mem(bytes + 2);
        ASSERT_TRUE(mem.ok()) << "mmap/mprotect failed";
        const std::size_t slack = type == DType::kQ4_1 ? 2 : 0;
        for (std::byte* at : {mem.end() - bytes, mem.first(), mem.end() - bytes - slack}) {
          std::memcpy(at, src.data(), bytes);
          Tensor x = test::f32_tensor(xf, 1, k), y = Tensor::empty(DType::kF32, {1, n});
          matmul(ctx, x, TensorView::matrix(at, type, n, k), y);
          for (std::int64_t j = 0; j < n; ++j) {
            double mag = 0;
            for (std::int64_t p = 0; p < k; ++p) mag += std::fabs(wf[static_cast<std::size_t>(j * k + p)] * xf[static_cast<std::size_t>(p)]);
            const std::byte* row = src.data() + static_cast<std::size_t>(j * nb) * block;
            const float want = type == DType::kQ4_1 ? ref::vec_dot_q4_1_q8_1(reinterpret_cast<const BlockQ4_1*>(row), x81.data(), nb)
                                                    : ref::vec_dot_q8_0_q8_0(reinterpret_cast<const BlockQ8_0*>(row), x80.data(), nb);
            ASSERT_NEAR(y.ptr<float>()[j], want, 1e-5 * (mag + 1))
                << to_string(type) << " nb " << nb << " n " << n << " row " << j << " offset in page "
                << reinterpret_cast<std::uintptr_t>(at) % 4096;
          }
        }
      }
    }
  }
}

TEST(Quant, BetaAccumulatesAndViewsSliceWholeBlocks) {
  const std::int64_t n = 8, k = 128;
  std::vector<float> wf = random_floats(static_cast<std::size_t>(n * k), 7, 0.1f), xf = activations(k, 8);
  Tensor w = Tensor::empty(DType::kQ4_1, {n, k});
  EXPECT_EQ(w.bytes(), static_cast<std::size_t>(n * k / 32 * 20));
  for (std::int64_t r = 0; r < n; ++r)
    quantize_row_q4_1(wf.data() + r * k, static_cast<BlockQ4_1*>(w.view().row_ptr(r)), k);
  Tensor x = test::f32_tensor(xf, 1, k), full = Tensor::empty(DType::kF32, {1, n}), y = Tensor::empty(DType::kF32, {1, 3});
  Context ctx(1);
  matmul(ctx, x, w, full);
  // Rows 2..4 of w through a row slice; beta = 1 adds to what y held.
  for (int j = 0; j < 3; ++j) y.ptr<float>()[j] = 1.0f;
  matmul(ctx, x, w.view().slice_rows(2, 3), y, {.beta = 1.0f});
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(y.ptr<float>()[j], full.ptr<float>()[2 + j] + 1.0f);
  // A column slice of whole blocks is a view with a larger row stride.
  TensorView cols = w.view().slice_cols(32, 64);
  EXPECT_EQ(static_cast<std::byte*>(cols.row_ptr(1)) - static_cast<std::byte*>(w.view().data), 20 * 4 + 20);
}

TEST(Quant, EmbeddingDequantisesQ8_0Rows) {
  const std::int64_t v = 10, d = 64;
  std::vector<float> tf = random_floats(static_cast<std::size_t>(v * d), 9);
  Tensor table = Tensor::empty(DType::kQ8_0, {v, d});
  for (std::int64_t r = 0; r < v; ++r)
    quantize_row_q8_0(tf.data() + r * d, static_cast<BlockQ8_0*>(table.view().row_ptr(r)), d);
  std::vector<std::int32_t> tokens{3, 12, 9};  // 12 is outside [2, 12): zeros
  Tensor out = Tensor::empty(DType::kF32, {3, d});
  Context ctx(2);
  embedding(ctx, table, tokens, 2, out);
  std::vector<float> want(static_cast<std::size_t>(d));
  dequantize_row(DType::kQ8_0, table.view().row_ptr(1), want.data(), d);
  for (std::int64_t j = 0; j < d; ++j) {
    EXPECT_EQ(out.ptr<float>()[j], want[static_cast<std::size_t>(j)]);
    EXPECT_EQ(out.ptr<float>()[d + j], 0.0f);
  }
}

TEST(Quant, ShapesThatAreNotWholeBlocksAreErrors) {
  EXPECT_THROW(Tensor::empty(DType::kQ4_1, {4, 48}), Error);
  EXPECT_THROW(dtype_size(DType::kQ8_0), Error);
  Tensor w = Tensor::empty(DType::kQ4_1, {4, 64});
  EXPECT_THROW(w.view().slice_cols(16, 32), Error);
  Tensor x = Tensor::empty(DType::kF32, {1, 64}), y = Tensor::empty(DType::kF32, {1, 64});
  Context ctx(1);
  // Other ops do not take block types.
  Tensor norm_w = Tensor::empty(DType::kQ8_0, {1, 64});
  try {
    rms_norm(ctx, x, norm_w, 1e-5f, y);
    ADD_FAILURE() << "rms_norm took q8_0 weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trellis::kernels
