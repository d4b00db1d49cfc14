// The per-element arithmetic of decode attention, shared by the CPU loops and the CUDA kernels.
// A "partial" is the softmax state of attention over some tokens: running max m, sum of
// exponentials l (relative to m) and the weighted value sum acc (relative to m). Partials merge
// exactly (up to rounding) by log-sum-exp; kvdrive merges them in a fixed order (Decision 2).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kvdrive/core/half.hpp"
#include "kvdrive/core/host_device.hpp"

namespace kvdrive::attention {

KVD_HOST_DEVICE float neg_inf() { return -std::numeric_limits<float>::infinity(); }

/// exp(x) for x <= 0, as used on (score - max); exp(-inf) = 0. Cody-Waite reduction by ln 2
/// and a degree-7 polynomial (Cephes expf), within 2 ulp of exp. The clamps are integer selects
/// on the bits, so compilers vectorise loops over it without -ffast-math; the GPU runs the same
/// code (nvcc contracts its multiply-adds into FMAs, so it may differ in the last bits).
KVD_HOST_DEVICE float exp_shifted(float x) {
  constexpr std::uint32_t kLowest = 0xc2ae0000u;  // -87.0f: below it exp underflows to 0
  const std::uint32_t u = float_bits(x);
  std::uint32_t c = u > kLowest ? kLowest : u;  // x < -87, -inf (or a negative NaN): clamp
  c = c < 0x80000000u ? 0x80000000u : c;        // x >= 0: clamp to -0
  const float xc = bits_float(c);
  const float n = static_cast<float>(static_cast<int>(xc * 1.44269504088896341f - 0.5f));  // round
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  std::uint32_t scale = static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23;  // 2^n
  scale = u > kLowest ? 0u : scale;
  return y * bits_float(scale);
}

/// exp(x) for x <= 0 at half exp_shifted's cost, for sums that only rank (an index's page
/// estimates), never for attention itself: 2^(x log2 e) split at the nearest integer n, 2^f by a
/// degree-4 polynomial on [-1/2, 1/2] (3e-6), times 2^n from the bits: within 1e-5 of exp. Below
/// -87.3 (and for -inf or NaN) it gives 2^-126 instead of 0, which no sum of exps can tell; x > 0
/// is clamped to 0, as exp_shifted does.
KVD_HOST_DEVICE float exp_rank(float x) {
  float t = x * 1.44269504088896341f;
  t = t > -126.0f ? (t < 0.0f ? t : 0.0f) : -126.0f;  // -inf and NaN too; x > 0 as 0
  const int n = static_cast<int>(t - 0.5f);           // t <= 0: rounds to nearest
  const float f = t - static_cast<float>(n);          // [-1/2, 1/2]
  float p = 0.009582770988345146f * f + 0.05590623617172241f;
  p = p * f + 0.24024099111557007f;
  p = p * f + 0.6931242346763611f;
  p = p * f + 1.0f;
  return p * bits_float(static_cast<std::uint32_t>(n + 127) << 23);
}

/// log(x) for finite x > 0 (Cephes logf: mantissa in [sqrt(1/2), sqrt(2)), degree-8
/// polynomial), within 2 ulp of log. Branch-free, so loops over it vectorise; shared with the GPU.
KVD_HOST_DEVICE float log_positive(float x) {
  const std::uint32_t u = float_bits(x);
  float e = static_cast<float>(static_cast<int>((u >> 23) & 0xffu) - 126);
  const float mant = bits_float((u & 0x007fffffu) | 0x3f000000u);  // in [0.5, 1)
  const bool small = (u & 0x007fffffu) < 0x003504f3u;              // mant < sqrt(1/2)
  e = small ? e - 1.0f : e;
  const float m = small ? mant + mant - 1.0f : mant - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y - 2.12194440e-4f * e;
  y = y - 0.5f * z;
  return (m + y) + 0.693359375f * e;
}

/// log-sum-exp of a partial; -inf when it covers no tokens.
KVD_HOST_DEVICE float partial_lse(float m, float l) { return l > 0.0f ? m + log_positive(l) : neg_inf(); }

/// q . k over d elements with 8 independent partial sums combined in a fixed order: the compiler
/// vectorises it without -ffast-math and the result does not depend on the machine's threads.
template <class T>
KVD_HOST_DEVICE float dot8(const float* q, const T* k, int d) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int j = 0;
  for (; j + 8 <= d; j += 8)
    for (int u = 0; u < 8; ++u) s[u] += q[j + u] * to_float(k[j + u]);
  for (; j < d; ++j) s[j & 7] += q[j] * to_float(k[j]);
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/// Folds partial (m2, l2, acc2) into (m, l, acc): the result covers the tokens of both.
KVD_HOST_DEVICE void merge_partial(float& m, float& l, float* acc, float m2, float l2, const float* acc2, int d) {
  if (l2 <= 0.0f) return;
  if (l <= 0.0f) {
    m = m2;
    l = l2;
    for (int j = 0; j < d; ++j) acc[j] = acc2[j];
    return;
  }
  const float mn = m > m2 ? m : m2;
  const float a = exp_shifted(m - mn), b = exp_shifted(m2 - mn);
  m = mn;
  l = l * a + l2 * b;
  for (int j = 0; j < d; ++j) acc[j] = acc[j] * a + acc2[j] * b;
}

/// Attention mass of a page for one head: exp(page_lse - total_lse).
KVD_HOST_DEVICE float page_mass(float page_lse, float total_lse) { return page_lse == neg_inf() ? 0.0f : exp_shifted(page_lse - total_lse); }

}  // namespace kvdrive::attention
