// The AVX2 loops behind index::token_first_looks and index::token_page_estimates
// (index/token_keys.hpp; the row layout is index::TokenKeys'). The first look: eight pages at a
// time, each page mean's 7-bit codes multiplied with up to four heads' 8-bit query codes by byte
// multiply-adds (exact integers, as token_mean_dot), the eight pages' sums taken by one transpose,
// then scaled and given their radii's bonus together. The page estimate: per page, eight tokens at
// a time, each token's nibbles unpacked once for up to four heads and multiplied the same way, the
// eight tokens' sums taken by one transpose; then per head the softmax statistics of the page's
// token scores eight pages wide (exp_rank8), and the logs of all pages eight at a time
// (log_positive8) at the end. tests/test_index_rescore.cpp checks both against the
// KVD_HOST_DEVICE arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"

namespace kvdrive::index {

/// A GQA group's coded query heads by pointer: q8 [group][d], each head's scale and code sum, and
/// the first look's radius weights [group][2].
struct TokenQueryView {
  const std::int8_t* q8;
  const float* scale;
  const int* sum;
  const float* pair_w;
  int group;
  int d;
};

#if KVD_CPU_AVX2
namespace detail {
/// The eight int32 sums of eight vectors (exact), as one vector.
inline __m256i sum8_epi32(const __m256i a[8]) {
  const __m256i s01 = _mm256_hadd_epi32(a[0], a[1]), s23 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i s45 = _mm256_hadd_epi32(a[4], a[5]), s67 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20), _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

/// One token's code dot products with HB query heads, as HB vectors of int32 partial sums. Byte
/// multiply-adds (unsigned codes x signed query codes) sum into int16 lanes, which hold four
/// chunks' products exactly (8 x 15 x 127 < 2^15), then widen to int32.
template <int HB>
inline void token_dots_avx2(const std::int8_t* const* q8, const std::uint8_t* codes, int half, __m256i* acc) {
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i p[HB];
  for (int h = 0; h < HB; ++h) acc[h] = p[h] = _mm256_setzero_si256();
  for (int i = 0, chunk = 1; i < half; i += 32, ++chunk) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i));
    const __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
    for (int h = 0; h < HB; ++h) {
      const __m256i a = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8[h] + i)));
      const __m256i c = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8[h] + half + i)));
      p[h] = _mm256_add_epi16(p[h], _mm256_add_epi16(a, c));
    }
    if (chunk % 4 == 0 || i + 32 >= half)
      for (int h = 0; h < HB; ++h) {
        acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(p[h], ones));
        p[h] = _mm256_setzero_si256();
      }
  }
}

/// A page mean's code dot products with HB query heads (d bytes of codes <= 127, so a byte
/// multiply-add of two channels fits int16), as HB vectors of int32 partial sums.
template <int HB>
inline void mean_dots_avx2(const std::int8_t* const* q8, const std::uint8_t* codes, int d, __m256i* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < HB; ++h) acc[h] = _mm256_setzero_si256();
  for (int i = 0; i < d; i += 32) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i));
    for (int h = 0; h < HB; ++h) {
      const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8[h] + i)));
      acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(p, ones));
    }
  }
}

/// Eight tokens' code dot products with HB query heads (tokens past nt count 0), as HB vectors
/// of eight int32 sums, for heads of 2 x HALF <= 128 channels: a token's products sum exactly
/// in int16 lanes (4 x 2 x 15 x 127 < 2^15), and so do two tokens' lanes added pairwise, so the
/// eight tokens' sums take two 16-bit pairings and one widening fewer than token_dots_avx2's.
template <int HB, int HALF>
inline void eight_token_dots16_avx2(const std::int8_t* const* q8, const std::uint8_t* codes, int nt, __m256i* dot) {
  static_assert(HALF % 32 == 0 && HALF <= 64, "two int16 tokens per lane hold heads of up to 128 channels");
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i w[4][HB];
  for (int pair = 0; pair < 4; ++pair) {
    __m256i p[2][HB];
    for (int k = 0; k < 2; ++k) {
      const int t = 2 * pair + k;
      for (int h = 0; h < HB; ++h) p[k][h] = _mm256_setzero_si256();
      if (t >= nt) continue;
      for (int i = 0; i < HALF; i += 32) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + static_cast<std::size_t>(t) * HALF + i));
        const __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
        for (int h = 0; h < HB; ++h) {
          const __m256i a = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8[h] + i)));
          const __m256i c = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8[h] + HALF + i)));
          p[k][h] = _mm256_add_epi16(p[k][h], _mm256_add_epi16(a, c));
        }
      }
    }
    for (int h = 0; h < HB; ++h) w[pair][h] = _mm256_madd_epi16(_mm256_hadd_epi16(p[0][h], p[1][h]), ones);
  }
  for (int h = 0; h < HB; ++h) {  // per 128-bit half: tokens 0-3, then 4-7; the halves added
    const __m256i x0 = _mm256_hadd_epi32(w[0][h], w[1][h]), x1 = _mm256_hadd_epi32(w[2][h], w[3][h]);
    dot[h] = _mm256_add_epi32(_mm256_permute2x128_si256(x0, x1, 0x20), _mm256_permute2x128_si256(x0, x1, 0x31));
  }
}

