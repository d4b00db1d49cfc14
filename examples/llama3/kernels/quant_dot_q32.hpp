// quant_dot.hpp's tile for the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): each format
// describes its block, and tile_q32 meets the blocks' integer values with Q16x32 activations.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/quant.hpp"
#include "kernels/quant_dot_acts.hpp"
#include "kernels/quant_dot_common.hpp"

namespace kvdrive::llama::quant {

// ---- the 32-value formats ---------------------------------------------------------------------
// Each describes its block: bytes, whether values are signed (Q4_0, Q5_0, Q8_0: q - offset) or
// unsigned with a minimum (Q4_1, Q5_1), and decodes the 32 integer values (portable: ints; AVX2:
// two vectors of 16 int16, the values 0..15 and 16..31).

#if KVD_CPU_AVX2
/// The 32 int8 of w as int16: bytes 0..15 into lo, 16..31 into hi.
inline void widen_i8(__m256i w, __m256i& lo, __m256i& hi) {
  lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
  hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
}
/// The 32 nibbles of 16 packed bytes as int16: low nibbles into lo, high ones into hi.
inline void nibbles_i16(const std::byte* p, __m256i& lo, __m256i& hi) {
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
  hi = _mm256_srli_epi16(v, 4);
}
#endif

struct Q4_0Block {
  static constexpr int kBytes = 18;
  static constexpr bool kMin = false;
  static void values(const std::byte* b, int v[32]) {
    const std::uint8_t* qs = bytes(b + 2);
    for (int j = 0; j < 16; ++j) v[j] = (qs[j] & 0x0F) - 8, v[j + 16] = (qs[j] >> 4) - 8;
  }
#if KVD_CPU_AVX2
  static void values(const std::byte* b, __m256i& lo, __m256i& hi) {
    nibbles_i16(b + 2, lo, hi);
    lo = _mm256_sub_epi16(lo, _mm256_set1_epi16(8));
    hi = _mm256_sub_epi16(hi, _mm256_set1_epi16(8));
  }
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
  static void values(const std::byte* b, __m256i& lo, __m256i& hi) { nibbles_i16(b + 4, lo, hi); }
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
  static void values(const std::byte* b, __m256i& lo, __m256i& hi) {
    const __m256i high = _mm256_andnot_si256(bit_mask32(load_u32(b + 2)), _mm256_set1_epi8(static_cast<char>(0xF0)));
    widen_i8(_mm256_or_si256(nibbles32(b + 6), high), lo, hi);
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
  static void values(const std::byte* b, __m256i& lo, __m256i& hi) {
    const __m256i high = _mm256_and_si256(bit_mask32(load_u32(b + 4)), _mm256_set1_epi8(0x10));
    widen_i8(_mm256_or_si256(nibbles32(b + 8), high), lo, hi);
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
  static void values(const std::byte* b, __m256i& lo, __m256i& hi) {
    lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)));
  }
#endif
};

/// out[r * C + c] = row r . input c, for R weight rows and C activation rows of nb 32-value blocks.
/// A block's integer dot with the int16 activations q, in 8 int32 lanes: lane l = the sum of
/// w[k] * q[k] over k = 2l, 2l + 1, 16 + 2l, 17 + 2l (exact: |I_l| <= 4 * 128 * 32767 < 2^24, so
/// its float is exact too). Per (row, input), with dd = dw * dx:
///   acc[b % 2] = fma(dd, I, acc[b % 2])            (8 float lanes)
///   min[b % 2] = fma(m, s, min[b % 2])              (formats with a minimum m; s = dx * the sum of
///                                                    the block's q; one float)
/// and result = sum_lanes(acc[0] + acc[1]) + (min[0] + min[1]). Two chains (blocks of even and odd
/// index) hide the latency of the accumulation: +25 % for Q4_1 decode against one. No product
/// here can be contracted into an add (the only adds take fma results), so the order is the one
/// written, in both paths.
#if KVD_CPU_AVX2
/// I: the lanes above, from the block's values 0..15 and 16..31 as int16 and its 32 int16 q.
/// Built for a CPU with AVX-VNNI (KVD_ARCH auto or native on one that has it; -mavxvnni), the
/// second product and the add are one vpdpwssd: the same exact integers (no sum here comes near
/// int32's range), one instruction fewer per block and input (SmolLM2's Q4_1 decode tile 3-4 %
/// faster from the caches, on a Xeon of 2026-12-07).
inline __m256i dot_block_i16(__m256i w_lo, __m256i w_hi, const std::int16_t* q) {
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16));
#if defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(w_lo, x0), w_hi, x1);
#else
  return _mm256_add_epi32(_mm256_madd_epi16(w_lo, x0), _mm256_madd_epi16(w_hi, x1));
