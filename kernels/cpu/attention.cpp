// Causal GQA attention over the [kv_head, position, head_dim] cache (layout: attention.hpp).
//
// Decode is memory-bound on the cache: one work item is (sequence, KV head), which reads that
// head's keys and values once for all the query heads of its group. Prefill is one work item
// per (query head, query token); a head's keys stay in L2 across its queries. Tree attention
// (SWIFT verification) is prefill with each query's chunk keys restricted to its path.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cpu/simd.hpp"
#include "trellis/kernels/progress_hook.hpp"

namespace trellis::kernels::cpu {
namespace {

template <typename E>
float dot(const float* q, const typename E::T* k, int d) {
  int i = 0;
  float s = 0;
#ifdef TRELLIS_KERNELS_AVX512
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16<E>(k + i), acc);
  if (i < d) acc = _mm512_fmadd_ps(load16_partial<F32>(q + i, d - i), load16_partial<E>(k + i, d - i), acc);
  return hsum(acc);
#endif
  for (; i < d; ++i) s += q[i] * to_f32<E>(k[i]);
  return s;
}

// acc[0..d) += p * v[0..d)
template <typename E>
void axpy(float p, const typename E::T* v, float* acc, int d) {
  int i = 0;
#ifdef TRELLIS_KERNELS_AVX512
  __m512 vp = _mm512_set1_ps(p);
  for (; i + 16 <= d; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(vp, load16<E>(v + i), _mm512_loadu_ps(acc + i)));
#endif
  for (; i < d; ++i) acc[i] += p * to_f32<E>(v[i]);
}

// out[0..NV*16) = sum over j < n of p[j] * v_j, v_j = v + j * stride, with the sum kept in
// registers. The same FMAs in the same order as zeroing out and calling axpy for j = 0, 1,
// ... (so bit for bit what prefill and tree attention compute), without a load and a store
// of the accumulator per key: at short contexts those were most of decode attention.
template <typename E, int NV>
void weighted_sum(const float* p, const typename E::T* v, std::int64_t stride, std::int64_t n, float* out) {
#ifdef TRELLIS_KERNELS_AVX512
  __m512 acc[NV];
  for (int k = 0; k < NV; ++k) acc[k] = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < n; ++j) {
    const __m512 vp = _mm512_set1_ps(p[j]);
    const typename E::T* vj = v + j * stride;
    for (int k = 0; k < NV; ++k) acc[k] = _mm512_fmadd_ps(vp, load16<E>(vj + 16 * k), acc[k]);
  }
  for (int k = 0; k < NV; ++k) _mm512_storeu_ps(out + 16 * k, acc[k]);
#else
  std::fill(out, out + 16 * NV, 0.0f);
  for (std::int64_t j = 0; j < n; ++j) axpy<E>(p[j], v + j * stride, out, 16 * NV);
#endif
}

// In-place softmax of s[0..n); returns nothing, n >= 1.
void softmax(float* s, std::int64_t n) {
  float mx = s[0];
  for (std::int64_t j = 1; j < n; ++j) mx = std::max(mx, s[j]);
  float sum = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  float inv = 1.0f / sum;
  for (std::int64_t j = 0; j < n; ++j) s[j] *= inv;
}

float resolved_scale(const AttentionDims& d) {
  return d.scale != 0.0f ? d.scale : 1.0f / std::sqrt(static_cast<float>(d.head_dim));
}

template <typename E>
const typename E::T* head_base(const TensorView& t, std::int64_t head) {
  return static_cast<const typename E::T*>(t.data) + head * t.stride[0];
}

}  // namespace

void kv_write(ThreadPool& pool, const KvView& kv, const TensorView& k_new, const TensorView& v_new,
              std::int64_t start_pos) {
  const std::int64_t hkv = kv.k.shape[0], d = kv.k.shape[2], t_count = k_new.rows();
  dispatch_dtype(kv.k.dtype, "kv_write", [&]<typename E>() {
    pool.parallel_for(hkv, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t g = lo; g < hi; ++g)
        for (std::int64_t t = 0; t < t_count; ++t)
          for (int which = 0; which < 2; ++which) {
            const TensorView& dst = which ? kv.v : kv.k;
            const float* src = static_cast<const float*>((which ? v_new : k_new).row_ptr(t)) + g * d;
            auto* out = static_cast<typename E::T*>(dst.data) + g * dst.stride[0] + (start_pos + t) * dst.stride[1];
            for (std::int64_t i = 0; i < d; ++i) {
              if constexpr (std::is_same_v<E, F32>) {
                out[i] = src[i];
              } else if constexpr (std::is_same_v<E, BF16>) {
                out[i] = f32_to_bf16(src[i]);
              } else {
                out[i] = f32_to_f16(src[i]);
              }
            }
          }
    }, hkv > 1 && t_count * d >= 4096 ? 1 : hkv);
  });
}

