// Attention against a scalar causal-GQA reference: prefill (whole and chunked), decode with a
// batch of sequences of different lengths, f32 and bf16 caches, and the error cases.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernel_test_util.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

using test::expect_close;
using test::f32_tensor;
using test::random_floats;

// One sequence's K/V as the reference sees them: [pos][kv_head][d], already rounded to the
// cache dtype, plus the [T, kv_heads * d] f32 rows that kv_write takes.
struct Seq {
  std::int64_t len;
  std::vector<float> k, v;  // rounded values, [len, hkv * d]
  Tensor k_rows, v_rows;    // f32 input rows
};

float round_to(DType t, float f) { return t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(f)) : f; }

Seq make_seq(std::int64_t len, int hkv, int d, DType t, std::uint32_t seed) {
  Seq s;
  s.len = len;
  auto k = random_floats(std::size_t(len * hkv * d), seed), v = random_floats(std::size_t(len * hkv * d), seed + 1000);
  s.k_rows = f32_tensor(k, len, hkv * d);
  s.v_rows = f32_tensor(v, len, hkv * d);
  for (auto& x : k) x = round_to(t, x);
  for (auto& x : v) x = round_to(t, x);
  s.k = std::move(k);
  s.v = std::move(v);
  return s;
}

// out row for query vector q (all heads) at position pos (attends to 0..pos).
std::vector<double> reference_row(const AttentionDims& dm, const float* q, const Seq& s, std::int64_t pos) {
  const int d = dm.head_dim, hkv = dm.n_kv_heads, group = dm.n_heads / dm.n_kv_heads;
  std::vector<double> out(std::size_t(dm.n_heads * d), 0.0);
  for (int h = 0; h < dm.n_heads; ++h) {
    int g = h / group;
    std::vector<double> sc(std::size_t(pos + 1));
    double mx = -1e300;
    for (std::int64_t j = 0; j <= pos; ++j) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(q[h * d + i]) * s.k[std::size_t((j * hkv + g) * d + i)];
      sc[std::size_t(j)] = dot / std::sqrt(double(d));
      mx = std::max(mx, sc[std::size_t(j)]);
    }
    double sum = 0;
    for (auto& x : sc) sum += (x = std::exp(x - mx));
    for (std::int64_t j = 0; j <= pos; ++j)
      for (int i = 0; i < d; ++i)
        out[std::size_t(h * d + i)] += sc[std::size_t(j)] / sum * s.v[std::size_t((j * hkv + g) * d + i)];
  }
  return out;
}

struct AttnCase {
  int heads, kv_heads, head_dim;
  DType cache;
  int threads;
};

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, PrefillWholeAndChunked) {
  auto c = GetParam();
  Context ctx(c.threads);
  AttentionDims dm{c.heads, c.kv_heads, c.head_dim};
  const std::int64_t t = 37, width = std::int64_t(c.heads) * c.head_dim;
  KvCache cache(2, 2, c.kv_heads, 64, c.head_dim, c.cache);
  Seq s = make_seq(t, c.kv_heads, c.head_dim, c.cache, 11);
  auto qs = random_floats(std::size_t(t * width), 12);
  auto q = f32_tensor(qs, t, width);
  // Whole prompt in layer 1, slot 1 (other cache planes must not be touched).
  KvView kv = cache.view(1, 1);
  kv_write(ctx, kv, s.k_rows, s.v_rows, 0);
  Tensor out = Tensor::empty(DType::kF32, {t, width});
  attention_prefill(ctx, dm, q, kv, 0, out);
  for (std::int64_t r = 0; r < t; ++r)
    expect_close(out.ptr<float>() + r * width, reference_row(dm, qs.data() + r * width, s, r), 2e-5, 1e-4, "prefill");
  // The same prompt in two chunks (20 + 17) in layer 0, slot 0.
  KvView kv0 = cache.view(0, 0);
  Tensor out2 = Tensor::empty(DType::kF32, {t, width});
  for (auto [start, len] : {std::pair<std::int64_t, std::int64_t>{0, 20}, {20, 17}}) {
    kv_write(ctx, kv0, s.k_rows.view().slice_rows(start, len), s.v_rows.view().slice_rows(start, len), start);
    attention_prefill(ctx, dm, q.view().slice_rows(start, len), kv0, start, out2.view().slice_rows(start, len));
  }
  expect_close(out2.ptr<float>(), std::vector<double>(out.ptr<float>(), out.ptr<float>() + t * width), 1e-6, 1e-5,
               "chunked prefill equals whole prefill");
}

