// bf16 <-> f32 conversion for the transport's reductions. The scalar rounding rule
// (nearest, ties to even; NaN stays NaN) is core's (trellis/core/half.hpp); these are the
// names and bulk loops the collectives use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trellis/core/half.hpp"

namespace trellis::transport {

inline float bf16_bits_to_f32(std::uint16_t b) { return ::trellis::bf16_to_f32(b); }

inline std::uint16_t f32_to_bf16_bits(float f) { return ::trellis::f32_to_bf16(f); }

inline void bf16_to_f32(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = ::trellis::bf16_to_f32(in[i]);
}

inline void f32_to_bf16(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = ::trellis::f32_to_bf16(in[i]);
}

}  // namespace trellis::transport
