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
  const float* q = nullptr;  ///< [group][head_dim]
  int group = 1;             ///< query heads sharing this KV head
  int head_dim = 0;
  float scale = 1.0f;  ///< softmax scale, usually 1/sqrt(head_dim)
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

namespace detail {

/// sparse_decode's running softmax state for the group's heads, carved out of one per-thread
/// buffer: the weighted value sums acc [group][head_dim], the page's scores (then weights)
/// [group][max_rows], and per head the running max m and sum l, a page's fold factors keep and
/// take, and its row max and row sum.
struct DecodeState {
  float *acc, *s, *m, *l, *keep, *take, *row_max, *row_sum;
};

/// The state for `g` heads of head_dim d and pages of up to max_rows (padded) rows, started: no
/// tokens seen (acc 0, m -inf, l 0).
inline DecodeState start_decode(int g, int d, int max_rows) {
  thread_local std::vector<float> scratch;
  const std::size_t gd = static_cast<std::size_t>(g) * d;
  const std::size_t need = gd                                        // acc
                           + static_cast<std::size_t>(g) * max_rows  // scores, then weights
                           + 6 * static_cast<std::size_t>(g);        // m, l, keep, take, row max, row sum
  if (scratch.size() < need) scratch.resize(need);
  DecodeState st;
  st.acc = scratch.data();
  st.s = st.acc + gd;
  st.m = st.s + static_cast<std::size_t>(g) * max_rows;
  st.l = st.m + g;
  st.keep = st.l + g;
  st.take = st.keep + g;
  st.row_max = st.take + g;
  st.row_sum = st.row_max + g;
  std::fill(st.acc, st.acc + gd, 0.0f);
  std::fill(st.m, st.m + g, neg_inf());
  std::fill(st.l, st.l + g, 0.0f);
  return st;
}

/// Attends page p (at least one token): folds it into the running state, writes its page_lse.
template <class T>
inline void attend_page(const DecodeArgs& a, std::size_t p, const DecodeState& st) {
  const int g = a.group, d = a.head_dim, t_n = a.pages[p].tokens;
  const int rows = padded_rows(t_n);
  page_scores(a.q, g, static_cast<const T*>(a.pages[p].k), t_n, d, a.scale, st.s);
  for (int h = 0; h < g; ++h) {
    const RowSoftmax row = softmax_row(st.s + static_cast<std::size_t>(h) * rows, t_n, rows);
    st.row_max[h] = row.max;
    st.row_sum[h] = row.sum;
  }
  // Fold this page into the running state (the online form of merge_partial): the old
  // accumulator is scaled by keep, the page's weights by take. Loops over the heads are kept
  // branch-free so they vectorise; before the first page m is -inf, so keep is 0.
  for (int h = 0; h < g; ++h) {
    const float mn = st.m[h] > st.row_max[h] ? st.m[h] : st.row_max[h];
    st.keep[h] = exp_shifted(st.m[h] - mn);
    st.take[h] = exp_shifted(st.row_max[h] - mn);
    st.l[h] = st.l[h] * st.keep[h] + st.row_sum[h] * st.take[h];
    st.m[h] = mn;
  }
  if (a.page_lse)
    for (int h = 0; h < g; ++h) a.page_lse[p * g + h] = st.row_max[h] + log_positive(st.row_sum[h]);
  page_accumulate(st.acc, st.keep, st.take, st.s, static_cast<const T*>(a.pages[p].v), g, t_n, d);
}

/// Writes the output (acc / l) and the log-sum-exp of every head.
inline void finish_decode(const DecodeArgs& a, const DecodeState& st) {
  const int d = a.head_dim;
  for (int h = 0; h < a.group; ++h) {
    const float inv = st.l[h] > 0.0f ? 1.0f / st.l[h] : 0.0f;
    const float* acc_h = st.acc + static_cast<std::size_t>(h) * d;
    float* out_h = a.out + static_cast<std::size_t>(h) * d;
    for (int j = 0; j < d; ++j) out_h[j] = acc_h[j] * inv;
    if (a.lse) a.lse[h] = partial_lse(st.m[h], st.l[h]);
  }
}

}  // namespace detail

/// Attention of one stream over its pages, K/V of element type T, accumulated in float.
template <class T>
void sparse_decode(const DecodeArgs& a) {
  const int g = a.group, row_bytes = a.head_dim * static_cast<int>(sizeof(T));
  int max_rows = 0;
  for (const PageRef& p : a.pages) max_rows = std::max(max_rows, padded_rows(p.tokens));
  const detail::DecodeState st = detail::start_decode(g, a.head_dim, max_rows);
  for (std::size_t p = 0; p < a.pages.size(); ++p) {
    if (a.pages[p].tokens <= 0) {  // an empty page: no mass
      if (a.page_lse)
        for (int h = 0; h < g; ++h) a.page_lse[p * g + h] = neg_inf();
      continue;
    }
    if (p == 0 && a.pages.size() > 1) prefetch_page(a.pages[1], row_bytes);
    if (p + 2 < a.pages.size()) prefetch_page(a.pages[p + 2], row_bytes);
    detail::attend_page<T>(a, p, st);
  }
  detail::finish_decode(a, st);
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