/// Eight tokens' code dot products with HB query heads (tokens past nt count 0), any head size.
template <int HB>
inline void eight_token_dots_avx2(const std::int8_t* const* q8, const std::uint8_t* codes, int half, int nt, __m256i* dot) {
  if (half == 64) return eight_token_dots16_avx2<HB, 64>(q8, codes, nt, dot);
  if (half == 32) return eight_token_dots16_avx2<HB, 32>(q8, codes, nt, dot);
  __m256i acc[HB][8], token[HB];
  for (int t = 0; t < 8; ++t) {
    if (t < nt) token_dots_avx2<HB>(q8, codes + static_cast<std::size_t>(t) * half, half, token);
    for (int h = 0; h < HB; ++h) acc[h][t] = t < nt ? token[h] : _mm256_setzero_si256();
  }
  for (int h = 0; h < HB; ++h) dot[h] = sum8_epi32(acc[h]);
}

/// The sum of eight int32 lanes.
inline int horizontal_sum_epi32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
}

/// A mask of the first n (0..8) of eight int32 lanes.
inline __m256i first_lanes(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }

/// Token scores of heads [h0, h0 + HB) over one page into s[h * rows + t], rows past the page's
/// tokens -inf: per coded row (the mean and each token's residual), (dot - the codes' offset x
/// the head's code sum) x the head's scale x the row's scale; a token's score is its residual's
/// plus the mean's (given[h * given_stride] where given).
template <int HB>
inline void page_token_scores_avx2(const TokenQueryView& q, int h0, const std::uint8_t* row, int tokens, int rows, float* s, const float* given,
                                   std::size_t given_stride) {
  const int half = q.d / 2;
  const std::uint8_t* scales = row + static_cast<std::size_t>(tokens) * half + static_cast<std::size_t>(q.d);
  const std::int8_t* q8[HB];
  for (int h = 0; h < HB; ++h) q8[h] = q.q8 + static_cast<std::size_t>(h0 + h) * q.d;
  float mean[HB];
  if (given) {
    for (int h = 0; h < HB; ++h) mean[h] = given[static_cast<std::size_t>(h0 + h) * given_stride];
  } else {
    __m256i mean_dots[HB];
    mean_dots_avx2<HB>(q8, row + static_cast<std::size_t>(tokens) * half, q.d, mean_dots);
    float mean_scale;
    std::memcpy(&mean_scale, scales + static_cast<std::size_t>(tokens) * sizeof(float), sizeof mean_scale);
    for (int h = 0; h < HB; ++h)
      mean[h] = static_cast<float>(horizontal_sum_epi32(mean_dots[h]) - 64 * q.sum[h0 + h]) * (q.scale[h0 + h] * mean_scale);
  }
  for (int t0 = 0; t0 < tokens; t0 += 8) {
    const int nt = tokens - t0 < 8 ? tokens - t0 : 8;
    __m256i dots[HB];
    eight_token_dots_avx2<HB>(q8, row + static_cast<std::size_t>(t0) * half, half, nt, dots);
    const __m256i valid = first_lanes(nt);
    // the row's scales are read in place, a lane past nt as 0 (a copy to the stack first would
    // stall each load on two smaller stores)
    const __m256 token_scales = _mm256_maskload_ps(reinterpret_cast<const float*>(scales + static_cast<std::size_t>(t0) * sizeof(float)), valid);
    for (int h = 0; h < HB; ++h) {
      const int hh = h0 + h;
      const __m256i dot = _mm256_sub_epi32(dots[h], _mm256_set1_epi32(8 * q.sum[hh]));
      const __m256 unit = _mm256_mul_ps(_mm256_set1_ps(q.scale[hh]), token_scales);
      const __m256 score = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), unit), _mm256_set1_ps(mean[h]));
      _mm256_storeu_ps(s + static_cast<std::size_t>(hh) * rows + t0, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), score, _mm256_castsi256_ps(valid)));
    }
  }
}

