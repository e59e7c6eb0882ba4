// Element conversions between the stored dtypes (F32, BF16, F16) and the compute types
// (f32, bf16). Private to the checkpoint readers and writers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "trellis/core/half.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"

namespace trellis::runtime::convert {

// The scalar conversions live in core (trellis/core/half.hpp).
using ::trellis::bf16_to_f32;
using ::trellis::f16_to_f32;
using ::trellis::f32_to_bf16;
using ::trellis::f32_to_f16;

enum class Stored { kF32, kBF16, kF16 };
// Parses "F32" / "BF16" / "F16"; returns false for anything else.
bool parse_stored(std::string_view dtype, Stored& out);

// Converts n elements from `src` (stored type) to `dst` (compute type). src may be
// unaligned (safetensors data offsets need not be aligned).
void convert_row(const std::byte* src, Stored from, void* dst, ElemType to, std::size_t n);

}  // namespace trellis::runtime::convert
