// quant_dot.hpp's tile for Q6_K: 256-value blocks of 6-bit values with 16 int8 scales, met with
// Q8x256 activations (the -32 offset through the sums of 16).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/quant.hpp"
#include "kernels/quant_dot_acts.hpp"
#include "kernels/quant_dot_common.hpp"

namespace kvdrive::llama::quant {

/// Q6_K: ql[128], qh[64], int8 scales[16], fp16 d. The kernels meet the unsigned 6-bit values
/// and take the -32 offset off as 32 * (scales . sums of 16).
#if KVD_CPU_AVX2
template <int R, int C>
void tile_q6k(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  constexpr int kBytes = 210;
  __m256 acc[R][C];
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i sc8[R], sc16[R];
    float d[R];
    const std::byte* blk[R];
    KVD_UNROLL for (int r = 0; r < R; ++r) {
      blk[r] = rows[r] + b * kBytes;
      prefetch_ahead<kBytes>(blk[r]);
      d[r] = scale_f16(blk[r] + 208);
      const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + 192));
      sc8[r] = _mm256_broadcastsi128_si256(s);  // the 16 int8 scales in both halves
      sc16[r] = _mm256_cvtepi8_epi16(s);        // as int16
    }
    __m256i isum[R][C];
    KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
    // Scale of 32-value unit u: int16 lanes 0..7 take scales[2u], lanes 8..15 scales[2u+1]: the
    // shuffle puts the scale byte in each int16's high byte (0x80: zero), srai sign-extends it.
    __m256i pick = _mm256_setr_epi8(-128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 1, -128, 1, -128, 1, -128, 1, -128,
                                    1, -128, 1, -128, 1, -128, 1);
    KVD_UNROLL for (int h = 0; h < 2; ++h) {
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        const std::byte* ql = blk[r] + 64 * h;
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 128 + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        KVD_UNROLL for (int k = 0; k < 4; ++k) {
          const __m256i pk = _mm256_add_epi8(pick, _mm256_set1_epi16(static_cast<short>((8 * h + 2 * k) << 8)));
          const __m256i scale = _mm256_srai_epi16(_mm256_shuffle_epi8(sc8[r], pk), 8);
          KVD_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQKK + 128 * h + 32 * k));
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], x), scale));
          }
        }
      }
    }
    KVD_UNROLL for (int c = 0; c < C; ++c) {
      const float dx = a[c].d[b];
      const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].sums16 + b * 16));
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16[r], s16), 5);
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r][c], off)), acc[r][c]);
      }
    }
  }
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) out[r * C + c] = sum_lanes(acc[r][c]);
}
#else
// The portable path: the same integers and the same fmas in the same order.
template <int R, int C>
void tile_q6k(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  constexpr int kBytes = 210;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* blk = rows[r] + b * kBytes;
        const std::uint8_t* ql = bytes(blk);
        const std::uint8_t* qh = bytes(blk + 128);
        const auto* sc = reinterpret_cast<const std::int8_t*>(blk + 192);
        const std::int8_t* x = a[c].q + b * kQKK;
        const std::int16_t* s16 = a[c].sums16 + b * 16;
        int lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int u = 0; u < 8; ++u)  // unit u = half u / 4, k = u % 4
          for (int l = 0; l < 8; ++l) {
            int t = 0;
            for (int k = 0; k < 4; ++k) t += q6_k_value(ql, qh, u / 4, u % 4, 4 * l + k) * x[32 * u + 4 * l + k];
            lane[l] += sc[2 * u + (l >= 4 ? 1 : 0)] * t;
          }
        for (int l = 0; l < 8; ++l) lane[l] -= 32 * (sc[2 * l] * s16[2 * l] + sc[2 * l + 1] * s16[2 * l + 1]);
        const float dd = load_f16(blk + 208) * a[c].d[b];
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(dd, static_cast<float>(lane[l]), acc[l]);
      }
      out[r * C + c] = sum_lanes(acc);
    }
}
#endif

}  // namespace kvdrive::llama::quant
