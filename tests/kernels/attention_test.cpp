// Attention against a scalar causal-GQA reference: prefill (whole and chunked), decode with a
// batch of sequences of different lengths, f32 and bf16 caches, and the error cases. Then
// SWIFT's tree attention (chains equal prefill; trees and forests against a reference that
// lists each query's visible keys; stale positions between prefix and chunk) and kv_copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>

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

// ---- tree attention and kv_copy (SWIFT) ------------------------------------------------

// A KV view's plane (K or V) as f32, [pos][kv_head][d] (host memory, f32/bf16).
std::vector<float> read_plane(const TensorView& t) {
  const std::int64_t hkv = t.shape[0], cap = t.shape[1], d = t.shape[2];
  std::vector<float> out(std::size_t(cap * hkv * d));
  for (std::int64_t g = 0; g < hkv; ++g)
    for (std::int64_t p = 0; p < cap; ++p)
      for (std::int64_t i = 0; i < d; ++i) {
        std::int64_t at = g * t.stride[0] + p * t.stride[1] + i;
        out[std::size_t((p * hkv + g) * d + i)] =
            t.dtype == DType::kBF16 ? bf16_to_f32(t.ptr<std::uint16_t>()[at]) : t.ptr<float>()[at];
      }
  return out;
}

// Output row for the query vector q (all heads) attending to exactly the cache positions
// `visible`, in double; kc/vc from read_plane.
std::vector<double> reference_visible(const AttentionDims& dm, const float* q, const std::vector<float>& kc,
                                      const std::vector<float>& vc, const std::vector<std::int64_t>& visible) {
  const int d = dm.head_dim, hkv = dm.n_kv_heads, group = dm.n_heads / dm.n_kv_heads;
  std::vector<double> out(std::size_t(dm.n_heads * d), 0.0);
  for (int h = 0; h < dm.n_heads; ++h) {
    int g = h / group;
    std::vector<double> sc(visible.size());
    double mx = -1e300;
    for (std::size_t j = 0; j < visible.size(); ++j) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(q[h * d + i]) * kc[std::size_t((visible[j] * hkv + g) * d + i)];
      sc[j] = dot / std::sqrt(double(d));
      mx = std::max(mx, sc[j]);
    }
    double sum = 0;
    for (auto& x : sc) sum += (x = std::exp(x - mx));
    for (std::size_t j = 0; j < visible.size(); ++j)
      for (int i = 0; i < d; ++i)
        out[std::size_t(h * d + i)] += sc[j] / sum * vc[std::size_t((visible[j] * hkv + g) * d + i)];
  }
  return out;
}

// The positions query t of a tree chunk sees, built explicitly: the prefix, then t's path.
std::vector<std::int64_t> visible_positions(std::int64_t prefix, std::int64_t chunk_start,
                                            const std::vector<std::int32_t>& parents, std::int64_t t) {
  std::vector<std::int64_t> v;
  for (std::int64_t p = 0; p < prefix; ++p) v.push_back(p);
  for (std::int64_t a = t; a != -1; a = parents[std::size_t(a)]) v.push_back(chunk_start + a);
  return v;
}

// Writes random keys/values (scaled by `scale`) to positions [start, start + n) of kv.
void fill_random(const Context& ctx, const KvView& kv, std::int64_t start, std::int64_t n, std::uint32_t seed,
                 float scale = 1.0f) {
  if (n == 0) return;
  const std::int64_t w = kv.k.shape[0] * kv.k.shape[2];
  kv_write(ctx, kv, f32_tensor(random_floats(std::size_t(n * w), seed, scale), n, w),
           f32_tensor(random_floats(std::size_t(n * w), seed + 500, scale), n, w), start);
}

// Positions [start, start + n) get keys of ordinary size but values of 1e4: a query that
// attends to any of them by mistake is off by orders of magnitude.
void fill_poison(const Context& ctx, const KvView& kv, std::int64_t start, std::int64_t n, std::uint32_t seed) {
  if (n == 0) return;
  const std::int64_t w = kv.k.shape[0] * kv.k.shape[2];
  kv_write(ctx, kv, f32_tensor(random_floats(std::size_t(n * w), seed, 2.0f), n, w),
           f32_tensor(std::vector<float>(std::size_t(n * w), 1e4f), n, w), start);
}

class TreeAttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(TreeAttentionTest, ChainEqualsPrefill) {
  auto c = GetParam();
  Context ctx(c.threads);
  AttentionDims dm{c.heads, c.kv_heads, c.head_dim};
  const std::int64_t width = std::int64_t(c.heads) * c.head_dim, t = 9;
  KvCache cache(1, 1, c.kv_heads, 40, c.head_dim, c.cache);
  KvView kv = cache.view(0, 0);
  fill_random(ctx, kv, 0, 40, 40);
  std::vector<std::int32_t> chain(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) chain[std::size_t(i)] = std::int32_t(i) - 1;
  auto q = f32_tensor(random_floats(std::size_t(t * width), 41), t, width);
  for (std::int64_t start : {std::int64_t{0}, std::int64_t{13}, std::int64_t{31}}) {
    Tensor want = Tensor::empty(DType::kF32, {t, width}), got = Tensor::empty(DType::kF32, {t, width});
    attention_prefill(ctx, dm, q, kv, start, want);
    attention_tree(ctx, dm, q, kv, start, start, chain, got);
    for (std::int64_t i = 0; i < t * width; ++i)
      if (got.ptr<float>()[i] != want.ptr<float>()[i]) {
        ADD_FAILURE() << "chain at start " << start << ": element " << i << " is " << got.ptr<float>()[i]
                      << ", attention_prefill gave " << want.ptr<float>()[i];
        break;
      }
  }
}

TEST_P(TreeAttentionTest, BranchingTreesAgainstReference) {
  auto c = GetParam();
  Context ctx(c.threads);
  AttentionDims dm{c.heads, c.kv_heads, c.head_dim};
  const std::int64_t width = std::int64_t(c.heads) * c.head_dim, cap = 48;
  // A tree, a forest (two roots) and a lone root, with and without a committed prefix.
  const std::vector<std::vector<std::int32_t>> trees = {
      {-1, 0, 1, 0, 3, 1}, {-1, -1, 0, 1, 2, 2, 5, 0, 7, 3}, {-1}};
  std::uint32_t seed = 50;
  for (const auto& parents : trees)
    for (std::int64_t start : {std::int64_t{0}, std::int64_t{10}}) {
      const auto t = std::int64_t(parents.size());
      KvCache cache(1, 1, c.kv_heads, cap, c.head_dim, c.cache);
      KvView kv = cache.view(0, 0);
      fill_random(ctx, kv, 0, start + t, seed++);
      fill_poison(ctx, kv, start + t, cap - start - t, seed++);  // after the chunk
      auto qs = random_floats(std::size_t(t * width), seed++);
      auto q = f32_tensor(qs, t, width);
      Tensor out = Tensor::empty(DType::kF32, {t, width});
      attention_tree(ctx, dm, q, kv, start, start, parents, out);
      auto kc = read_plane(kv.k), vc = read_plane(kv.v);
      for (std::int64_t r = 0; r < t; ++r)
        expect_close(out.ptr<float>() + r * width,
                     reference_visible(dm, qs.data() + r * width, kc, vc, visible_positions(start, start, parents, r)),
                     2e-5, 1e-4, "tree attention");
    }
}