#endif
}

/// The minimums' terms of C inputs, two chains (blocks of even and odd index) each: a float per
/// input, or for C = 4 the lanes of one vector (the same fmas, four at a time).
template <int C>
struct MinSums {
  float v[2][C] = {};
  template <int kPar>
  void add(float m, const ActRow* a, std::int64_t b) {
    for (int c = 0; c < C; ++c) v[kPar][c] = std::fma(m, a[c].d[2 * b + 1], v[kPar][c]);
  }
  float total(int c) const { return v[0][c] + v[1][c]; }
};

template <>
struct MinSums<4> {
  __m128 v[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
  template <int kPar>
  void add(float m, const ActRow* a, std::int64_t b) {
    const __m128 s = _mm_setr_ps(a[0].d[2 * b + 1], a[1].d[2 * b + 1], a[2].d[2 * b + 1], a[3].d[2 * b + 1]);
    v[kPar] = _mm_fmadd_ps(_mm_set1_ps(m), s, v[kPar]);
  }
  float total(int c) const {
    alignas(16) float l0[4], l1[4];
    _mm_store_ps(l0, v[0]);
    _mm_store_ps(l1, v[1]);
    return l0[c] + l1[c];
  }
};

template <class F, int R, int C>
void tile_q32(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  __m256 acc[R][C][2];
  MinSums<C> mins[R];
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
  // One block into the accumulators `par` (a constant: the arrays stay in registers).
  auto step = [&](std::int64_t b, auto par) {
    constexpr int kPar = decltype(par)::value;
    KVD_UNROLL for (int r = 0; r < R; ++r) {
      const std::byte* blk = rows[r] + b * F::kBytes;
      if constexpr (kPar == 0) prefetch_ahead<2 * F::kBytes>(blk);  // the pair of blocks
      __m256i w_lo, w_hi;                                           // the values 0..15 and 16..31 as int16
      F::values(blk, w_lo, w_hi);
      __m256 dw;                // d, broadcast
      if constexpr (F::kMin) {  // d and m side by side: one conversion
#if KVD_QUANT_F16C
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk))));
        dw = _mm256_broadcastss_ps(dm);
        mins[r].template add<kPar>(_mm_cvtss_f32(_mm_movehdup_ps(dm)), a, b);
#else
        dw = _mm256_set1_ps(load_f16(blk));
        mins[r].template add<kPar>(load_f16(blk + 2), a, b);
#endif
      } else {
        dw = _mm256_set1_ps(scale_f16(blk));
      }
      KVD_UNROLL for (int c = 0; c < C; ++c) {
        const __m256 dd = _mm256_mul_ps(dw, _mm256_broadcast_ss(a[c].d + 2 * b));
        acc[r][c][kPar] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot_block_i16(w_lo, w_hi, a[c].q16 + b * kQK)), acc[r][c][kPar]);
      }
    }
  };
  std::int64_t b = 0;
  for (; b + 1 < nb; b += 2) step(b, std::integral_constant<int, 0>{}), step(b + 1, std::integral_constant<int, 1>{});
  if (b < nb) step(b, std::integral_constant<int, 0>{});
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) {
    const float lanes = sum_lanes(_mm256_add_ps(acc[r][c][0], acc[r][c][1]));
    out[r * C + c] = F::kMin ? lanes + mins[r].total(c) : lanes;
  }
}
#else
// The portable path: the same integers and the same fmas in the same order.
template <class F, int R, int C>
void tile_q32(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc[2][8] = {}, mins[2] = {};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* blk = rows[r] + b * F::kBytes;
        int v[32];
        F::values(blk, v);
        const std::int16_t* x = a[c].q16 + b * kQK;
        const float dd = load_f16(blk) * a[c].d[2 * b];
        for (int l = 0; l < 8; ++l) {
          int s = 0;
          for (int k : {2 * l, 2 * l + 1, 16 + 2 * l, 17 + 2 * l}) s += v[k] * x[k];
          acc[b & 1][l] = std::fma(dd, static_cast<float>(s), acc[b & 1][l]);
        }
        if constexpr (F::kMin) mins[b & 1] = std::fma(load_f16(blk + 2), a[c].d[2 * b + 1], mins[b & 1]);
      }
      float lanes[8];
      for (int l = 0; l < 8; ++l) lanes[l] = acc[0][l] + acc[1][l];
      out[r * C + c] = sum_lanes(lanes) + (mins[0] + mins[1]);
    }
}
#endif

}  // namespace kvdrive::llama::quant