/// Eight vectors transposed in place: lane j of r[t] becomes lane t of r[j].
inline void transpose8_ps(__m256* r) {
  const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]), a2 = _mm256_unpacklo_ps(r[2], r[3]),
               a3 = _mm256_unpackhi_ps(r[2], r[3]), a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]),
               a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xee), b2 = _mm256_shuffle_ps(a1, a3, 0x44),
               b3 = _mm256_shuffle_ps(a1, a3, 0xee), b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xee),
               b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xee);
  r[0] = _mm256_permute2f128_ps(b0, b4, 0x20), r[1] = _mm256_permute2f128_ps(b1, b5, 0x20), r[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
  r[3] = _mm256_permute2f128_ps(b3, b7, 0x20), r[4] = _mm256_permute2f128_ps(b0, b4, 0x31), r[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
  r[6] = _mm256_permute2f128_ps(b2, b6, 0x31), r[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
}

/// One head's statistics over eight pages at once, page j's scores at x + j * page_stride (rows
/// of them, -inf padded), lane j of top and sum: the largest score, and the sum of exp(score -
/// largest) (1 with max_token, or when every score is -inf). The scores are transposed so that a
/// lane is a page: the exps run eight pages wide with no horizontal step, and the sum is taken in
/// attention::horizontal_sum's order, so each page's figures are bit for bit one page's alone.
inline void eight_page_stats_avx2(const float* x, std::size_t page_stride, int rows, bool max_token, __m256& top, __m256& sum) {
  thread_local std::vector<float> t;  // the transposed scores past the first eight rows, a lane per page
  if (rows > 8) t.resize(static_cast<std::size_t>(rows - 8) * 8);
  const auto transposed = [&](int c, __m256* r) {  // rows c..c+7 of the eight pages, a lane per page
    for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(x + static_cast<std::size_t>(j) * page_stride + c);
    transpose8_ps(r);
  };
  __m256 first[8];
  transposed(0, first);
  __m256 vm = first[0];
  for (int j = 1; j < 8; ++j) vm = _mm256_max_ps(vm, first[j]);
  for (int c = 8; c < rows; c += 8) {
    __m256 r[8];
    transposed(c, r);
    for (int j = 0; j < 8; ++j) {
      vm = _mm256_max_ps(vm, r[j]);
      if (!max_token) _mm256_storeu_ps(t.data() + static_cast<std::size_t>(c - 8 + j) * 8, r[j]);
    }
  }
  top = vm;
  sum = _mm256_set1_ps(1.0f);
  if (max_token) return;
  __m256 e[8];
  for (int j = 0; j < 8; ++j) e[j] = attention::exp_rank8(_mm256_sub_ps(first[j], vm));
  for (int c = 8; c < rows; c += 8)
    for (int j = 0; j < 8; ++j)
      e[j] = _mm256_add_ps(e[j], attention::exp_rank8(_mm256_sub_ps(_mm256_loadu_ps(t.data() + static_cast<std::size_t>(c - 8 + j) * 8), vm)));
  const __m256 total = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(e[0], e[4]), _mm256_add_ps(e[2], e[6])),
                                     _mm256_add_ps(_mm256_add_ps(e[1], e[5]), _mm256_add_ps(e[3], e[7])));
  sum = _mm256_blendv_ps(total, sum, _mm256_cmp_ps(vm, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}

/// Stores the first np (1..8) lanes of v at p (a library memcpy of a run-time length per vector
/// cost more than the arithmetic around it).
inline void store_lanes(float* p, __m256 v, int np) {
  if (np == 8) return _mm256_storeu_ps(p, v);
  _mm256_maskstore_ps(p, first_lanes(np), v);
}

/// Brings a page row's bytes towards the cache ahead of its turn.
inline void prefetch_row(const std::uint8_t* row, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(row + at), _MM_HINT_T0);
}
}  // namespace detail

