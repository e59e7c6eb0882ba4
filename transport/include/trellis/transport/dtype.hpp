// bf16 <-> f32 conversion for the transport's reductions (round to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace trellis::transport {

inline float bf16_bits_to_f32(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t f32_to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline void bf16_to_f32(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(in[i]);
}

inline void f32_to_bf16(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = f32_to_bf16_bits(in[i]);
}

}  // namespace trellis::transport