TEST_P(TreeAttentionTest, StalePositionsBetweenPrefixAndChunkIgnored) {
  auto c = GetParam();
  Context ctx(c.threads);
  AttentionDims dm{c.heads, c.kv_heads, c.head_dim};
  const std::int64_t width = std::int64_t(c.heads) * c.head_dim, cap = 32, prefix = 7, chunk_start = 15;
  const std::vector<std::int32_t> parents = {-1, 0, 1, 0, 3, 1};
  const auto t = std::int64_t(parents.size());
  KvCache cache(1, 2, c.kv_heads, cap, c.head_dim, c.cache);
  KvView kv = cache.view(0, 1);
  fill_random(ctx, kv, 0, prefix, 60);
  fill_poison(ctx, kv, prefix, chunk_start - prefix, 61);  // stale drafts
  fill_random(ctx, kv, chunk_start, t, 62);
  fill_poison(ctx, kv, chunk_start + t, cap - chunk_start - t, 63);
  auto qs = random_floats(std::size_t(t * width), 64);
  auto q = f32_tensor(qs, t, width);
  Tensor out = Tensor::empty(DType::kF32, {t, width});
  attention_tree(ctx, dm, q, kv, prefix, chunk_start, parents, out);
  auto kc = read_plane(kv.k), vc = read_plane(kv.v);
  for (std::int64_t r = 0; r < t; ++r)
    expect_close(out.ptr<float>() + r * width,
                 reference_visible(dm, qs.data() + r * width, kc, vc, visible_positions(prefix, chunk_start, parents, r)),
                 2e-5, 1e-4, "tree attention with stale positions");
  // No prefix at all: the roots see only themselves.
  attention_tree(ctx, dm, q, kv, 0, chunk_start, parents, out);
  for (std::int64_t r = 0; r < t; ++r)
    expect_close(out.ptr<float>() + r * width,
                 reference_visible(dm, qs.data() + r * width, kc, vc, visible_positions(0, chunk_start, parents, r)),
                 2e-5, 1e-4, "tree attention without a prefix");
}

INSTANTIATE_TEST_SUITE_P(Shapes, TreeAttentionTest,
                         ::testing::Values(AttnCase{4, 2, 16, DType::kF32, 1},   // GQA 2:1
                                           AttnCase{4, 2, 24, DType::kF32, 2},   // odd head_dim
                                           AttnCase{4, 2, 16, DType::kBF16, 2},  // bf16 cache
                                           AttnCase{6, 2, 24, DType::kBF16, 3},  // 3:1, bf16, odd dim
                                           AttnCase{4, 4, 33, DType::kF32, 2},   // MHA, dim past 32
                                           // Head sizes whose decode/prefill sums stay in registers:
                                           // the chain must still equal them bit for bit.
                                           AttnCase{6, 2, 64, DType::kF32, 2}, AttnCase{4, 1, 128, DType::kBF16, 2}));

// kv_copy on a cache plane as f32 [pos][kv_head][d]: the expected result of a memmove.
std::vector<float> moved(std::vector<float> plane, std::int64_t hkv, std::int64_t d, std::int64_t src, std::int64_t dst,
                         std::int64_t count) {
  std::vector<float> from(plane.begin() + src * hkv * d, plane.begin() + (src + count) * hkv * d);
  std::copy(from.begin(), from.end(), plane.begin() + dst * hkv * d);
  return plane;
}

void expect_plane(const TensorView& t, const std::vector<float>& want, const std::string& what) {
  auto got = read_plane(t);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      ADD_FAILURE() << what << ": element " << i << " (position " << i / std::size_t(t.shape[0] * t.shape[2]) << ") is "
                    << got[i] << ", expected " << want[i];
      return;
    }
}

struct CopyCase {
  int kv_heads, head_dim;
  DType cache;
  std::int64_t pad;  // extra elements between positions (0: the KvCache layout)
};

class KvCopyTest : public ::testing::TestWithParam<CopyCase> {};

