// index::Centroid: RetroInfer-like cluster index. Page mean keys are clustered by k-means within
// segments of segment_pages consecutive pages (segmented clustering, as RetroInfer's wave index
// does), pages_per_cluster pages per cluster on average. A query scores only the centroids
// (q . c, GQA rule over clusters); pages are selected through their cluster's score: clusters
// in score order give their members, nearest to the centroid first, until the budget is full.
// There is no page-level scoring, which is what makes it small and fast, and what costs recall.
// Growth: pages join a pending segment whose means are kept (KV dtype) and scored exactly, one
// by one, until the segment is full and gets clustered. Segments are fixed page ranges, so a
// build at once and page-by-page growth give the same index.
// Stored: centroids (KV dtype, head_dim elements per cluster), member page ids (u32 per page),
// per cluster an offset and its page range (u32 x 3), and the pending means.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/index/clustering.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/page_summary.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/scoring.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

struct CentroidParams {
  int pages_per_cluster = 16;  ///< average cluster size within a segment
  int segment_pages = 128;     ///< pages clustered together (1K tokens at 8 tokens per page)
  int iterations = 8;          ///< k-means iterations per segment

  void validate() const {
    KVD_EXPECT(pages_per_cluster >= 1, "Centroid: pages_per_cluster is {}, expected >= 1", pages_per_cluster);
    KVD_EXPECT(segment_pages >= pages_per_cluster && segment_pages <= (1 << 20),
               "Centroid: segment_pages is {}, expected pages_per_cluster ({}) .. 1048576", segment_pages, pages_per_cluster);
    KVD_EXPECT(iterations >= 0 && iterations <= 100, "Centroid: iterations is {}, expected 0..100", iterations);
  }
};

struct Centroid {
  using Params = CentroidParams;

  struct State {
    DType dtype = DType::f32;
    int head_dim = 0;
    std::int64_t pages = 0;
    std::int64_t clustered = 0;                        ///< pages [0, clustered) are in clusters
    std::vector<std::byte> centroids;                  ///< [clusters][head_dim], KV dtype
    std::vector<std::uint32_t> offsets{0};             ///< cluster c's members: members[offsets[c] .. offsets[c+1])
    std::vector<std::uint32_t> members;                ///< page ids, nearest to their centroid first
    std::vector<std::uint32_t> first_page, last_page;  ///< per cluster: its segment's page range
    RowStore pending;                                  ///< means of pages [clustered, pages), KV dtype

    std::size_t clusters() const { return offsets.size() - 1; }
  };

  Params params;

  Centroid() = default;
  explicit Centroid(const Params& p) : params(p) { params.validate(); }

  static constexpr std::string_view name() { return "centroid"; }

  void build(State& s, const PageKeys& k) const { append(s, k); }

  void append(State& s, const PageKeys& k) const {
    if (k.pages <= 0) return;
    if (s.pages == 0) init(s, k);
    std::vector<float> mean(static_cast<std::size_t>(k.head_dim));
    for (std::int64_t p = 0; p < k.pages; ++p) {
      page_mean(k, p, mean.data());
      s.pending.push(mean.data());
      ++s.pages;
      if (s.pending.rows() == params.segment_pages) cluster_segment(s);
    }
  }

