// Row-wise and elementwise ops. Each splits rows over the pool only when a row block is big
// enough to pay for waking a thread (~16K elements); decode-sized calls run inline.
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cpu/simd.hpp"
#include "trellis/kernels/quant.hpp"

namespace trellis::kernels::cpu {
namespace {

std::int64_t row_grain(std::int64_t cols) { return std::max<std::int64_t>(1, (std::int64_t{1} << 14) / std::max<std::int64_t>(cols, 1)); }

float* row(const TensorView& v, std::int64_t r) { return static_cast<float*>(v.row_ptr(r)); }

// A weight/bias vector of any dtype as f32 (these are short: one row).
std::vector<float> vector_f32(const TensorView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.cols()));
  dispatch_dtype(v.dtype, "vector", [&]<typename E>() {
    row_to_f32<E>(static_cast<const typename E::T*>(v.data), out.data(), v.cols());
  });
  return out;
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace

void add_bias(ThreadPool& pool, const TensorView& y, const TensorView& bias) {
  std::vector<float> b = vector_f32(bias);
  const std::int64_t n = y.cols();
  pool.parallel_for(y.rows(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      float* p = row(y, r);
      for (std::int64_t i = 0; i < n; ++i) p[i] += b[static_cast<std::size_t>(i)];
    }
  }, row_grain(n));
}

void rms_norm(ThreadPool& pool, const TensorView& x, const TensorView& weight, float eps, const TensorView& y) {
  std::vector<float> w = vector_f32(weight);
  const std::int64_t d = x.cols();
  pool.parallel_for(x.rows(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const float* in = row(x, r);
      float* out = row(y, r);
      // Sum of squares in double: rows of thousands of f32 values lose digits otherwise.
      double ss = 0;
      for (std::int64_t i = 0; i < d; ++i) ss += static_cast<double>(in[i]) * in[i];
      auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      for (std::int64_t i = 0; i < d; ++i) out[i] = in[i] * inv * w[static_cast<std::size_t>(i)];
    }
  }, row_grain(d));
}

namespace {

// out[i] = f(a[i], b[i]) over matrices of one shape, rows in parallel.
template <typename F>
void binary_rows(ThreadPool& pool, const TensorView& a, const TensorView& b, const TensorView& out, F f) {
  const std::int64_t n = a.cols();
  pool.parallel_for(a.rows(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const float* pa = row(a, r);
      const float* pb = row(b, r);
      float* o = row(out, r);
      for (std::int64_t i = 0; i < n; ++i) o[i] = f(pa[i], pb[i]);
    }
  }, row_grain(n));
}

}  // namespace

void swiglu(ThreadPool& pool, const TensorView& gate, const TensorView& up, const TensorView& out) {
  binary_rows(pool, gate, up, out, [](float g, float u) { return silu(g) * u; });
}

void add(ThreadPool& pool, const TensorView& a, const TensorView& b, const TensorView& out) {
  binary_rows(pool, a, b, out, [](float x, float y) { return x + y; });
}

void softmax_rows(ThreadPool& pool, const TensorView& x) {
  const std::int64_t n = x.cols();
  pool.parallel_for(x.rows(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      float* p = row(x, r);
      float mx = -INFINITY;
      for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, p[i]);
      if (mx == -INFINITY) mx = 0;  // all -inf: keep exp(-inf) = 0 rather than NaN
      double sum = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        p[i] = std::exp(p[i] - mx);
        sum += p[i];
      }
      auto inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
      for (std::int64_t i = 0; i < n; ++i) p[i] *= inv;
    }
  }, row_grain(n));
}

void embedding(ThreadPool& pool, const TensorView& table, std::span<const std::int32_t> tokens,
               std::int64_t vocab_begin, const TensorView& out) {
  const std::int64_t d = table.cols(), v = table.rows();
  if (is_quantized(table.dtype)) {  // a GGUF table kept quantised: dequantise the looked-up rows
    pool.parallel_for(static_cast<std::int64_t>(tokens.size()), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t) {
        std::int64_t id = tokens[static_cast<std::size_t>(t)] - vocab_begin;
        float* o = row(out, t);
        if (id < 0 || id >= v)
          std::fill(o, o + d, 0.0f);
        else
          dequantize_row(table.dtype, table.row_ptr(id), o, d);
      }
    }, row_grain(d));
    return;
  }
  dispatch_dtype(table.dtype, "embedding", [&]<typename E>() {
    pool.parallel_for(static_cast<std::int64_t>(tokens.size()), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t) {
        std::int64_t id = tokens[static_cast<std::size_t>(t)] - vocab_begin;
        float* o = row(out, t);
        if (id < 0 || id >= v) {
          std::fill(o, o + d, 0.0f);
          continue;
        }
        row_to_f32<E>(static_cast<const typename E::T*>(table.row_ptr(id)), o, d);
      }
    }, row_grain(d));
  });
}

void convert(ThreadPool& pool, const TensorView& src, const TensorView& dst) {
  const std::int64_t n = src.cols();
  // A block-quantised source (a GGUF weight) is dequantised row by row; its "type" for the
  // dispatch below is any plain one, unused.
  const DType s_type = is_quantized(src.dtype) ? DType::kF32 : src.dtype;
  dispatch_dtype(s_type, "convert", [&]<typename S>() {
    dispatch_dtype(dst.dtype, "convert", [&]<typename D>() {
      pool.parallel_for(src.rows(), [&](std::int64_t lo, std::int64_t hi) {
        std::vector<float> tmp(static_cast<std::size_t>(n));
        for (std::int64_t r = lo; r < hi; ++r) {
          if (is_quantized(src.dtype))
            dequantize_row(src.dtype, src.row_ptr(r), tmp.data(), n);
          else
            row_to_f32<S>(static_cast<const typename S::T*>(src.row_ptr(r)), tmp.data(), n);
          auto* o = static_cast<typename D::T*>(dst.row_ptr(r));
          for (std::int64_t i = 0; i < n; ++i) {
            float f = tmp[static_cast<std::size_t>(i)];
            if constexpr (std::is_same_v<D, F32>) {
              o[i] = f;
            } else if constexpr (std::is_same_v<D, BF16>) {
              o[i] = f32_to_bf16(f);
            } else {
              o[i] = f32_to_f16(f);
            }
          }
        }
      }, row_grain(n));
    });
  });
}

void apply_rope(ThreadPool& pool, const RopeTable& table, const TensorView& x, int n_heads,
                std::span<const std::int32_t> positions) {
  const int half = table.head_dim() / 2;
  pool.parallel_for(x.rows(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t t = lo; t < hi; ++t) {
      const float* c = table.cos_row(positions[static_cast<std::size_t>(t)]);
      const float* s = table.sin_row(positions[static_cast<std::size_t>(t)]);
      float* base = row(x, t);
      for (int h = 0; h < n_heads; ++h) {
        float* p = base + static_cast<std::int64_t>(h) * 2 * half;
        for (int i = 0; i < half; ++i) {
          float a = p[i], b = p[i + half];
          p[i] = a * c[i] - b * s[i];
          p[i + half] = b * c[i] + a * s[i];
        }
      }
    }
  }, row_grain(x.cols()));
}

}  // namespace trellis::kernels::cpu
