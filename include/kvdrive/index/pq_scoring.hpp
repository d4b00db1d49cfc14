// Product-quantisation page scoring (index::ProductQuant, product_quant.hpp): the ADC estimate
// of a page from its M one-byte codes and a per-query lookup table, pq_page_score, which the
// CUDA kernels share (cuda/page_scores.cuh), and pq_rows, its CPU batch form over contiguous
// pages, which reads each code once for all the GQA group's heads (SSE/AVX lanes for groups of
// 4 and 8 where the compiler targets AVX2). Same additions in the same order on every path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/host_device.hpp"

namespace kvdrive::index {

/// ADC estimate of one page: sum over the M subspaces of lut[m * C + codes[m]], with
/// lut[m * C + c] = q_m . codeword[m][c].
KVD_HOST_DEVICE float pq_page_score(const float* lut, const std::uint8_t* codes, int M, int C) {
  float part[4] = {0, 0, 0, 0};
  for (int m = 0; m < M; ++m) part[m & 3] += lut[m * C + codes[m]];
  return (part[0] + part[2]) + (part[1] + part[3]);
}

namespace detail {
/// ADC estimates of n pages for G heads (G fixed: the accumulators stay in registers) from a
/// head-interleaved table lut_g[(m * C + c) * G + h] = LUT_h[m * C + c]: each code is read once
/// for all heads. Same additions in the same order as pq_page_score, so the same results.
template <int G>
inline void pq_rows_fixed(const float* lut_g, const std::uint8_t* codes, std::int64_t n, int M, int C, float* est, std::size_t stride) {
  auto row = [&](const std::uint8_t* code, int m) { return lut_g + (static_cast<std::size_t>(m) * C + code[m]) * G; };
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* code = codes + static_cast<std::size_t>(i) * M;
    float p0[G] = {}, p1[G] = {}, p2[G] = {}, p3[G] = {};  // part[m & 3], kept in registers
    int m = 0;
    for (; m + 4 <= M; m += 4) {
      const float *r0 = row(code, m), *r1 = row(code, m + 1), *r2 = row(code, m + 2), *r3 = row(code, m + 3);
      for (int h = 0; h < G; ++h) {
        p0[h] += r0[h];
        p1[h] += r1[h];
        p2[h] += r2[h];
        p3[h] += r3[h];
      }
    }
    if (m < M)
      for (int h = 0; h < G; ++h) p0[h] += row(code, m)[h];
    if (m + 1 < M)
      for (int h = 0; h < G; ++h) p1[h] += row(code, m + 1)[h];
    if (m + 2 < M)
      for (int h = 0; h < G; ++h) p2[h] += row(code, m + 2)[h];
    for (int h = 0; h < G; ++h) est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] = (p0[h] + p2[h]) + (p1[h] + p3[h]);
  }
}
#if KVD_CPU_AVX2
/// pq_rows_fixed for 4 or 8 heads with the heads in one SSE / AVX register (compilers leave the
/// plain loop scalar).
template <int G>
struct Lanes;
template <>
struct Lanes<4> {
  using V = __m128;
  static V zero() { return _mm_setzero_ps(); }
  static V load(const float* p) { return _mm_loadu_ps(p); }
  static V add(V a, V b) { return _mm_add_ps(a, b); }
  static void store(float* p, V a) { _mm_storeu_ps(p, a); }
};
template <>
struct Lanes<8> {
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V a) { _mm256_storeu_ps(p, a); }
};

template <int G>
inline void pq_rows_simd(const float* lut_g, const std::uint8_t* codes, std::int64_t n, int M, int C, float* est, std::size_t stride) {
  using L = Lanes<G>;
  using V = typename L::V;
  auto load = [&](const std::uint8_t* code, int m) { return L::load(lut_g + (static_cast<std::size_t>(m) * C + code[m]) * G); };
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* code = codes + static_cast<std::size_t>(i) * M;
    V p0 = L::zero(), p1 = L::zero(), p2 = L::zero(), p3 = L::zero();  // part[m & 3], a lane per head
    int m = 0;
    for (; m + 4 <= M; m += 4) {
      p0 = L::add(p0, load(code, m));
      p1 = L::add(p1, load(code, m + 1));
      p2 = L::add(p2, load(code, m + 2));
      p3 = L::add(p3, load(code, m + 3));
    }
    if (m < M) p0 = L::add(p0, load(code, m));
    if (m + 1 < M) p1 = L::add(p1, load(code, m + 1));
    if (m + 2 < M) p2 = L::add(p2, load(code, m + 2));
    float sum[G];
    L::store(sum, L::add(L::add(p0, p2), L::add(p1, p3)));
    for (int h = 0; h < G; ++h) est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] = sum[h];
  }
}
#endif
}  // namespace detail

/// est[h * stride + i] = pq_page_score for head h and page i, for n contiguous page codes [n][M];
/// lut_g is head-interleaved: lut_g[(m * C + c) * group + h].
inline void pq_rows(const float* lut_g, int group, const std::uint8_t* codes, std::int64_t n, int M, int C, float* est, std::size_t stride) {
  switch (group) {
    case 1: return detail::pq_rows_fixed<1>(lut_g, codes, n, M, C, est, stride);
    case 2: return detail::pq_rows_fixed<2>(lut_g, codes, n, M, C, est, stride);
#if KVD_CPU_AVX2
    case 4: return detail::pq_rows_simd<4>(lut_g, codes, n, M, C, est, stride);
    case 8: return detail::pq_rows_simd<8>(lut_g, codes, n, M, C, est, stride);
#else
    case 4: return detail::pq_rows_fixed<4>(lut_g, codes, n, M, C, est, stride);
    case 8: return detail::pq_rows_fixed<8>(lut_g, codes, n, M, C, est, stride);
#endif
    default: break;
  }
  thread_local std::vector<float> lut;  // other group sizes: de-interleave, pq_page_score per head
  const std::size_t mc = static_cast<std::size_t>(M) * C;
  lut.resize(mc);
  for (int h = 0; h < group; ++h) {
    for (std::size_t j = 0; j < mc; ++j) lut[j] = lut_g[j * group + h];
    for (std::int64_t i = 0; i < n; ++i)
      est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] =
          pq_page_score(lut.data(), codes + static_cast<std::size_t>(i) * M, M, C);
  }
}

}  // namespace kvdrive::index
