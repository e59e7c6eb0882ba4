#include "convert.hpp"

#include <cmath>
#include <vector>

namespace trellis::runtime::convert {

float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t f32_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // overflow to inf
  if (a < 6.103515625e-05f) {               // subnormal range: round to a multiple of 2^-24
    return sign | static_cast<std::uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  std::uint32_t au;
  std::memcpy(&au, &a, 4);
  // Round mantissa to 10 bits, nearest even.
  au += 0xfffu + ((au >> 13) & 1u);
  std::uint32_t exp = (au >> 23) - 112, man = (au >> 13) & 0x3ffu;
  return sign | static_cast<std::uint16_t>((exp << 10) | man);
}

bool parse_stored(std::string_view dtype, Stored& out) {
  if (dtype == "F32") out = Stored::kF32;
  else if (dtype == "BF16") out = Stored::kBF16;
  else if (dtype == "F16") out = Stored::kF16;
  else return false;
  return true;
}

namespace {
template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
}  // namespace

void convert_row(const std::byte* src, Stored from, void* dst, ElemType to, std::size_t n) {
  if (to == ElemType::kF32) {
    auto* d = static_cast<float*>(dst);
    switch (from) {
      case Stored::kF32: std::memcpy(d, src, n * 4); return;
      case Stored::kBF16:
        for (std::size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(load<std::uint16_t>(src + 2 * i));
        return;
      case Stored::kF16:
        for (std::size_t i = 0; i < n; ++i) d[i] = f16_to_f32(load<std::uint16_t>(src + 2 * i));
        return;
    }
  }
  auto* d = static_cast<std::uint16_t*>(dst);
  switch (from) {
    case Stored::kBF16: std::memcpy(d, src, n * 2); return;
    case Stored::kF32:
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(load<float>(src + 4 * i));
      return;
    case Stored::kF16:
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(f16_to_f32(load<std::uint16_t>(src + 2 * i)));
      return;
  }
}

}  // namespace trellis::runtime::convert
