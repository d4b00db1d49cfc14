// Page scoring shared by the index policies. The per-row formulas are KVD_HOST_DEVICE functions
// (templated on the element type the index stores, the KV dtype), which the CUDA kernels call
// and the CPU tests check; the CPU batch loops below compute the same formulas in AVX2 form
// where the compiler targets it (FMA, another summation order: equal within rounding, not
// bitwise), reading each stored row once for all the GQA group's query heads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/host_device.hpp"

namespace kvdrive::index {

/// q . row over d elements (the mean-key and centroid estimate).
template <class T>
KVD_HOST_DEVICE float row_dot(const float* q, const T* row, int d) {
  return attention::dot8(q, row, d);
}

/// Quest's bound for one page: sum over channels of max(q_i lo_i, q_i hi_i).
template <class T>
KVD_HOST_DEVICE float quest_page_score(const float* q, const T* lo, const T* hi, int d) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < d; ++i) {
    const float a = q[i] * to_float(lo[i]), b = q[i] * to_float(hi[i]);
    part[i & 7] += a > b ? a : b;
  }
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

/// est[h * stride + i] = q_h . rows[i] for the group's heads and n contiguous rows [n][d].
template <class T>
inline void dot_rows(const float* q, int group, const T* rows, std::int64_t n, int d, float* est, std::size_t stride) {
  if (n <= 0) return;
#if KVD_CPU_AVX2
  if (d % 8 == 0) {
    // The attention kernel's score loop, with scale 1: each row converted once per two heads.
    thread_local std::vector<float> s;
    const int padded = attention::padded_rows(static_cast<int>(n));
    s.resize(static_cast<std::size_t>(group) * padded);
    attention::page_scores(q, group, rows, static_cast<int>(n), d, 1.0f, s.data());
    for (int h = 0; h < group; ++h)
      for (std::int64_t i = 0; i < n; ++i)
        est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] =
            s[static_cast<std::size_t>(h) * padded + static_cast<std::size_t>(i)];
    return;
  }
#endif
  for (std::int64_t i = 0; i < n; ++i)
    for (int h = 0; h < group; ++h)
      est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] =
          row_dot(q + static_cast<std::size_t>(h) * d, rows + static_cast<std::size_t>(i) * d, d);
}

#if KVD_CPU_AVX2
namespace detail {
/// Quest bounds of RB rows for HB heads (HB x RB = 8 accumulators); lo and hi read once.
template <int HB, int RB, class T>
inline void quest_block(const float* q, const T* lo, const T* hi, int d, int h0, std::int64_t i0, std::int64_t n, float* est, std::size_t stride) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const T* l[RB];
  const T* u[RB];
  for (int r = 0; r < RB; ++r) {
    const std::int64_t i = i0 + r < n ? i0 + r : n - 1;  // past the end: repeat, ignored below
    l[r] = lo + static_cast<std::size_t>(i) * d;
    u[r] = hi + static_cast<std::size_t>(i) * d;
  }
  for (int j = 0; j < d; j += 8) {
    __m256 lv[RB], uv[RB];
    for (int r = 0; r < RB; ++r) {
      lv[r] = attention::detail::load8(l[r] + j);
      uv[r] = attention::detail::load8(u[r] + j);
    }
    for (int h = 0; h < HB; ++h) {
      const __m256 qv = _mm256_loadu_ps(q + static_cast<std::size_t>(h0 + h) * d + j);
      for (int r = 0; r < RB; ++r)
        acc[h * RB + r] = _mm256_add_ps(acc[h * RB + r], _mm256_max_ps(_mm256_mul_ps(qv, lv[r]), _mm256_mul_ps(qv, uv[r])));
    }
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, attention::detail::sum8(acc));
  for (int h = 0; h < HB; ++h)
    for (int r = 0; r < RB && i0 + r < n; ++r) est[static_cast<std::size_t>(h0 + h) * stride + static_cast<std::size_t>(i0 + r)] = sums[h * RB + r];
}
}  // namespace detail
#endif

/// est[h * stride + i] = Quest bound of row i for head h, over n contiguous rows of lo and hi.
template <class T>
inline void quest_rows(const float* q, int group, const T* lo, const T* hi, std::int64_t n, int d, float* est, std::size_t stride) {
#if KVD_CPU_AVX2
  if (d % 8 == 0) {
    if (group % 4 == 0) {  // each row's bounds converted once for four heads
      for (int h0 = 0; h0 < group; h0 += 4)
        for (std::int64_t i0 = 0; i0 < n; i0 += 2) detail::quest_block<4, 2>(q, lo, hi, d, h0, i0, n, est, stride);
    } else if (group % 2 == 0) {
      for (int h0 = 0; h0 < group; h0 += 2)
        for (std::int64_t i0 = 0; i0 < n; i0 += 4) detail::quest_block<2, 4>(q, lo, hi, d, h0, i0, n, est, stride);
    } else {
      for (int h0 = 0; h0 < group; ++h0)
        for (std::int64_t i0 = 0; i0 < n; i0 += 8) detail::quest_block<1, 8>(q, lo, hi, d, h0, i0, n, est, stride);
    }
    return;
  }
#endif
  for (std::int64_t i = 0; i < n; ++i)
    for (int h = 0; h < group; ++h)
      est[static_cast<std::size_t>(h) * stride + static_cast<std::size_t>(i)] =
          quest_page_score(q + static_cast<std::size_t>(h) * d, lo + static_cast<std::size_t>(i) * d, hi + static_cast<std::size_t>(i) * d, d);
}

}  // namespace kvdrive::index
