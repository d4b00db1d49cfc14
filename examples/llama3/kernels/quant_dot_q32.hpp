// quant_dot.hpp's tile for the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): each format
// describes its block, and tile_q32 meets the blocks' integer values with Q8x32 activations.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/quant.hpp"
#include "kernels/quant_dot_acts.hpp"
#include "kernels/quant_dot_common.hpp"

namespace kvdrive::llama::quant {

// ---- the 32-value formats ---------------------------------------------------------------------
// Each describes its block: bytes, whether values are signed (Q4_0, Q5_0, Q8_0: q - offset) or
// unsigned with a minimum (Q4_1, Q5_1), and decodes the 32 integer values (portable: ints; AVX2:
// one vector of int8).

struct Q4_0Block {
  static constexpr int kBytes = 18;
  static constexpr bool kMin = false;
  static void values(const std::byte* b, int v[32]) {
    const std::uint8_t* qs = bytes(b + 2);
    for (int j = 0; j < 16; ++j) v[j] = (qs[j] & 0x0F) - 8, v[j + 16] = (qs[j] >> 4) - 8;
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) { return _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8)); }
#endif
};

struct Q4_1Block {
  static constexpr int kBytes = 20;
  static constexpr bool kMin = true;
  static void values(const std::byte* b, int v[32]) {
    const std::uint8_t* qs = bytes(b + 4);
    for (int j = 0; j < 16; ++j) v[j] = qs[j] & 0x0F, v[j + 16] = qs[j] >> 4;
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) { return nibbles32(b + 4); }
#endif
};

