// The AVX2 loop behind index::token_page_estimates (index/token_keys.hpp): every query head's
// estimate of many pages from their 4-bit codes (a page's mean, and its tokens' residuals from
// it; the row layout is index::TokenKeys'). Per page, eight tokens at a time: each
// token's nibbles are unpacked once for up to four heads, multiplied with the heads' 8-bit query
// codes by byte multiply-adds (exact integers, as token_code_dot), the eight tokens' sums taken by
// one transpose; then per head the softmax statistics of the page's token scores in registers
// (exp_shifted8), and the logs of all pages eight at a time (log_positive8) at the end.
// tests/test_index_rescore.cpp checks it against the KVD_HOST_DEVICE estimate.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"

namespace kvdrive::index {

/// A GQA group's coded query heads by pointer: q8 [group][d], each head's scale and code sum.
struct TokenQueryView {
  const std::int8_t* q8;
  const float* scale;
  const int* sum;
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

/// The sum of eight int32 lanes.
inline int horizontal_sum_epi32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
}

/// Token scores of heads [h0, h0 + HB) over one page into s[h * rows + t], rows past the page's
/// tokens -inf: per coded row (the mean, row `tokens`, and each token's residual), (dot - 8 x
/// the head's code sum) x the head's scale x the row's scale; a token's score is its residual's
/// plus the mean's.
template <int HB>
inline void page_token_scores_avx2(const TokenQueryView& q, int h0, const std::uint8_t* row, int tokens, int rows, float* s) {
  const int half = q.d / 2;
  const std::uint8_t* scales = row + static_cast<std::size_t>(tokens + 1) * half;
  const std::int8_t* q8[HB];
  for (int h = 0; h < HB; ++h) q8[h] = q.q8 + static_cast<std::size_t>(h0 + h) * q.d;
  __m256i mean_dots[HB];
  token_dots_avx2<HB>(q8, row + static_cast<std::size_t>(tokens) * half, half, mean_dots);
  float mean_scale, mean[HB];
  std::memcpy(&mean_scale, scales + static_cast<std::size_t>(tokens) * sizeof(float), sizeof mean_scale);
  for (int h = 0; h < HB; ++h)
    mean[h] = static_cast<float>(horizontal_sum_epi32(mean_dots[h]) - 8 * q.sum[h0 + h]) * (q.scale[h0 + h] * mean_scale);
  for (int t0 = 0; t0 < tokens; t0 += 8) {
    const int nt = tokens - t0 < 8 ? tokens - t0 : 8;
    __m256i acc[HB][8], token[HB];
    for (int t = 0; t < 8; ++t) {
      if (t < nt) token_dots_avx2<HB>(q8, row + static_cast<std::size_t>(t0 + t) * half, half, token);
      for (int h = 0; h < HB; ++h) acc[h][t] = t < nt ? token[h] : _mm256_setzero_si256();
    }
    alignas(32) float scale[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(scale, scales + static_cast<std::size_t>(t0) * sizeof(float), nt * sizeof(float));
    const __m256 token_scales = _mm256_load_ps(scale);
    const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(nt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int h = 0; h < HB; ++h) {
      const int hh = h0 + h;
      const __m256i dot = _mm256_sub_epi32(sum8_epi32(acc[h]), _mm256_set1_epi32(8 * q.sum[hh]));
      const __m256 unit = _mm256_mul_ps(_mm256_set1_ps(q.scale[hh]), token_scales);
      const __m256 score = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), unit), _mm256_set1_ps(mean[h]));
      _mm256_storeu_ps(s + static_cast<std::size_t>(hh) * rows + t0,
                       _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), score, _mm256_castsi256_ps(valid)));
    }
  }
}

/// One head's statistics over a page's scores x (rows of them, -inf padded): the largest score,
/// and the sum of exp(score - largest) (1 with max_token, or when every score is -inf).
inline void page_stats_avx2(const float* x, int rows, bool max_token, float& top, float& sum) {
  __m256 vm = _mm256_loadu_ps(x);
  for (int t = 8; t < rows; t += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + t));
  vm = attention::broadcast_max(vm);
  top = _mm256_cvtss_f32(vm);
  if (max_token || top == -INFINITY) {
    sum = 1.0f;
    return;
  }
  __m256 e = attention::exp_shifted8(_mm256_sub_ps(_mm256_loadu_ps(x), vm));
  for (int t = 8; t < rows; t += 8) e = _mm256_add_ps(e, attention::exp_shifted8(_mm256_sub_ps(_mm256_loadu_ps(x + t), vm)));
  sum = attention::horizontal_sum(e);
}

/// Brings a page row's bytes towards the cache ahead of its turn.
inline void prefetch_row(const std::uint8_t* row, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(row + at), _MM_HINT_T0);
}
}  // namespace detail

/// est[h * stride + i]: head h's estimate of page rows[i] (q.d a multiple of 64): the log-sum-exp
/// of its tokens' scores, or with max_token the largest.
inline void token_page_estimates_avx2(const TokenQueryView& q, const std::uint8_t* const* rows, std::size_t n, int tokens, bool max_token,
                                      float* est, std::size_t stride) {
  const int padded = attention::padded_rows(tokens);
  const std::size_t row_bytes = static_cast<std::size_t>(tokens + 1) * (q.d / 2 + sizeof(float));
  thread_local std::vector<float> s, sums;
  s.resize(static_cast<std::size_t>(q.group) * padded);
  sums.resize(static_cast<std::size_t>(q.group) * n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i + 1 < n) detail::prefetch_row(rows[i + 1], row_bytes);
    int h0 = 0;
    for (; h0 + 4 <= q.group; h0 += 4) detail::page_token_scores_avx2<4>(q, h0, rows[i], tokens, padded, s.data());
    for (; h0 + 2 <= q.group; h0 += 2) detail::page_token_scores_avx2<2>(q, h0, rows[i], tokens, padded, s.data());
    for (; h0 < q.group; ++h0) detail::page_token_scores_avx2<1>(q, h0, rows[i], tokens, padded, s.data());
    for (int h = 0; h < q.group; ++h)
      detail::page_stats_avx2(s.data() + static_cast<std::size_t>(h) * padded, padded, max_token, est[static_cast<std::size_t>(h) * stride + i],
                              sums[static_cast<std::size_t>(h) * n + i]);
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