TEST_P(AttentionTest, DecodeBatchOfDifferentLengths) {
  auto c = GetParam();
  Context ctx(c.threads);
  AttentionDims dm{c.heads, c.kv_heads, c.head_dim};
  const std::int64_t width = std::int64_t(c.heads) * c.head_dim;
  const std::vector<std::int64_t> lengths = {1, 9, 30, 17};
  KvCache cache(1, 4, c.kv_heads, 32, c.head_dim, c.cache);
  std::vector<Seq> seqs;
  std::vector<KvView> views;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    seqs.push_back(make_seq(lengths[b], c.kv_heads, c.head_dim, c.cache, 20 + std::uint32_t(b)));
    views.push_back(cache.view(0, int(b)));
    // Prompt then the new token, as a model does: everything but the last, then the last.
    if (lengths[b] > 1)
      kv_write(ctx, views[b], seqs[b].k_rows.view().slice_rows(0, lengths[b] - 1),
               seqs[b].v_rows.view().slice_rows(0, lengths[b] - 1), 0);
    kv_write(ctx, views[b], seqs[b].k_rows.view().slice_rows(lengths[b] - 1, 1),
             seqs[b].v_rows.view().slice_rows(lengths[b] - 1, 1), lengths[b] - 1);
  }
  auto qs = random_floats(std::size_t(std::int64_t(lengths.size()) * width), 30);
  auto q = f32_tensor(qs, std::int64_t(lengths.size()), width);
  Tensor out = Tensor::empty(DType::kF32, {std::int64_t(lengths.size()), width});
  attention_decode(ctx, dm, q, views, lengths, out);
  for (std::size_t b = 0; b < lengths.size(); ++b)
    expect_close(out.ptr<float>() + std::int64_t(b) * width,
                 reference_row(dm, qs.data() + std::int64_t(b) * width, seqs[b], lengths[b] - 1), 2e-5, 1e-4,
                 "decode");
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnCase{4, 4, 16, DType::kF32, 1},   // MHA
                                           AttnCase{8, 2, 64, DType::kF32, 2},   // GQA 4:1
                                           AttnCase{9, 3, 20, DType::kF32, 2},   // SmolLM2-like 3:1, odd dim
                                           AttnCase{6, 1, 33, DType::kBF16, 2},  // MQA, bf16 cache
                                           AttnCase{8, 2, 64, DType::kBF16, 3}));

TEST(Attention, Errors) {
  Context ctx(1);
  KvCache cache(1, 1, 2, 8, 16);
  KvView kv = cache.view(0, 0);
  Tensor rows = Tensor::zeros(DType::kF32, {9, 32});
  try {
    kv_write(ctx, kv, rows, rows, 0);
    FAIL() << "no error for a write past capacity";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
  }
  Tensor q = Tensor::zeros(DType::kF32, {1, 48}), out = Tensor::zeros(DType::kF32, {1, 48});
  EXPECT_THROW(attention_prefill(ctx, {3, 2, 16}, q, kv, 0, out), Error);  // 3 heads, 2 KV heads
  std::vector<KvView> views = {kv};
  std::vector<std::int64_t> too_long = {9};
  Tensor q4 = Tensor::zeros(DType::kF32, {1, 64}), out4 = Tensor::zeros(DType::kF32, {1, 64});
  EXPECT_THROW(attention_decode(ctx, {4, 2, 16}, q4, views, too_long, out4), Error);
  EXPECT_THROW(cache.view(1, 0), Error);
  EXPECT_THROW(KvCache(1, 1, 2, 8, 16, DType::kF16), Error);
}

}  // namespace
}  // namespace trellis::kernels
