// Sparse decode attention on the CPU (Decision 2). For one stream: the query heads of one GQA
// group attend over a list of pages given as pointers, in ascending page order. Returns the
// output per head, the log-sum-exp per head, and the log-sum-exp of every page per head (the
// eviction scores and recall metrics come from it). Pages are processed one after another and
// folded into the running softmax state in list order, so the result depends only on the list
// and the data, never on threads, residency or where a page's bytes live. Inputs must be
// finite: a score that overflows float makes the output meaningless.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/attention/convert.hpp"
#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/host_device.hpp"

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

/// Asks the CPU to start loading a page's K and V rows (pages are usually scattered, so the
/// hardware prefetcher cannot guess the next one); the loads then overlap this page's math.
inline void prefetch_page(const PageRef& page, int row_bytes) {
  const std::size_t bytes = static_cast<std::size_t>(page.tokens) * static_cast<std::size_t>(row_bytes);
  for (std::size_t off = 0; off < bytes; off += 64) {
    __builtin_prefetch(static_cast<const char*>(page.k) + off);
    __builtin_prefetch(static_cast<const char*>(page.v) + off);
  }
}

/// Attention of one stream over its pages, K/V of element type T, accumulated in float.
template <class T>
void sparse_decode(const DecodeArgs& a) {
  const int g = a.group, d = a.head_dim;
  int max_rows = 0;
  for (const PageRef& p : a.pages) max_rows = std::max(max_rows, padded_rows(p.tokens));

  thread_local std::vector<float> scratch;
  const std::size_t gd = static_cast<std::size_t>(g) * d;
  const std::size_t need = gd                                              // acc
                           + static_cast<std::size_t>(g) * max_rows        // scores, then weights
                           + 6 * static_cast<std::size_t>(g);  // m, l, keep, take, row max, row sum
  if (scratch.size() < need) scratch.resize(need);
  float* acc = scratch.data();
  float* s = acc + gd;
  float* m = s + static_cast<std::size_t>(g) * max_rows;
  float* l = m + g;
  float* keep = l + g;
  float* take = keep + g;
  float* row_max = take + g;
  float* row_sum = row_max + g;
  std::fill(acc, acc + gd, 0.0f);
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
    if (p == 0 && a.pages.size() > 1) prefetch_page(a.pages[1], d * static_cast<int>(sizeof(T)));
    if (p + 2 < a.pages.size()) prefetch_page(a.pages[p + 2], d * static_cast<int>(sizeof(T)));
    const int rows = padded_rows(t_n);
    page_scores(a.q, g, static_cast<const T*>(page.k), t_n, d, a.scale, s);
    for (int h = 0; h < g; ++h) {
      const RowSoftmax row = softmax_row(s + static_cast<std::size_t>(h) * rows, t_n, rows);
      row_max[h] = row.max;
      row_sum[h] = row.sum;
    }
    // Fold this page into the running state (the online form of merge_partial): the old
    // accumulator is scaled by keep, the page's weights by take. Loops over the heads are kept
    // branch-free so they vectorise; before the first page m is -inf, so keep is 0.
    for (int h = 0; h < g; ++h) {
      const float mn = m[h] > row_max[h] ? m[h] : row_max[h];
      keep[h] = exp_shifted(m[h] - mn);
      take[h] = exp_shifted(row_max[h] - mn);
      l[h] = l[h] * keep[h] + row_sum[h] * take[h];
      m[h] = mn;
    }
    if (a.page_lse)
      for (int h = 0; h < g; ++h) a.page_lse[p * g + h] = row_max[h] + log_positive(row_sum[h]);
    page_accumulate(acc, keep, take, s, static_cast<const T*>(page.v), g, t_n, d);
  }

  for (int h = 0; h < g; ++h) {
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const float* acc_h = acc + static_cast<std::size_t>(h) * d;
    float* out_h = a.out + static_cast<std::size_t>(h) * d;
    for (int j = 0; j < d; ++j) out_h[j] = acc_h[j] * inv;
    if (a.lse) a.lse[h] = partial_lse(m[h], l[h]);
  }
}

/// Pages per split of the split-KV form KvManager attends with (Decision 2): a stream's page
/// list is cut, in list order, into splits of kSplitPages pages; each split is attended on its
/// own (sparse_decode over its pages) and the splits merge in list order (merge_splits). Split
/// and merge depend only on the list, so a pipeline may attend a split as soon as its pages are
/// resident, while the misses of other splits are still being read, and get the same bits.
inline constexpr std::size_t kSplitPages = 8;

/// Splits of a list of n pages.
KVD_HOST_DEVICE std::size_t split_count(std::size_t pages) { return (pages + kSplitPages - 1) / kSplitPages; }

/// Merges split results in order: outs [splits][group][head_dim] (each normalised over its split)
/// and lses [splits][group]; writes out [group][head_dim] and, if given, lse [group]. A split's
/// result is the partial (m = its lse, l = 1, acc = its output), folded in by merge_partial.
inline void merge_splits(int group, int head_dim, std::size_t splits, const float* outs, const float* lses, float* out, float* lse) {
  const std::size_t gd = static_cast<std::size_t>(group) * head_dim;
  for (int h = 0; h < group; ++h) {
    float m = neg_inf(), l = 0.0f;
    float* acc = out + static_cast<std::size_t>(h) * head_dim;
    std::fill(acc, acc + head_dim, 0.0f);
    for (std::size_t s = 0; s < splits; ++s) {
      const float ls = lses[s * group + h];
      if (ls == neg_inf()) continue;  // a split with no tokens
      merge_partial(m, l, acc, ls, 1.0f, outs + s * gd + static_cast<std::size_t>(h) * head_dim, head_dim);
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int j = 0; j < head_dim; ++j) acc[j] *= inv;
    if (lse) lse[h] = partial_lse(m, l);
  }
}

}  // namespace kvdrive::attention