  std::size_t bytes(const State& s) const {
    return s.centroids.size() + (s.offsets.size() + s.members.size() + s.first_page.size() + s.last_page.size()) * sizeof(std::uint32_t) +
           s.pending.bytes();
  }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    if (select_all_within_budget(q, out)) return;
    const int g = q.group, d = q.head_dim;
    const std::size_t nc = s.clusters();
    // Items: eligible clusters (ids < nc) and candidate pending pages (nc + row), scored alike.
    thread_local std::vector<float> cest, est, score;
    thread_local std::vector<std::uint32_t> items, order;
    items.clear();
    for (std::uint32_t c = 0; c < nc; ++c)
      if (s.last_page[c] >= q.first_candidate && s.first_page[c] < q.end_candidate) items.push_back(c);
    const std::int64_t pend_begin = std::max<std::int64_t>(q.first_candidate, s.clustered);
    const std::int64_t pend_end = std::max(pend_begin, std::min<std::int64_t>(q.end_candidate, s.pages));
    const std::size_t n_clusters = items.size();
    for (std::int64_t p = pend_begin; p < pend_end; ++p) items.push_back(static_cast<std::uint32_t>(nc + static_cast<std::size_t>(p - s.clustered)));
    const std::size_t ni = items.size();
    cest.resize(static_cast<std::size_t>(g) * nc);
    est.resize(static_cast<std::size_t>(g) * ni);
    dispatch_dtype(s.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      dot_rows(q.q, g, reinterpret_cast<const T*>(s.centroids.data()), static_cast<std::int64_t>(nc), d, cest.data(), nc);
      s.pending.for_runs<T>(pend_begin - s.clustered, pend_end - s.clustered, [&](std::int64_t first, std::int64_t count, const T* rows) {
        dot_rows(q.q, g, rows, count, d, est.data() + n_clusters + static_cast<std::size_t>(first - (pend_begin - s.clustered)), ni);
      });
    });
    for (int h = 0; h < g; ++h)
      for (std::size_t i = 0; i < n_clusters; ++i) est[static_cast<std::size_t>(h) * ni + i] = cest[static_cast<std::size_t>(h) * nc + items[i]];
    score.resize(ni);
    gqa_scores(est.data(), g, ni, score.data());
    order_by_score(score, order);
    const std::size_t at = out.size();
    const auto budget = static_cast<std::size_t>(q.budget_pages);
    for (std::size_t i = 0; i < ni && out.size() - at < budget; ++i) {
      const std::uint32_t item = items[order[i]];
      if (item >= nc) {
        out.push_back(static_cast<std::uint32_t>(s.clustered + (item - nc)));
        continue;
      }
      for (std::uint32_t m = s.offsets[item]; m < s.offsets[item + 1] && out.size() - at < budget; ++m) {
        const std::uint32_t p = s.members[m];
        if (p >= q.first_candidate && p < q.end_candidate) out.push_back(p);
      }
    }
    std::sort(out.begin() + static_cast<std::ptrdiff_t>(at), out.end());
  }

 private:
  /// The first pages fix the stream's dtype and head_dim.
  static void init(State& s, const PageKeys& k) {
    s.dtype = k.dtype;
    s.head_dim = k.head_dim;
    s.pending = RowStore(static_cast<std::size_t>(k.head_dim), k.dtype);
  }

  /// Clusters the full pending segment with k-means and drops its means.
  void cluster_segment(State& s) const {
    const int d = s.head_dim;
    const auto du = static_cast<std::size_t>(d);
    const std::int64_t n = s.pending.rows();
    std::vector<float> m(static_cast<std::size_t>(n) * du);
    for (std::int64_t i = 0; i < n; ++i) s.pending.row_float(i, m.data() + static_cast<std::size_t>(i) * du);
    const int k = static_cast<int>((n + params.pages_per_cluster - 1) / params.pages_per_cluster);
    std::vector<std::uint32_t> assign(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) assign[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(i * k / n);
    std::vector<float> centroids;
    local_lloyd(
        m.data(), n, d, k, assign, params.iterations,
        [&](std::int64_t) {
          return std::pair<std::int64_t, std::int64_t>{0, k - 1};
        },
        centroids);
    const std::size_t row = du * dtype_size(s.dtype);
    std::vector<std::vector<std::pair<float, std::uint32_t>>> by_cluster(static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t c = assign[static_cast<std::size_t>(i)];
      by_cluster[c].emplace_back(l2_squared(m.data() + static_cast<std::size_t>(i) * du, centroids.data() + c * du, d),
                                 static_cast<std::uint32_t>(s.clustered + i));
    }
    for (int c = 0; c < k; ++c) {
      auto& list = by_cluster[static_cast<std::size_t>(c)];
      std::sort(list.begin(), list.end());
      for (const auto& [dist, page] : list) s.members.push_back(page);
      s.offsets.push_back(static_cast<std::uint32_t>(s.members.size()));
      const std::size_t at = s.centroids.size();
      s.centroids.resize(at + row);
      store_row(s.dtype, centroids.data() + static_cast<std::size_t>(c) * du, s.centroids.data() + at, du);
      s.first_page.push_back(static_cast<std::uint32_t>(s.clustered));
      s.last_page.push_back(static_cast<std::uint32_t>(s.clustered + n - 1));
    }
    s.clustered += n;
    s.pending = RowStore(du, s.dtype);
  }
};
static_assert(IndexPolicy<Centroid>);

}  // namespace kvdrive::index
