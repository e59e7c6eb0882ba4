// Scalar conversions between f32 and the two 16-bit float formats every layer meets:
// bf16 (checkpoints, weights, bf16 all-reduces) and IEEE f16 (checkpoints, GGUF block
// scales). One definition for kernels, transport and runtime, so a rounding fix lands
// everywhere at once.
//
// Rounding: f32 -> bf16 and f32 -> f16 round to nearest, ties to even; NaN stays a (quiet)
// NaN; f32 values beyond f16's range become +-inf; f16 subnormals are kept (not flushed).
// All functions are pure and thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace trellis {

inline float bf16_to_f32(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  // A NaN must not round up into inf: keep its top bits and force the quiet bit.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: man x 2^-24, exact in f32
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign != 0 ? -f : f;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);  // rebias 15 -> 127
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds past the largest finite f16 (65504)
  if (a < 6.103515625e-05f)                 // f16 subnormal range: a multiple of 2^-24
    return sign | static_cast<std::uint16_t>(std::nearbyint(a * 16777216.0f));
  std::uint32_t au;
  std::memcpy(&au, &a, 4);
  au += 0xfffu + ((au >> 13) & 1u);  // round the mantissa to 10 bits, ties to even
  const std::uint32_t exp = (au >> 23) - 112, man = (au >> 13) & 0x3ffu;
  return sign | static_cast<std::uint16_t>((exp << 10) | man);
}

}  // namespace trellis
