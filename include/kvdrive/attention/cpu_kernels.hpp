// The two inner loops of CPU decode attention over one page (V held as float rows padded with
// zero rows to a multiple of kRowBlock tokens; K read in the KV dtype):
//   page_scores:     s[h][t] = scale * q_h . k_t             for the group's heads
//   page_accumulate: acc_h = acc_h * keep[h] + sum_t w[h][t] v_t
// AVX2+FMA versions keep kRowBlock independent accumulators in registers; the portable versions
// are used where the compiler does not target AVX2 (or with KVD_DISABLE_SIMD) and are tested the
// same way. Either way the summation order is fixed, so results never depend on threads.
#pragma once

#include <cmath>
#include <cstddef>
#include <initializer_list>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/half.hpp"

#if defined(__AVX2__) && defined(__FMA__) && !defined(KVD_DISABLE_SIMD)
#include <immintrin.h>
#define KVD_CPU_AVX2 1
#else
#define KVD_CPU_AVX2 0
#endif

namespace kvdrive::attention {

inline constexpr int kRowBlock = 8;

inline int padded_rows(int tokens) { return (tokens + kRowBlock - 1) / kRowBlock * kRowBlock; }

#if KVD_CPU_AVX2
namespace detail {
/// Sums each of eight vectors; returns the eight sums as one vector.
inline __m256 sum8(const __m256 a[8]) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  const __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
  return _mm256_add_ps(lo, hi);
}
}  // namespace detail
#endif

#if KVD_CPU_AVX2
namespace detail {
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const bfloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/// Scores of HB heads x TB tokens (HB x TB <= 8 accumulators; the unused ones stay zero), K read
/// and converted once. Each score is one accumulator reduced by the same tree, so every blocking
/// gives the same bits.
template <int HB, int TB, class T>
inline void score_block(const float* q, const T* k, int tokens, int d, float scale, int h0, int t0, int rows, float* s) {
  static_assert(HB * TB <= 8);
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const T* kr[TB];
  for (int t = 0; t < TB; ++t)  // rows past the page's tokens repeat its last row; ignored later
    kr[t] = k + static_cast<std::size_t>(t0 + t < tokens ? t0 + t : tokens - 1) * d;
  const float* qh[HB];
  for (int h = 0; h < HB; ++h) qh[h] = q + static_cast<std::size_t>(h0 + h) * d;
  for (int j = 0; j < d; j += 8) {
    __m256 kv[TB];
    for (int t = 0; t < TB; ++t) kv[t] = load8(kr[t] + j);
    for (int h = 0; h < HB; ++h) {
      const __m256 qv = _mm256_loadu_ps(qh[h] + j);
      for (int t = 0; t < TB; ++t) acc[h * TB + t] = _mm256_fmadd_ps(qv, kv[t], acc[h * TB + t]);
    }
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale)));
  for (int h = 0; h < HB; ++h)
    for (int t = 0; t < TB; ++t) s[static_cast<std::size_t>(h0 + h) * rows + t0 + t] = sums[h * TB + t];
}

template <int HB, int TB, class T>
inline void score_page(const float* q, int group, const T* k, int tokens, int d, float scale, float* s) {
  const int rows = padded_rows(tokens);
  for (int h0 = 0; h0 < group; h0 += HB)
    for (int t0 = 0; t0 < rows; t0 += TB) score_block<HB, TB>(q, k, tokens, d, scale, h0, t0, rows, s);
}
}  // namespace detail
#endif

/// s: [group][padded_rows(tokens)], k: [tokens][d] in the KV dtype. Entries past `tokens` in a
/// row of s are unspecified.
template <class T>
inline void page_scores(const float* q, int group, const T* k, int tokens, int d, float scale, float* s) {
#if KVD_CPU_AVX2
  if (d % 8 == 0) {
    // Two heads x four tokens measured fastest for GQA groups of 4 and 8 (K converted once per
    // two heads, q reloads cheap): 8.5 GB/s vs 7.3 for 4 x 2 and 1 x 8 on one cache-hot core.
    // Groups of 3 (SmolLM2) take three heads x two tokens, so K is converted once, not thrice.
    if (group % 2 == 0) return detail::score_page<2, 4>(q, group, k, tokens, d, scale, s);
    if (group % 3 == 0) return detail::score_page<3, 2>(q, group, k, tokens, d, scale, s);
    return detail::score_page<1, 8>(q, group, k, tokens, d, scale, s);
  }
#endif
  const int rows = padded_rows(tokens);
  for (int h = 0; h < group; ++h) {
    const float* qh = q + static_cast<std::size_t>(h) * d;
    for (int t = 0; t < tokens; ++t) {
      const T* kt = k + static_cast<std::size_t>(t) * d;
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int j = 0; j < d; ++j) part[j & 7] += qh[j] * to_float(kt[j]);
      s[static_cast<std::size_t>(h) * rows + t] = (((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]))) * scale;
    }
  }
}