void attention_prefill(ThreadPool& pool, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                       std::int64_t start_pos, const TensorView& out) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const std::int64_t t_count = q.rows(), h_count = dims.n_heads;
  const float scale = resolved_scale(dims);
  dispatch_dtype(kv.k.dtype, "attention_prefill", [&]<typename E>() {
    pool.parallel_for(h_count * t_count, [&](std::int64_t lo, std::int64_t hi) {
      std::vector<float> scores(static_cast<std::size_t>(start_pos + t_count));
      for (std::int64_t item = lo; item < hi; ++item) {
        std::int64_t h = item / t_count, t = item % t_count, g = h / group;
        const float* qh = static_cast<const float*>(q.row_ptr(t)) + h * d;
        float* oh = static_cast<float*>(out.row_ptr(t)) + h * d;
        const typename E::T* kb = head_base<E>(kv.k, g);
        const typename E::T* vb = head_base<E>(kv.v, g);
        std::int64_t n = start_pos + t + 1;
        for (std::int64_t j = 0; j < n; ++j) scores[static_cast<std::size_t>(j)] = scale * dot<E>(qh, kb + j * kv.k.stride[1], d);
        softmax(scores.data(), n);
        if (d == 64) {
          weighted_sum<E, 4>(scores.data(), vb, kv.v.stride[1], n, oh);
        } else if (d == 128) {
          weighted_sum<E, 8>(scores.data(), vb, kv.v.stride[1], n, oh);
        } else {
          std::fill(oh, oh + d, 0.0f);
          for (std::int64_t j = 0; j < n; ++j) axpy<E>(scores[static_cast<std::size_t>(j)], vb + j * kv.v.stride[1], oh, d);
        }
        if ((item & 15) == 15) poll_progress();
      }
    }, 4);
  });
}

void attention_decode(ThreadPool& pool, const AttentionDims& dims, const TensorView& q,
                      std::span<const KvView> kv, std::span<const std::int64_t> lengths, const TensorView& out) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const std::int64_t batch = q.rows(), hkv = dims.n_kv_heads;
  const float scale = resolved_scale(dims);
  dispatch_dtype(kv[0].k.dtype, "attention_decode", [&]<typename E>() {
    pool.parallel_for(batch * hkv, [&](std::int64_t lo, std::int64_t hi) {
      std::vector<float> scores;
      for (std::int64_t item = lo; item < hi; ++item) {
        std::int64_t b = item / hkv, g = item % hkv;
        const KvView& c = kv[static_cast<std::size_t>(b)];
        std::int64_t n = lengths[static_cast<std::size_t>(b)];
        scores.resize(static_cast<std::size_t>(n * group));
        const typename E::T* kb = head_base<E>(c.k, g);
        const typename E::T* vb = head_base<E>(c.v, g);
        const float* q0 = static_cast<const float*>(q.row_ptr(b)) + g * group * d;
        float* o0 = static_cast<float*>(out.row_ptr(b)) + g * group * d;
        // One pass over the keys for all `group` query heads, then one over the values.
        for (std::int64_t j = 0; j < n; ++j)
          for (int i = 0; i < group; ++i)
            scores[static_cast<std::size_t>(i * n + j)] = scale * dot<E>(q0 + i * d, kb + j * c.k.stride[1], d);
        for (int i = 0; i < group; ++i) softmax(scores.data() + i * n, n);
        if (d == 64 || d == 128) {  // the common head sizes: accumulate in registers
          for (int i = 0; i < group; ++i) {
            if (d == 64) weighted_sum<E, 4>(scores.data() + i * n, vb, c.v.stride[1], n, o0 + i * d);
            else weighted_sum<E, 8>(scores.data() + i * n, vb, c.v.stride[1], n, o0 + i * d);
          }
        } else {
          std::fill(o0, o0 + static_cast<std::int64_t>(group) * d, 0.0f);
          for (std::int64_t j = 0; j < n; ++j)
            for (int i = 0; i < group; ++i)
              axpy<E>(scores[static_cast<std::size_t>(i * n + j)], vb + j * c.v.stride[1], o0 + i * d, d);
        }
        if ((item & 15) == 15) poll_progress();
      }
    });
  });
}

