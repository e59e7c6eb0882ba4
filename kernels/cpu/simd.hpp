// Internal: small SIMD helpers shared by the CPU kernels. AVX-512 paths when the compiler
// targets it (TRELLIS_NATIVE on an AVX-512 machine), plain C++ otherwise; both give the same
// results up to f32 summation order.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
// GCC 12 warns about the "undefined" vectors inside its own intrinsic headers (GCC PR
// 105593); diagnostics are judged by location, so silencing them around the include
// silences only the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define TRELLIS_KERNELS_AVX512 1
#endif

#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels::cpu {

// Element type tags for templates: the storage type of weights/tables.
struct F32 {
  using T = float;
  static constexpr DType kType = DType::kF32;
};
struct BF16 {
  using T = std::uint16_t;
  static constexpr DType kType = DType::kBF16;
};
struct F16 {
  using T = std::uint16_t;
  static constexpr DType kType = DType::kF16;
};

template <typename E>
inline float to_f32(typename E::T v) {
  if constexpr (std::is_same_v<E, F32>) {
    return v;
  } else if constexpr (std::is_same_v<E, BF16>) {
    return bf16_to_f32(v);
  } else {
    return f16_to_f32(v);
  }
}

#ifdef TRELLIS_KERNELS_AVX512
// 16 elements starting at p, converted to f32 (exact for bf16 and f16).
template <typename E>
inline __m512 load16(const typename E::T* p) {
  if constexpr (std::is_same_v<E, F32>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<E, BF16>) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// Sum of the 16 lanes. (Not _mm512_reduce_add_ps: GCC 12's version of it trips
// -Wuninitialized inside the compiler's own header.)
inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // swap 256-bit halves
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // swap 128-bit quarters
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// The first n (< 16) elements at p, zeros after; never reads past p + n.
template <typename E>
inline __m512 load16_partial(const typename E::T* p, int n) {
  __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  if constexpr (std::is_same_v<E, F32>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (std::is_same_v<E, BF16>) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
}
#endif

// dst[0..n) = src[0..n) as f32.
template <typename E>
inline void row_to_f32(const typename E::T* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
#ifdef TRELLIS_KERNELS_AVX512
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16<E>(src + i));
#endif
  for (; i < n; ++i) dst[i] = to_f32<E>(src[i]);
}

// Calls f.template operator()<E>() with the tag type of `t`; throws kUnsupported otherwise.
template <typename F>
decltype(auto) dispatch_dtype(DType t, const char* op, F&& f);

}  // namespace trellis::kernels::cpu

#include "trellis/core/error.hpp"

namespace trellis::kernels::cpu {

template <typename F>
decltype(auto) dispatch_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::kF32: return f.template operator()<F32>();
    case DType::kBF16: return f.template operator()<BF16>();
    case DType::kF16: return f.template operator()<F16>();
    case DType::kQ4_1:
    case DType::kQ8_0: break;  // block types: only matmul and embedding take them (quant.cpp)
  }
  throw_error(ErrorCode::kUnsupported, "{}: dtype {} is not supported on the CPU", op, to_string(t));
}

}  // namespace trellis::kernels::cpu
