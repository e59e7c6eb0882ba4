// Block (de)quantisation for the ggml formats trellis reads and writes. Dequantisation is
// what the loader runs for every weight, so each format has its own tight loop; the
// quantisers are only used by the writer and tests.
#include "trellis/runtime/checkpoint/gguf_quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "checkpoint/convert.hpp"
#include "trellis/core/error.hpp"

namespace trellis::runtime::gguf {
namespace {

constexpr int kQK = 32;

std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void store_u16(std::byte* p, std::uint16_t v) { std::memcpy(p, &v, 2); }

void dequant_q8_0(const std::byte* src, std::int64_t nb, float* dst) {
  for (std::int64_t b = 0; b < nb; ++b, src += 34, dst += kQK) {
    const float d = f16_bits_to_f32(load_u16(src));
    const auto* q = reinterpret_cast<const std::int8_t*>(src + 2);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(q[j]);
  }
}

void dequant_q4_0(const std::byte* src, std::int64_t nb, float* dst) {
  for (std::int64_t b = 0; b < nb; ++b, src += 18, dst += kQK) {
    const float d = f16_bits_to_f32(load_u16(src));
    const auto* q = reinterpret_cast<const std::uint8_t*>(src + 2);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>((q[j] & 0x0f) - 8);
      dst[j + kQK / 2] = d * static_cast<float>((q[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const std::byte* src, std::int64_t nb, float* dst) {
  for (std::int64_t b = 0; b < nb; ++b, src += 20, dst += kQK) {
    const float d = f16_bits_to_f32(load_u16(src));
    const float m = f16_bits_to_f32(load_u16(src + 2));
    const auto* q = reinterpret_cast<const std::uint8_t*>(src + 4);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>(q[j] & 0x0f) + m;
      dst[j + kQK / 2] = d * static_cast<float>(q[j] >> 4) + m;
    }
  }
}

void quant_q8_0(const float* x, std::int64_t nb, std::byte* dst) {
  for (std::int64_t b = 0; b < nb; ++b, x += kQK, dst += 34) {
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    store_u16(dst, f32_to_f16_bits(d));
    auto* q = reinterpret_cast<std::int8_t*>(dst + 2);
    for (int j = 0; j < kQK; ++j) q[j] = static_cast<std::int8_t>(std::lround(x[j] * id));
  }
}

void quant_q4_0(const float* x, std::int64_t nb, std::byte* dst) {
  for (std::int64_t b = 0; b < nb; ++b, x += kQK, dst += 18) {
    float amax = 0, max = 0;  // max keeps the sign of the largest-magnitude element
    for (int j = 0; j < kQK; ++j)
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
    const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    store_u16(dst, f32_to_f16_bits(d));
    auto* q = reinterpret_cast<std::uint8_t*>(dst + 2);
    for (int j = 0; j < kQK / 2; ++j) {
      int lo = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 8.5f)));
      int hi = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j + kQK / 2] * id + 8.5f)));
      q[j] = static_cast<std::uint8_t>(lo | (hi << 4));
    }
  }
}

void quant_q4_1(const float* x, std::int64_t nb, std::byte* dst) {
  for (std::int64_t b = 0; b < nb; ++b, x += kQK, dst += 20) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const float d = (hi - lo) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
    store_u16(dst, f32_to_f16_bits(d));
    store_u16(dst + 2, f32_to_f16_bits(lo));
    auto* q = reinterpret_cast<std::uint8_t*>(dst + 4);
    for (int j = 0; j < kQK / 2; ++j) {
      int a = std::min(15, static_cast<int>(static_cast<std::int8_t>((x[j] - lo) * id + 0.5f)));
      int c = std::min(15, static_cast<int>(static_cast<std::int8_t>((x[j + kQK / 2] - lo) * id + 0.5f)));
      q[j] = static_cast<std::uint8_t>(a | (c << 4));
    }
  }
}

}  // namespace

std::uint16_t f32_to_f16_bits(float f) { return convert::f32_to_f16(f); }
float f16_bits_to_f32(std::uint16_t h) { return convert::f16_to_f32(h); }

void dequantize_blocks(GgmlType t, const std::byte* src, std::int64_t n_blocks, float* dst) {
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<std::size_t>(n_blocks) * 4);
      return;
    case GgmlType::kF16:
      for (std::int64_t i = 0; i < n_blocks; ++i) dst[i] = f16_bits_to_f32(load_u16(src + 2 * i));
      return;
    case GgmlType::kBF16:
      for (std::int64_t i = 0; i < n_blocks; ++i) dst[i] = convert::bf16_to_f32(load_u16(src + 2 * i));
      return;
    case GgmlType::kQ8_0: dequant_q8_0(src, n_blocks, dst); return;
    case GgmlType::kQ4_0: dequant_q4_0(src, n_blocks, dst); return;
    case GgmlType::kQ4_1: dequant_q4_1(src, n_blocks, dst); return;
    default:
      throw_error(ErrorCode::kUnsupported, "ggml type {} cannot be dequantized by trellis", type_traits(t).name);
  }
}

void quantize(GgmlType t, const float* src, std::int64_t n, std::byte* dst) {
  const TypeTraits& tr = type_traits(t);
  if (n % tr.block_elems != 0)
    throw_error(ErrorCode::kInvalidArgument, "quantize {}: {} elements is not whole blocks of {}", tr.name, n,
                tr.block_elems);
  const std::int64_t nb = n / tr.block_elems;
  switch (t) {
    case GgmlType::kF32: std::memcpy(dst, src, static_cast<std::size_t>(n) * 4); return;
    case GgmlType::kF16:
      for (std::int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, f32_to_f16_bits(src[i]));
      return;
    case GgmlType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, convert::f32_to_bf16(src[i]));
      return;
    case GgmlType::kQ8_0: quant_q8_0(src, nb, dst); return;
    case GgmlType::kQ4_0: quant_q4_0(src, nb, dst); return;
    case GgmlType::kQ4_1: quant_q4_1(src, nb, dst); return;
    default:
      throw_error(ErrorCode::kUnsupported, "trellis cannot write ggml type {}", tr.name);
  }
}

}  // namespace trellis::runtime::gguf
