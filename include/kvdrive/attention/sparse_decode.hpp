// Sparse decode attention on the CPU (Decision 2). For one stream: the query heads of one GQA
// group attend over a list of pages given as pointers, in ascending page order. Returns the
// output per head, the log-sum-exp per head, and the log-sum-exp of every page per head (the
// eviction scores and recall metrics come from it). Pages are processed one after another and
// folded into the running softmax state in list order, so the result depends only on the list
// and the data, never on threads, residency or where a page's bytes live.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/attention/convert.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive::attention {

/// One page as attention sees it: `tokens` rows of head_dim elements for K, and the same for V.
struct PageRef {
  const void* k = nullptr;
  const void* v = nullptr;
  int tokens = 0;
};

/// Arguments of one stream's sparse decode attention.
struct DecodeArgs {
  const float* q = nullptr;   ///< [group][head_dim]
  int group = 1;              ///< query heads sharing this KV head
  int head_dim = 0;
  float scale = 1.0f;         ///< softmax scale, usually 1/sqrt(head_dim)
  std::span<const PageRef> pages;
  float* out = nullptr;       ///< [group][head_dim]
  float* lse = nullptr;       ///< [group], optional
  float* page_lse = nullptr;  ///< [pages][group], optional
};

/// Attention of one stream over its pages, K/V of element type T, accumulated in float.
template <class T>
void sparse_decode(const DecodeArgs& a) {
  const int g = a.group, d = a.head_dim;
  int max_tokens = 0;
  for (const PageRef& p : a.pages) max_tokens = std::max(max_tokens, p.tokens);

  thread_local std::vector<float> scratch;
  const std::size_t need = static_cast<std::size_t>(g) * d                 // acc
                           + 2 * static_cast<std::size_t>(max_tokens) * d  // K and V rows
                           + static_cast<std::size_t>(g) * max_tokens      // scores
                           + 2 * static_cast<std::size_t>(g);              // m, l
  if (scratch.size() < need) scratch.resize(need);
  float* acc = scratch.data();
  float* kf = acc + static_cast<std::size_t>(g) * d;
  float* vf = kf + static_cast<std::size_t>(max_tokens) * d;
  float* s = vf + static_cast<std::size_t>(max_tokens) * d;
  float* m = s + static_cast<std::size_t>(g) * max_tokens;
  float* l = m + g;
  std::fill(acc, acc + static_cast<std::size_t>(g) * d, 0.0f);
  std::fill(m, m + g, neg_inf());
  std::fill(l, l + g, 0.0f);

  for (std::size_t p = 0; p < a.pages.size(); ++p) {
    const PageRef& page = a.pages[p];
    const int t_n = page.tokens;
    if (t_n <= 0) {
      if (a.page_lse)
        for (int h = 0; h < g; ++h) a.page_lse[p * g + h] = neg_inf();
      continue;
    }
    const std::size_t rows = static_cast<std::size_t>(t_n) * d;
    to_float_block(static_cast<const T*>(page.k), kf, rows);
    to_float_block(static_cast<const T*>(page.v), vf, rows);
    for (int h = 0; h < g; ++h) {
      const float* qh = a.q + static_cast<std::size_t>(h) * d;
      float* sh = s + static_cast<std::size_t>(h) * t_n;
      for (int t = 0; t < t_n; ++t) sh[t] = dot8(qh, kf + static_cast<std::size_t>(t) * d, d) * a.scale;
    }
    for (int h = 0; h < g; ++h) {
      float* sh = s + static_cast<std::size_t>(h) * t_n;
      float mp = sh[0];
      for (int t = 1; t < t_n; ++t) mp = std::max(mp, sh[t]);
      float lp = 0.0f;
      for (int t = 0; t < t_n; ++t) {
        sh[t] = exp_shifted(sh[t] - mp);
        lp += sh[t];
      }
      if (a.page_lse) a.page_lse[p * g + h] = partial_lse(mp, lp);
      // Fold this page into the running state (the online form of merge_partial).
      const float mn = std::max(m[h], mp);
      const float keep = l[h] > 0.0f ? exp_shifted(m[h] - mn) : 0.0f;
      const float take = exp_shifted(mp - mn);
      m[h] = mn;
      l[h] = l[h] * keep + lp * take;
      float* acc_h = acc + static_cast<std::size_t>(h) * d;
      for (int j = 0; j < d; ++j) acc_h[j] *= keep;
      for (int t = 0; t < t_n; ++t) {
        const float w = sh[t] * take;
        const float* vr = vf + static_cast<std::size_t>(t) * d;
        for (int j = 0; j < d; ++j) acc_h[j] += w * vr[j];
      }
    }
  }

  for (int h = 0; h < g; ++h) {
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const float* acc_h = acc + static_cast<std::size_t>(h) * d;
    float* out_h = a.out + static_cast<std::size_t>(h) * d;
    for (int j = 0; j < d; ++j) out_h[j] = acc_h[j] * inv;
    if (a.lse) a.lse[h] = partial_lse(m[h], l[h]);
  }
}

}  // namespace kvdrive::attention
