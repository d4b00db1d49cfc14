// The per-element arithmetic of decode attention, shared by the CPU loops and the CUDA kernels.
// A "partial" is the softmax state of attention over some tokens: running max m, sum of
// exponentials l (relative to m) and the weighted value sum acc (relative to m). Partials merge
// exactly (up to rounding) by log-sum-exp; kvdrive merges them in a fixed order (Decision 2).
#pragma once

#include <cmath>
#include <limits>

#include "kvdrive/core/half.hpp"
#include "kvdrive/core/host_device.hpp"

namespace kvdrive::attention {

KVD_HOST_DEVICE float neg_inf() { return -std::numeric_limits<float>::infinity(); }

/// exp(x) for x <= 0 coming from (score - max); exp(-inf) = 0.
KVD_HOST_DEVICE float exp_shifted(float x) { return ::expf(x); }

/// log-sum-exp of a partial; -inf when it covers no tokens.
KVD_HOST_DEVICE float partial_lse(float m, float l) { return l > 0.0f ? m + ::logf(l) : neg_inf(); }

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
KVD_HOST_DEVICE void merge_partial(float& m, float& l, float* acc, float m2, float l2,
                                   const float* acc2, int d) {
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
KVD_HOST_DEVICE float page_mass(float page_lse, float total_lse) {
  return page_lse == neg_inf() ? 0.0f : exp_shifted(page_lse - total_lse);
}

}  // namespace kvdrive::attention