TEST_P(KvCopyTest, OverlappingAndDisjointRanges) {
  auto c = GetParam();
  Context ctx(2);
  const std::int64_t cap = 32, hkv = c.kv_heads, d = c.head_dim;
  // Layer 1, slot 0 of a cache, or a view whose positions are padded (row by row path).
  KvCache cache(2, 2, c.kv_heads, cap, c.head_dim, c.cache);
  Tensor padded = Tensor::zeros(c.cache, {2, hkv, cap, d + c.pad});
  KvView kv = cache.view(1, 0);
  if (c.pad > 0)
    for (int which = 0; which < 2; ++which) {
      TensorView& t = which ? kv.v : kv.k;
      t = TensorView::contiguous(static_cast<std::byte*>(padded.view().data) +
                                     std::size_t(which * hkv * cap * (d + c.pad)) * dtype_size(c.cache),
                                 c.cache, {hkv, cap, d + c.pad});
      t.shape[2] = d;
    }
  fill_random(ctx, kv, 0, cap, 70);
  auto k = read_plane(kv.k), v = read_plane(kv.v);
  struct Move {
    std::int64_t src, dst, count;
  };
  // Overlapping forward (dst > src) and backward, disjoint, adjacent, to the end, no-ops.
  for (Move m : {Move{4, 7, 6}, Move{10, 8, 9}, Move{20, 2, 3}, Move{0, 5, 5}, Move{25, 29, 3}, Move{3, 3, 4},
                 Move{9, 1, 0}, Move{1, 0, 31}, Move{0, 1, 31}}) {
    kv_copy(ctx, kv, m.src, m.dst, m.count);
    k = moved(k, hkv, d, m.src, m.dst, m.count);
    v = moved(v, hkv, d, m.src, m.dst, m.count);
    std::string what = "kv_copy " + std::to_string(m.src) + " -> " + std::to_string(m.dst) + " x " +
                       std::to_string(m.count);
    expect_plane(kv.k, k, what + " keys");
    expect_plane(kv.v, v, what + " values");
  }
  // The other planes of the cache stay zero.
  for (auto [layer, slot] : {std::pair{0, 0}, {0, 1}, {1, 1}})
    if (c.pad == 0 || layer != 1 || slot != 0) {
      std::vector<float> zero(std::size_t(cap * hkv * d), 0.0f);
      expect_plane(cache.view(layer, slot).k, zero, "untouched keys");
      expect_plane(cache.view(layer, slot).v, zero, "untouched values");
    }
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvCopyTest,
                         ::testing::Values(CopyCase{2, 16, DType::kF32, 0}, CopyCase{2, 24, DType::kBF16, 0},
                                           CopyCase{3, 24, DType::kF32, 8}, CopyCase{2, 16, DType::kBF16, 5}));

void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(TreeAttention, Errors) {
  Context ctx(1);
  AttentionDims dm{4, 2, 16};
  KvCache cache(1, 1, 2, 16, 16);
  KvView kv = cache.view(0, 0);
  Tensor q = Tensor::zeros(DType::kF32, {3, 64}), out = Tensor::zeros(DType::kF32, {3, 64});
  const std::vector<std::int32_t> ok = {-1, 0, 0};
  attention_tree(ctx, dm, q, kv, 4, 4, ok, out);  // fine
  const std::vector<std::int32_t> self = {-1, 1, 0}, later = {-1, 2, 0}, below = {-1, 0, -2};
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, 4, 4, self, out); }, {"attention_tree", "parents[1] is 1"});
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, 4, 4, later, out); }, {"attention_tree", "parents[1] is 2"});
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, 4, 4, below, out); }, {"attention_tree", "parents[2] is -2"});
  const std::vector<std::int32_t> two = {-1, 0};
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, 4, 4, two, out); }, {"attention_tree", "2 parents"});
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, 5, 4, ok, out); }, {"attention_tree", "prefix 5", "chunk_start 4"});
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, -1, 4, ok, out); }, {"attention_tree", "prefix -1"});
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, 4, 14, ok, out); }, {"attention_tree", "[14, 17)", "16"});
  attention_tree(ctx, dm, q, kv, 13, 13, ok, out);  // exactly fills the cache
  Tensor out2 = Tensor::zeros(DType::kF32, {2, 64});
  expect_invalid([&] { attention_tree(ctx, dm, q, kv, 0, 0, ok, out2); }, {"attention_tree", "3 queries"});

  expect_invalid([&] { kv_copy(ctx, kv, 10, 0, 7); }, {"kv_copy", "[10, 17)", "capacity 16"});
  expect_invalid([&] { kv_copy(ctx, kv, 0, 12, 5); }, {"kv_copy", "[12, 17)"});
  expect_invalid([&] { kv_copy(ctx, kv, -1, 0, 2); }, {"kv_copy", "from -1"});
  expect_invalid([&] { kv_copy(ctx, kv, 0, 1, -2); }, {"kv_copy", "-2 positions"});
  kv_copy(ctx, kv, 0, 8, 8);  // fine: up to the end
}

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