namespace detail {
/// The mean dots of heads [h0, h0 + HB) with one page, into acc[h][slot].
template <int HB>
inline void first_look_dots_avx2(const TokenQueryView& q, int h0, const std::uint8_t* codes, int slot, __m256i (*acc)[8]) {
  const std::int8_t* q8[HB];
  for (int h = 0; h < HB; ++h) q8[h] = q.q8 + static_cast<std::size_t>(h0 + h) * q.d;
  __m256i dots[HB];
  mean_dots_avx2<HB>(q8, codes, q.d, dots);
  for (int h = 0; h < HB; ++h) acc[h0 + h][slot] = dots[h];
}

/// Eight pages' first looks for every head of q from their dots acc[h][page]: (dot - 64 x the
/// code sum) x the head's and the mean's scales + the radii's bonus, np of them stored.
inline void first_look_scores_avx2(const TokenQueryView& q, const __m256i (*acc)[8], const float* mean_scale, const float* r0, const float* r1,
                                   int np, float* est, std::size_t stride, float* mean) {
  const __m256 ms = _mm256_load_ps(mean_scale), rv0 = _mm256_load_ps(r0), rv1 = _mm256_load_ps(r1);
  for (int h = 0; h < q.group; ++h) {
    const __m256i dot = _mm256_sub_epi32(sum8_epi32(acc[h]), _mm256_set1_epi32(64 * q.sum[h]));
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(_mm256_set1_ps(q.scale[h]), ms));
    if (mean) store_lanes(mean + static_cast<std::size_t>(h) * stride, v, np);
    v = _mm256_fmadd_ps(_mm256_set1_ps(q.pair_w[2 * h]), rv0, v);
    v = _mm256_fmadd_ps(_mm256_set1_ps(q.pair_w[2 * h + 1]), rv1, v);
    store_lanes(est + static_cast<std::size_t>(h) * stride, v, np);
  }
}
}  // namespace detail

/// est[h * stride + i]: head h's first look at page rows[i] (q.d a multiple of 32): its mean's
/// score (into mean[h * stride + i] too, where given) plus the radii's bonus, eight pages at a
/// time, sixteen heads at a time.
inline void token_first_looks_avx2(const TokenQueryView& q, const std::uint8_t* const* rows, std::size_t n, int tokens, float* est,
                                   std::size_t stride, float* mean) {
  constexpr int kHeads = 16;
  const std::size_t codes_at = static_cast<std::size_t>(tokens) * (q.d / 2), floats_at = codes_at + static_cast<std::size_t>(q.d);
  const std::size_t tail_bytes = static_cast<std::size_t>(q.d) + (static_cast<std::size_t>(tokens) + 3) * sizeof(float);  // what a first look reads
  __m256i acc[kHeads][8];
  for (int hb = 0; hb < q.group; hb += kHeads) {
    const int heads = q.group - hb < kHeads ? q.group - hb : kHeads;
    const TokenQueryView part{q.q8 + static_cast<std::size_t>(hb) * q.d, q.scale + hb, q.sum + hb, q.pair_w + 2 * hb, heads, q.d};
    for (std::size_t i0 = 0; i0 < n; i0 += 8) {
      const int np = n - i0 < 8 ? static_cast<int>(n - i0) : 8;
      alignas(32) float mean_scale[8] = {}, r0[8] = {}, r1[8] = {};
      for (int j = 0; j < 8; ++j) {
        if (j >= np) {
          for (int h = 0; h < heads; ++h) acc[h][j] = _mm256_setzero_si256();
          continue;
        }
        const std::uint8_t* row = rows[i0 + static_cast<std::size_t>(j)];
        if (i0 + 8 + static_cast<std::size_t>(j) < n) {  // the mean, scales and radii of the page eight ahead
          const char* ahead = reinterpret_cast<const char*>(rows[i0 + 8 + static_cast<std::size_t>(j)] + codes_at);
          for (std::size_t at = 0; at < tail_bytes; at += 64) _mm_prefetch(ahead + at, _MM_HINT_T0);
          _mm_prefetch(ahead + tail_bytes - 1, _MM_HINT_T0);
        }
        int h0 = 0;
        for (; h0 + 4 <= heads; h0 += 4) detail::first_look_dots_avx2<4>(part, h0, row + codes_at, j, acc);
        for (; h0 + 2 <= heads; h0 += 2) detail::first_look_dots_avx2<2>(part, h0, row + codes_at, j, acc);
        for (; h0 < heads; ++h0) detail::first_look_dots_avx2<1>(part, h0, row + codes_at, j, acc);
        std::memcpy(&mean_scale[j], row + floats_at + static_cast<std::size_t>(tokens) * sizeof(float), sizeof(float));
        std::memcpy(&r0[j], row + floats_at + static_cast<std::size_t>(tokens + 1) * sizeof(float), sizeof(float));
        std::memcpy(&r1[j], row + floats_at + static_cast<std::size_t>(tokens + 2) * sizeof(float), sizeof(float));
      }
      const std::size_t at = static_cast<std::size_t>(hb) * stride + i0;
      detail::first_look_scores_avx2(part, acc, mean_scale, r0, r1, np, est + at, stride, mean ? mean + at : nullptr);
    }
  }
}