void attention_tree(ThreadPool& pool, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                    std::int64_t prefix, std::int64_t chunk_start, std::span<const std::int32_t> parents,
                    const TensorView& out) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const std::int64_t t_count = q.rows(), h_count = dims.n_heads;
  const float scale = resolved_scale(dims);
  dispatch_dtype(kv.k.dtype, "attention_tree", [&]<typename E>() {
    pool.parallel_for(h_count * t_count, [&](std::int64_t lo, std::int64_t hi) {
      std::vector<float> scores(static_cast<std::size_t>(prefix + t_count));
      std::vector<std::int64_t> path;  // cache positions of t's path, root first
      path.reserve(static_cast<std::size_t>(t_count));
      for (std::int64_t item = lo; item < hi; ++item) {
        std::int64_t h = item / t_count, t = item % t_count, g = h / group;
        path.clear();
        for (std::int64_t a = t; a >= 0; a = parents[static_cast<std::size_t>(a)]) path.push_back(chunk_start + a);
        // Ancestors have smaller indices: reversed, the positions ascend, the order in which
        // attention_prefill visits them (a chain gives its bits).
        std::reverse(path.begin(), path.end());
        const float* qh = static_cast<const float*>(q.row_ptr(t)) + h * d;
        float* oh = static_cast<float*>(out.row_ptr(t)) + h * d;
        const typename E::T* kb = head_base<E>(kv.k, g);
        const typename E::T* vb = head_base<E>(kv.v, g);
        const auto np = static_cast<std::int64_t>(path.size()), n = prefix + np;
        for (std::int64_t j = 0; j < prefix; ++j)
          scores[static_cast<std::size_t>(j)] = scale * dot<E>(qh, kb + j * kv.k.stride[1], d);
        for (std::int64_t i = 0; i < np; ++i)
          scores[static_cast<std::size_t>(prefix + i)] =
              scale * dot<E>(qh, kb + path[static_cast<std::size_t>(i)] * kv.k.stride[1], d);
        softmax(scores.data(), n);
        std::fill(oh, oh + d, 0.0f);
        for (std::int64_t j = 0; j < prefix; ++j)
          axpy<E>(scores[static_cast<std::size_t>(j)], vb + j * kv.v.stride[1], oh, d);
        for (std::int64_t i = 0; i < np; ++i)
          axpy<E>(scores[static_cast<std::size_t>(prefix + i)], vb + path[static_cast<std::size_t>(i)] * kv.v.stride[1],
                  oh, d);
        if ((item & 15) == 15) poll_progress();
      }
    }, 4);
  });
}

void kv_copy(const KvView& kv, std::int64_t src, std::int64_t dst, std::int64_t count) {
  // A handful of positions (an accepted path): plain memmoves, no threads.
  const std::size_t es = dtype_size(kv.k.dtype);
  const std::int64_t hkv = kv.k.shape[0], d = kv.k.shape[2];
  const std::size_t row_bytes = static_cast<std::size_t>(d) * es;
  for (const TensorView* t : {&kv.k, &kv.v}) {
    auto* base = static_cast<std::byte*>(t->data);
    const std::int64_t ps = t->stride[1];
    for (std::int64_t g = 0; g < hkv; ++g) {
      std::byte* head = base + static_cast<std::size_t>(g * t->stride[0]) * es;
      if (ps == d) {  // positions packed: one run per head
        std::memmove(head + static_cast<std::size_t>(dst * ps) * es, head + static_cast<std::size_t>(src * ps) * es,
                     static_cast<std::size_t>(count) * row_bytes);
        continue;
      }
      // Padded positions: row by row, in the order that reads every source row before it is
      // overwritten (front to back when moving down, back to front when moving up).
      for (std::int64_t i = 0; i < count; ++i) {
        std::int64_t r = dst < src ? i : count - 1 - i;
        std::memmove(head + static_cast<std::size_t>((dst + r) * ps) * es,
                     head + static_cast<std::size_t>((src + r) * ps) * es, row_bytes);
      }
    }
  }
}

}  // namespace trellis::kernels::cpu
