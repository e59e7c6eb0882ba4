#include "convert.hpp"

#include <cmath>
#include <vector>

namespace trellis::runtime::convert {

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