/// est[h * stride + i]: head h's estimate of page rows[i] (q.d a multiple of 64): the log-sum-exp
/// of its tokens' scores, or with max_token the largest; the means' scores from mean[h * stride +
/// i] where given.
inline void token_page_estimates_avx2(const TokenQueryView& q, const std::uint8_t* const* rows, std::size_t n, int tokens, bool max_token, float* est,
                                      std::size_t stride, const float* mean) {
  const int padded = attention::padded_rows(tokens);
  const std::size_t row_bytes = static_cast<std::size_t>(tokens) * (q.d / 2) + static_cast<std::size_t>(q.d) + (tokens + 3) * sizeof(float);
  thread_local std::vector<float> s, sums;
  const std::size_t page_stride = static_cast<std::size_t>(q.group) * padded;  // s: [page of eight][head][row]
  s.resize(8 * page_stride);  // every row of a scored page is written (-inf past its tokens); the rest filled below
  sums.resize(static_cast<std::size_t>(q.group) * n);
  for (std::size_t i0 = 0; i0 < n; i0 += 8) {
    const int np = n - i0 < 8 ? static_cast<int>(n - i0) : 8;
    for (int j = 0; j < np; ++j) {
      const std::size_t i = i0 + static_cast<std::size_t>(j);
      if (i + 1 < n) detail::prefetch_row(rows[i + 1], row_bytes);
      const float* given = mean ? mean + i : nullptr;
      float* sj = s.data() + static_cast<std::size_t>(j) * page_stride;
      int h0 = 0;
      for (; h0 + 4 <= q.group; h0 += 4) detail::page_token_scores_avx2<4>(q, h0, rows[i], tokens, padded, sj, given, stride);
      for (; h0 + 2 <= q.group; h0 += 2) detail::page_token_scores_avx2<2>(q, h0, rows[i], tokens, padded, sj, given, stride);
      for (; h0 < q.group; ++h0) detail::page_token_scores_avx2<1>(q, h0, rows[i], tokens, padded, sj, given, stride);
    }
    for (int j = np; j < 8; ++j) std::fill_n(s.data() + static_cast<std::size_t>(j) * page_stride, page_stride, -INFINITY);
    for (int h = 0; h < q.group; ++h) {
      __m256 top, sum;
      detail::eight_page_stats_avx2(s.data() + static_cast<std::size_t>(h) * padded, page_stride, padded, max_token, top, sum);
      detail::store_lanes(est + static_cast<std::size_t>(h) * stride + i0, top, np);
      detail::store_lanes(sums.data() + static_cast<std::size_t>(h) * n + i0, sum, np);
    }
  }
  if (max_token) return;
  for (int h = 0; h < q.group; ++h) {  // + log(sum), eight pages at a time
    float* e = est + static_cast<std::size_t>(h) * stride;
    const float* u = sums.data() + static_cast<std::size_t>(h) * n;
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(e + i, _mm256_add_ps(_mm256_loadu_ps(e + i), attention::log_positive8(_mm256_loadu_ps(u + i))));
    for (; i < n; ++i) e[i] += attention::log_positive(u[i]);
  }
}
#endif

}  // namespace kvdrive::index
