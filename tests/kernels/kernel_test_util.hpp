// Helpers for the kernel tests: seeded random tensors and scalar references in double.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "trellis/kernels/kernels.hpp"

namespace trellis::kernels::test {

// Values in [-1, 1) from a fixed seed.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A tensor of dtype t holding `values` (rounded to t), plus the exact f32 values it holds.
struct Stored {
  Tensor tensor;
  std::vector<float> exact;  // what the tensor holds, as f32
};

inline Stored store(const std::vector<float>& values, DType t, std::int64_t rows, std::int64_t cols) {
  Stored s{Tensor::empty(t, {rows, cols}), std::vector<float>(values.size())};
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (t) {
      case DType::kF32:
        s.tensor.ptr<float>()[i] = values[i];
        s.exact[i] = values[i];
        break;
      case DType::kBF16:
        s.tensor.ptr<std::uint16_t>()[i] = f32_to_bf16(values[i]);
        s.exact[i] = bf16_to_f32(s.tensor.ptr<std::uint16_t>()[i]);
        break;
      case DType::kF16:
        s.tensor.ptr<std::uint16_t>()[i] = f32_to_f16(values[i]);
        s.exact[i] = f16_to_f32(s.tensor.ptr<std::uint16_t>()[i]);
        break;
      default:
        ADD_FAILURE() << "store(): block-quantised types are built in quant_test.cpp";
        return s;
    }
  }
  return s;
}

inline Tensor f32_tensor(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  return store(v, DType::kF32, rows, cols).tensor;
}

// Expects |got - want| <= atol + rtol * |want| for every element; reports the first miss.
inline void expect_close(const float* got, const std::vector<double>& want, double atol, double rtol,
                         const char* what) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << want[i]
                    << " (error " << err << ")";
      return;
    }
  }
}

}  // namespace trellis::kernels::test