/// Softmax statistics of one head's scores over a page.
struct RowSoftmax {
  float max;
  float sum;
};

#if KVD_CPU_AVX2
/// The largest of eight lanes, in every lane.
inline __m256 broadcast_max(__m256 v) {
  v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
  v = _mm256_max_ps(v, _mm256_shuffle_ps(v, v, 0x4e));
  return _mm256_max_ps(v, _mm256_shuffle_ps(v, v, 0xb1));
}
#endif

/// s: one head's scores, `rows` = padded_rows(tokens) entries. Replaces s[t] with
/// exp(s[t] - max) (0 for t >= tokens) and returns max and the sum of the exponentials.
inline RowSoftmax softmax_row(float* s, int tokens, int rows) {
  for (int t = tokens; t < rows; ++t) s[t] = -INFINITY;
  float mx;
#if KVD_CPU_AVX2
  __m256 vm = _mm256_loadu_ps(s);
  for (int t = 8; t < rows; t += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + t));
  mx = _mm256_cvtss_f32(broadcast_max(vm));
#else
  mx = s[0];
  for (int t = 1; t < tokens; ++t) mx = s[t] > mx ? s[t] : mx;
#endif
  for (int t = 0; t < rows; ++t) s[t] = exp_shifted(s[t] - mx);
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int t = 0; t < rows; t += 8)
    for (int u = 0; u < 8; ++u) part[u] += s[t + u];
  return {mx, ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]))};
}

#if KVD_CPU_AVX2
/// exp_shifted on eight lanes: the same reduction, polynomial and clamps.
inline __m256 exp_shifted8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x), lowest = _mm256_set1_epi32(static_cast<int>(0xc2ae0000u));
  const __m256i c = _mm256_max_epu32(_mm256_min_epu32(u, lowest), _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 xc = _mm256_castsi256_ps(c);
  const __m256i ni = _mm256_cvttps_epi32(_mm256_fmsub_ps(xc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  const __m256 n = _mm256_cvtepi32_ps(ni);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i under = _mm256_cmpeq_epi32(_mm256_max_epu32(u, _mm256_set1_epi32(static_cast<int>(0xc2ae0001u))), u);  // u > lowest
  const __m256i scale = _mm256_andnot_si256(under, _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(y, _mm256_castsi256_ps(scale));
}

/// exp_rank on eight lanes: the same split, polynomial and clamps (for -inf and NaN, 2^-126 too).
inline __m256 exp_rank8(__m256 x) {
  const __m256 t =  // max first: it gives its second operand, -126, for NaN
      _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(-126.0f)), _mm256_setzero_ps());
  const __m256i n = _mm256_cvttps_epi32(_mm256_sub_ps(t, _mm256_set1_ps(0.5f)));
  const __m256 f = _mm256_sub_ps(t, _mm256_cvtepi32_ps(n));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.009582770988345146f), f, _mm256_set1_ps(0.05590623617172241f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24024099111557007f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931242346763611f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)));
}

/// log_positive on eight lanes (finite x > 0): the same reduction and polynomial.
inline __m256 log_positive8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x), frac = _mm256_and_si256(u, _mm256_set1_epi32(0x007fffff));
  const __m256 mant = _mm256_castsi256_ps(_mm256_or_si256(frac, _mm256_set1_epi32(0x3f000000)));
  const __m256 small = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(0x003504f3), frac));
  const __m256i biased = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(0xff)), _mm256_set1_epi32(126));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = _mm256_sub_ps(_mm256_cvtepi32_ps(biased), _mm256_and_ps(small, one));
  const __m256 m = _mm256_sub_ps(_mm256_add_ps(mant, _mm256_and_ps(small, mant)), one);
  const __m256 z = _mm256_mul_ps(m, m);
  __m256 y = _mm256_set1_ps(7.0376836292e-2f);
  for (const float c : {-1.1514610310e-1f, 1.1676998740e-1f, -1.2420140846e-1f, 1.4249322787e-1f, -1.6668057665e-1f, 2.0000714765e-1f,
                        -2.4999993993e-1f, 3.3333331174e-1f})
    y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(c));
  y = _mm256_mul_ps(_mm256_mul_ps(y, m), z);
  y = _mm256_fnmadd_ps(_mm256_set1_ps(2.12194440e-4f), e, y);
  y = _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z, y);
  return _mm256_fmadd_ps(_mm256_set1_ps(0.693359375f), e, _mm256_add_ps(m, y));
}

