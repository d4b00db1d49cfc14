// quant_dot.hpp's tile for Q4_K and Q5_K: 256-value blocks of 8 sub-blocks, each with a 6-bit
// scale and minimum, met with Q8x256 activations (the minimums through the sums of 16).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/quant.hpp"
#include "kernels/quant_dot_acts.hpp"
#include "kernels/quant_dot_common.hpp"

namespace kvdrive::llama::quant {

/// scale_min_k4 on 32-bit words: the 8 scales and the 8 mins as the bytes of two 64-bit words.
inline void scale_min_k4_words(const std::byte* p, std::uint64_t& sc, std::uint64_t& m) {
  const std::uint32_t s0 = load_u32(p), s1 = load_u32(p + 4), s2 = load_u32(p + 8);
  const std::uint32_t sc_lo = s0 & 0x3f3f3f3fu, sc_hi = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
  const std::uint32_t m_lo = s1 & 0x3f3f3f3fu, m_hi = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
  sc = sc_lo | (static_cast<std::uint64_t>(sc_hi) << 32);
  m = m_lo | (static_cast<std::uint64_t>(m_hi) << 32);
}

/// Q4_K and Q5_K (kHigh: the fifth bits in qh[32]).
template <bool kHigh>
struct QK45Block {
  static constexpr int kBytes = kHigh ? 176 : 144;
  static constexpr int kQs = kHigh ? 48 : 16;
  /// The 256 values 0..31 in order.
  static void values(const std::byte* b, int v[256]) {
    const std::uint8_t* qs = bytes(b + kQs);
    const std::uint8_t* qh = bytes(b + 16);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        v[64 * c + l] = qs[32 * c + l] & 0x0F;
        v[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        if (kHigh) {
          v[64 * c + l] |= ((qh[l] >> (2 * c)) & 1) << 4;
          v[64 * c + 32 + l] |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
        }
      }
  }
};

#if KVD_CPU_AVX2
template <bool kHigh, int R, int C>
void tile_qk45(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  using F = QK45Block<kHigh>;
  __m256 acc[R][C];
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i scales[R], mins[R], qh[R];
    float d[R], dmin[R];
    const std::byte* blk[R];
    KVD_UNROLL for (int r = 0; r < R; ++r) {
      blk[r] = rows[r] + b * F::kBytes;
      prefetch_ahead<F::kBytes>(blk[r]);
      d[r] = scale_f16(blk[r]);
      dmin[r] = scale_f16(blk[r] + 2);
      std::uint64_t sc8, m8;
      scale_min_k4_words(blk[r] + 4, sc8, m8);
      // scales: the 8 int16 scales in both halves (a sub-block's is broadcast by a shuffle);
      // mins: m0 m0 m1 m1 .. m7 m7 as int16, to meet the 16 sums of 16 in one madd.
      scales[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc8))));
      const __m128i m64 = _mm_cvtsi64_si128(static_cast<long long>(m8));
      mins[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m64, m64));
      if constexpr (kHigh) qh[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 16));
    }
    __m256i isum[R][C];
    KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
    KVD_UNROLL for (int k = 0; k < 4; ++k) {  // 64 values: sub-blocks 2k (low nibbles), 2k+1 (high)
      const __m256i pick_lo = _mm256_set1_epi16(static_cast<short>(((4 * k + 1) << 8) | (4 * k)));
      const __m256i pick_hi = _mm256_set1_epi16(static_cast<short>(((4 * k + 3) << 8) | (4 * k + 2)));
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + F::kQs + 32 * k));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if constexpr (kHigh) {  // bit 2k of qh -> value bit 4 (low), bit 2k+1 -> bit 4 (high)
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh[r], 4), bit4));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh[r], 3), bit4));
          qh[r] = _mm256_srli_epi16(qh[r], 2);
        }
        const __m256i sc_lo = _mm256_shuffle_epi8(scales[r], pick_lo), sc_hi = _mm256_shuffle_epi8(scales[r], pick_hi);
        KVD_UNROLL for (int c = 0; c < C; ++c) {
          const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQKK + 64 * k));
          const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQKK + 64 * k + 32));
          const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sc_lo);
          const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sc_hi);
          isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_add_epi32(pl, ph));
        }
      }
    }
    KVD_UNROLL for (int c = 0; c < C; ++c) {
      const float dx = a[c].d[b];
      const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].sums16 + b * 16));
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * dx), _mm256_cvtepi32_ps(isum[r][c]), acc[r][c]);
        const __m256i msum = _mm256_madd_epi16(mins[r], s16);  // lane s: m_s * (sum of sub-block s)
        acc[r][c] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin[r] * dx), _mm256_cvtepi32_ps(msum), acc[r][c]);
      }
    }
  }
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) out[r * C + c] = sum_lanes(acc[r][c]);
}
#else
// The portable path: the same integers and the same fmas in the same order.
template <bool kHigh, int R, int C>
void tile_qk45(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  using F = QK45Block<kHigh>;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* blk = rows[r] + b * F::kBytes;
        int v[256];
        F::values(blk, v);
        std::uint8_t sc[8], m[8];
        scale_min_k4(bytes(blk + 4), sc, m);
        const std::int8_t* x = a[c].q + b * kQKK;
        const std::int16_t* s16 = a[c].sums16 + b * 16;
        int lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int s = 0; s < 8; ++s)
          for (int l = 0; l < 8; ++l) {
            int t = 0;
            for (int k = 0; k < 4; ++k) t += v[32 * s + 4 * l + k] * x[32 * s + 4 * l + k];
            lane[l] += sc[s] * t;
          }
        const float dd = load_f16(blk) * a[c].d[b], dmd = load_f16(blk + 2) * a[c].d[b];
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(dd, static_cast<float>(lane[l]), acc[l]);
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(-dmd, static_cast<float>(m[l] * (s16[2 * l] + s16[2 * l + 1])), acc[l]);
      }
      out[r * C + c] = sum_lanes(acc);
    }
}
#endif

}  // namespace kvdrive::llama::quant
