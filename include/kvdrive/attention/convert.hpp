// Block conversion of KV rows to float for the CPU attention loops. f16 uses F16C where the
// compiler targets it (exact either way: every half is a float); bf16 is a shift.
#pragma once

#include <cstddef>
#include <cstring>

#include "kvdrive/core/half.hpp"

#if defined(__F16C__) && defined(__AVX__) && !defined(KVD_DISABLE_SIMD)
#include <immintrin.h>
#endif

namespace kvdrive::attention {

inline void to_float_block(const float* src, float* dst, std::size_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void to_float_block(const half* src, float* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__) && defined(__AVX__) && !defined(KVD_DISABLE_SIMD)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = half_bits_to_float(src[i].bits);
}

inline void to_float_block(const bfloat16* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i].bits);
}

}  // namespace kvdrive::attention