struct Q5_0Block {
  static constexpr int kBytes = 22;
  static constexpr bool kMin = false;
  static void values(const std::byte* b, int v[32]) {
    const std::uint32_t qh = load_u32(b + 2);
    const std::uint8_t* qs = bytes(b + 6);
    for (int j = 0; j < 16; ++j) {
      v[j] = ((qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4)) - 16;
      v[j + 16] = ((qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - 16;
    }
  }
#if KVD_CPU_AVX2
  // q - 16 = the nibble where the fifth bit is set, nibble - 16 (= nibble | 0xF0) where it is not.
  static __m256i values(const std::byte* b) {
    const __m256i hi = _mm256_andnot_si256(bit_mask32(load_u32(b + 2)), _mm256_set1_epi8(static_cast<char>(0xF0)));
    return _mm256_or_si256(nibbles32(b + 6), hi);
  }
#endif
};

struct Q5_1Block {
  static constexpr int kBytes = 24;
  static constexpr bool kMin = true;
  static void values(const std::byte* b, int v[32]) {
    const std::uint32_t qh = load_u32(b + 4);
    const std::uint8_t* qs = bytes(b + 8);
    for (int j = 0; j < 16; ++j) {
      v[j] = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      v[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    }
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) {
    const __m256i hi = _mm256_and_si256(bit_mask32(load_u32(b + 4)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32(b + 8), hi);
  }
#endif
};

struct Q8_0Block {
  static constexpr int kBytes = 34;
  static constexpr bool kMin = false;
  static void values(const std::byte* b, int v[32]) {
    const auto* qs = reinterpret_cast<const std::int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) v[j] = qs[j];
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
#endif
};

/// out[r * C + c] = row r . input c, for R weight rows and C activation rows of nb 32-value blocks.
/// Per (row, input), with I the 8 integer lanes of a block, dd = dw * dx and ms = m * (dx * the
/// sum of the block's q):
///   signed formats:  acc[b % 2] = fma(dd, I, acc[b % 2])
///   with a minimum:  acc[b % 2] += fma(dd, I, (ms, 0, .., 0))   (the minimum's term in lane 0)
/// and result = sum_lanes(acc[0] + acc[1]). Two chains (blocks of even and odd index) hide the
/// latency of the accumulation: +25 % for Q4_1 decode against one. No product here can be
/// contracted into an add (the only adds take fma results), so the order is the one written, in
/// both paths.
#if KVD_CPU_AVX2
template <class F, int R, int C>
void tile_q32(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  __m256 acc[R][C][2];
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
  // One block into the accumulators `par` (a constant: the array stays in registers).
  auto step = [&](std::int64_t b, auto par) {
    __m256i w[R], aw[R];
    __m128 dm[R];  // (d, m, 0, 0) of blocks with a minimum
    __m256 dw[R];  // d, broadcast, of signed blocks
    KVD_UNROLL for (int r = 0; r < R; ++r) {
      const std::byte* blk = rows[r] + b * F::kBytes;
      w[r] = F::values(blk);
      if constexpr (F::kMin) {  // d and m side by side: one conversion
#if KVD_QUANT_F16C
        dm[r] = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk))));
#else
        dm[r] = _mm_setr_ps(load_f16(blk), load_f16(blk + 2), 0.0f, 0.0f);
#endif
      } else {
        dw[r] = _mm256_set1_ps(scale_f16(blk));
        aw[r] = _mm256_abs_epi8(w[r]);
      }
    }
    KVD_UNROLL for (int c = 0; c < C; ++c) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQK));
      if constexpr (F::kMin) {
        // (dx, dx * sum q, 0, 0): one load
        const __m128 xs = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(a[c].d + 2 * b)));
        KVD_UNROLL for (int r = 0; r < R; ++r) {
          const __m128 p = _mm_mul_ps(dm[r], xs);  // (dd, ms, 0, 0)
          const __m256 dd = _mm256_broadcastss_ps(p);
          const __m256 ms = _mm256_zextps128_ps256(_mm_castsi128_ps(_mm_srli_si128(_mm_castps_si128(p), 4)));
          const __m256 t = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot_u8s8(w[r], x)), ms);
          acc[r][c][decltype(par)::value] = _mm256_add_ps(acc[r][c][decltype(par)::value], t);
        }
      } else {
        const __m256 dx = _mm256_broadcast_ss(a[c].d + 2 * b);
        KVD_UNROLL for (int r = 0; r < R; ++r) {
          const __m256 i = _mm256_cvtepi32_ps(dot_s8s8(aw[r], w[r], x));
          acc[r][c][decltype(par)::value] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), i, acc[r][c][decltype(par)::value]);
        }
      }
    }
  };
  std::int64_t b = 0;
  for (; b + 1 < nb; b += 2) step(b, std::integral_constant<int, 0>{}), step(b + 1, std::integral_constant<int, 1>{});
  if (b < nb) step(b, std::integral_constant<int, 0>{});
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) out[r * C + c] = sum_lanes(_mm256_add_ps(acc[r][c][0], acc[r][c][1]));
}
#else
// The portable path: the same integers and the same fmas in the same order.
template <class F, int R, int C>
void tile_q32(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc[2][8] = {};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* blk = rows[r] + b * F::kBytes;
        int v[32];
        F::values(blk, v);
        const std::int8_t* x = a[c].q + b * kQK;
        const float dd = load_f16(blk) * a[c].d[2 * b];
        for (int l = 0; l < 8; ++l) {
          int s = 0;
          for (int k = 0; k < 4; ++k) s += v[4 * l + k] * x[4 * l + k];
          if constexpr (F::kMin) {
            const float ms = l == 0 ? load_f16(blk + 2) * a[c].d[2 * b + 1] : 0.0f;
            acc[b & 1][l] = acc[b & 1][l] + std::fma(dd, static_cast<float>(s), ms);
          } else {
            float& lane = acc[b & 1][l];
            lane = std::fma(dd, static_cast<float>(s), lane);
          }
        }
      }
      float lanes[8];
      for (int l = 0; l < 8; ++l) lanes[l] = acc[0][l] + acc[1][l];
      out[r * C + c] = sum_lanes(lanes);
    }
}
#endif

}  // namespace kvdrive::llama::quant
