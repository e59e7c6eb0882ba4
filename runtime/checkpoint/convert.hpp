// Element conversions between the stored dtypes (F32, BF16, F16) and the compute types
// (f32, bf16). Private to the checkpoint readers and writers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "trellis/runtime/checkpoint/reader.hpp"

namespace trellis::runtime::convert {

inline float bf16_to_f32(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);

enum class Stored { kF32, kBF16, kF16 };
// Parses "F32" / "BF16" / "F16"; returns false for anything else.
bool parse_stored(std::string_view dtype, Stored& out);

// Converts n elements from `src` (stored type) to `dst` (compute type). src may be
// unaligned (safetensors data offsets need not be aligned).
void convert_row(const std::byte* src, Stored from, void* dst, ElemType to, std::size_t n);

}  // namespace trellis::runtime::convert
