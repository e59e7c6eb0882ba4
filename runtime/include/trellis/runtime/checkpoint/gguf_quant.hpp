// Conversions between f32 and the ggml block formats trellis reads and writes:
// F32, F16, BF16 (one element per "block") and Q8_0, Q4_0, Q4_1 (32 elements per block).
//   Q8_0: f16 scale d, 32 x int8 q;            x = d * q
//   Q4_0: f16 scale d, 16 bytes of nibbles;    x = d * (q - 8)
//   Q4_1: f16 scale d, f16 min m, 16 bytes;    x = d * q + m
// In the 4-bit formats byte j holds element j in its low nibble and element j + 16 in its
// high nibble. Quantisation rounds as ggml's reference quantisers do, so llama.cpp reads
// the files trellis writes with the same values.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trellis/runtime/checkpoint/gguf.hpp"

namespace trellis::runtime::gguf {

// Converts `n_blocks` whole blocks of type `t` starting at `src` (unaligned is fine) into
// n_blocks * block_elems floats at `dst`. Throws kUnsupported for a type that is not
// dequantizable (see type_traits).
void dequantize_blocks(GgmlType t, const std::byte* src, std::int64_t n_blocks, float* dst);

// Quantises `n` floats (a multiple of the type's block_elems) into `dst`
// (n / block_elems * block_bytes bytes). Throws kUnsupported for other types.
void quantize(GgmlType t, const float* src, std::int64_t n, std::byte* dst);

std::uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(std::uint16_t h);

}  // namespace trellis::runtime::gguf