/// The sum of eight lanes.
inline float horizontal_sum(__m256 v) {
  v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
  v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0x4e));
  return _mm256_cvtss_f32(_mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0xb1)));
}
#endif

#if KVD_CPU_AVX2
namespace detail {
/// acc of HB heads += weights x V over TB tokens, V read and converted once for the HB heads.
template <int HB, int TB, class T>
inline void accumulate_block(float* acc, const float* keep, const float* take, const float* w, const T* v, int tokens, int rows, int d, int h0,
                             int t0) {
  __m256 wv[HB][TB];
  for (int h = 0; h < HB; ++h)
    for (int t = 0; t < TB; ++t) wv[h][t] = _mm256_set1_ps(w[static_cast<std::size_t>(h0 + h) * rows + t0 + t] * take[h0 + h]);
  __m256 kp[HB];
  for (int h = 0; h < HB; ++h) kp[h] = _mm256_set1_ps(t0 == 0 ? keep[h0 + h] : 1.0f);
  const T* vr[TB];
  for (int t = 0; t < TB; ++t)  // rows past the page's tokens repeat its last row with weight 0
    vr[t] = v + static_cast<std::size_t>(t0 + t < tokens ? t0 + t : tokens - 1) * d;
  for (int j = 0; j < d; j += 8) {
    __m256 a[HB];
    for (int h = 0; h < HB; ++h) a[h] = _mm256_mul_ps(_mm256_loadu_ps(acc + static_cast<std::size_t>(h0 + h) * d + j), kp[h]);
    for (int t = 0; t < TB; ++t) {
      const __m256 vv = load8(vr[t] + j);
      for (int h = 0; h < HB; ++h) a[h] = _mm256_fmadd_ps(wv[h][t], vv, a[h]);
    }
    for (int h = 0; h < HB; ++h) _mm256_storeu_ps(acc + static_cast<std::size_t>(h0 + h) * d + j, a[h]);
  }
}

template <int HB, int TB, class T>
inline void accumulate_page(float* acc, const float* keep, const float* take, const float* w, const T* v, int group, int tokens, int d) {
  const int rows = padded_rows(tokens);
  for (int h0 = 0; h0 < group; h0 += HB)
    for (int t0 = 0; t0 < rows; t0 += TB) accumulate_block<HB, TB>(acc, keep, take, w, v, tokens, rows, d, h0, t0);
}
}  // namespace detail
#endif

/// acc: [group][d]; keep, take: [group]; w: [group][padded_rows(tokens)], zero past `tokens`;
/// v: [tokens][d] in the KV dtype. acc_h = acc_h * keep[h] + sum_t (w[h][t] * take[h]) v_t.
template <class T>
inline void page_accumulate(float* acc, const float* keep, const float* take, const float* w, const T* v, int group, int tokens, int d) {
#if KVD_CPU_AVX2
  if (d % 8 == 0) {
    // The same blockings as page_scores; each head's sum runs over the tokens in order whatever
    // the blocking (a block after the first scales by 1, exactly), so the bits do not depend on it.
    if (group % 2 == 0) return detail::accumulate_page<2, 4>(acc, keep, take, w, v, group, tokens, d);
    if (group % 3 == 0) return detail::accumulate_page<3, 2>(acc, keep, take, w, v, group, tokens, d);
    return detail::accumulate_page<1, 8>(acc, keep, take, w, v, group, tokens, d);
  }
#endif
  const int rows = padded_rows(tokens);
  for (int h = 0; h < group; ++h) {
    float* ah = acc + static_cast<std::size_t>(h) * d;
    const float* wh = w + static_cast<std::size_t>(h) * rows;
    for (int j = 0; j < d; ++j) ah[j] *= keep[h];
    for (int t = 0; t < tokens; ++t) {
      const T* vt = v + static_cast<std::size_t>(t) * d;
      const float wt = wh[t] * take[h];
      for (int j = 0; j < d; ++j) ah[j] += wt * to_float(vt[j]);
    }
  }
}

}  // namespace kvdrive::attention
