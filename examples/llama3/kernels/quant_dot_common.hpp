// What quant_dot.hpp's tiles share: the fp16 block scale, the fixed order in which a (row,
// input)'s 8 float lanes are added, and AVX2 steps of the weights' decoding (the nibbles of
// packed bytes, a byte mask of 32 bits).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kernels/quant.hpp"

#if KVD_CPU_AVX2 && defined(__F16C__)
#define KVD_QUANT_F16C 1
#else
#define KVD_QUANT_F16C 0
#endif

#if defined(__clang__)
#define KVD_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define KVD_UNROLL _Pragma("GCC unroll 16")
#else
#define KVD_UNROLL
#endif

namespace kvdrive::llama::quant {

/// A block's fp16 scale as float (F16C where available; the same exact value either way).
inline float scale_f16(const std::byte* p) {
#if KVD_QUANT_F16C
  return _cvtsh_ss(load_u16(p));
#else
  return load_f16(p);
#endif
}

/// How far ahead of the block a tile reads it asks for the weights' bytes (4 KiB: 11 rows of
/// SmolLM2's Q4_1 q projection). A decode projection streams each weight once, and with the
/// hardware prefetcher alone each tile waited on memory between its blocks: bench_llama's
/// BM_SmolLM2Gemv (one decode step's projections, 2 threads, a Xeon, 3 alternating rounds) took
/// 8.0-8.5 ms for Q4_1 without and 5.0-6.7 with, 11.6-12.2 with every matrix in Q8_0 against
/// 5.3-7.9 (2 and 8 KiB ahead measured alike); prefill's products did not change. Past a
/// matrix's end it names bytes the program may not own: a prefetch never faults nor reads.
inline constexpr std::uintptr_t kPrefetchAhead = 4096;

/// Asks for the cache lines of the `bytes` bytes kPrefetchAhead beyond p (one request per 64).
template <int kBytes>
inline void prefetch_ahead(const std::byte* p) {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + kPrefetchAhead;
  for (int k = 0; k < kBytes; k += 64) __builtin_prefetch(reinterpret_cast<const void*>(at + static_cast<std::uintptr_t>(k)), 0, 3);
}

/// The fixed order in which a (row, input)'s 8 lanes are added: ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)).
inline float sum_lanes(const float l[8]) {
  const float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
  return (s0 + s2) + (s1 + s3);
}

#if KVD_CPU_AVX2
inline float sum_lanes(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // s0..s3
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                  // s0+s2, s1+s3
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/// The 32 4-bit values of 16 packed bytes: the low nibbles (values 0..15), then the high ones
/// (values 16..31): the bytes in both halves, the upper half shifted right by 4, masked.
inline __m256i nibbles32(const std::byte* p) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}
/// 0xFF in byte j where bit j of the 32-bit qh is set, 0 elsewhere.
inline __m256i bit_mask32(std::uint32_t qh) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                                                                                         0x0202020202020202LL, 0x0303030303030303LL));
  const __m256i bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL);  // all bits but bit j % 8
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, bit), _mm256_set1_epi64x(-1));
}
#endif

}  // namespace kvdrive::llama::quant
