// Choosing the cluster size of a clustered index (Hierarchical, Centroid: any index with
// `params.pages_per_cluster`) from calibration data, KVDrive's "number of centroids" knob. Small
// clusters score more centroids (slower selection) but locate critical pages better; large ones
// are cheap but blur them. choose_cluster_size() builds the index at each candidate size over
// the calibration streams (a prompt's page keys and some of its queries), times selection, and
// measures the attention mass the selection captures against exact attention over the
// candidate tokens. It picks the fastest size whose mean mass recall is within `tolerance` of
// the best size's; sizes within 10% of the fastest time tie, and the largest of them wins.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/index/concept.hpp"

namespace kvdrive::index {

template <class I>
concept HasClusterSize = IndexPolicy<I> && requires(I& i) {
  { i.params.pages_per_cluster } -> std::convertible_to<int>;
};

/// One stream's calibration data.
struct ClusterCalibration {
  PageKeys keys;                   ///< every sealed page of the stream, first_page 0
  std::span<const float> queries;  ///< [n][group][head_dim], e.g. the prompt's last queries
  int group = 1;
  float scale = 1.0f;
  std::int64_t first_candidate = 0, end_candidate = 0;  ///< candidate pages (no sink, no local)
  std::int64_t budget_pages = 0;
};

struct ClusterSizeCase {
  int pages_per_cluster = 0;
  double select_us = 0;         ///< mean selection time per query group
  double mass_recall = 0;       ///< mean share of the candidates' attention mass selected
  std::size_t index_bytes = 0;  ///< over the calibration streams
};

struct ClusterSizeChoice {
  int pages_per_cluster = 0;
  std::vector<ClusterSizeCase> cases;  ///< in the order of the sizes tried
};

/// Share of the candidate tokens' attention mass that falls on `selected`, per query head,
/// averaged over the group (exact softmax over the candidate pages' tokens only; sink and local
/// are always attended, so they are left out of both sides).
inline double candidate_mass_recall(const ClusterCalibration& c, const float* q, std::span<const std::uint32_t> selected) {
  const int d = c.keys.head_dim, pt = c.keys.page_tokens;
  const auto pages = static_cast<std::size_t>(c.end_candidate - c.first_candidate);
  std::vector<double> page_lse(pages);
  double recall = 0;
  for (int h = 0; h < c.group; ++h) {
    const float* qh = q + static_cast<std::size_t>(h) * d;
    double top = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < pages; ++i) {
      const float* page = c.keys.page(c.first_candidate + static_cast<std::int64_t>(i));
      double m = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int t = 0; t < pt; ++t) {
        double s = 0;
        for (int j = 0; j < d; ++j) s += static_cast<double>(qh[j]) * page[static_cast<std::size_t>(t) * d + j];
        s *= c.scale;
        if (s > m) {
          sum = sum * std::exp(m - s) + 1.0;
          m = s;
        } else {
          sum += std::exp(s - m);
        }
      }
      page_lse[i] = m + std::log(sum);
      top = std::max(top, page_lse[i]);
    }
    double total = 0, chosen = 0;
    for (std::size_t i = 0; i < pages; ++i) total += std::exp(page_lse[i] - top);
    for (std::uint32_t p : selected) chosen += std::exp(page_lse[p - static_cast<std::size_t>(c.first_candidate)] - top);
    recall += chosen / total;
  }
  return recall / c.group;
}

/// Selection times this close to the fastest (as a fraction) count as equally fast.
inline constexpr double kTimeTie = 0.10;

namespace cluster_size_detail {

/// Throws kvdrive::Error for arguments choose_cluster_size cannot use.
inline void check(std::span<const ClusterCalibration> streams, std::span<const int> sizes, double tolerance) {
  KVD_EXPECT(!sizes.empty(), "choose_cluster_size: no cluster sizes to try");
  KVD_EXPECT(tolerance >= 0 && std::isfinite(tolerance), "choose_cluster_size: tolerance {} must be finite and >= 0", tolerance);
  KVD_EXPECT(!streams.empty(), "choose_cluster_size: no calibration streams");
  for (const ClusterCalibration& c : streams) {
    KVD_EXPECT(c.keys.first_page == 0 && c.keys.pages >= c.end_candidate && c.first_candidate >= 0 && c.first_candidate <= c.end_candidate &&
                   c.budget_pages >= 0,
               "choose_cluster_size: candidates [{}, {}) outside the {} pages given", c.first_candidate, c.end_candidate, c.keys.pages);
    KVD_EXPECT(c.group >= 1 && c.queries.size() % (static_cast<std::size_t>(c.group) * c.keys.head_dim) == 0,
               "choose_cluster_size: {} query values are not whole groups of {} x {}", c.queries.size(), c.group, c.keys.head_dim);
  }
}

/// The query group at `at` of c.queries, as a selection request over c's candidates.
inline IndexQuery calibration_query(const ClusterCalibration& c, std::size_t at) {
  IndexQuery q;
  q.q = c.queries.data() + at;
  q.group = c.group;
  q.head_dim = c.keys.head_dim;
  q.scale = c.scale;
  q.first_candidate = c.first_candidate;
  q.end_candidate = c.end_candidate;
  q.budget_pages = std::min(c.budget_pages, c.end_candidate - c.first_candidate);
  return q;
}

/// One size's row: `index` (already at that size) built over every stream, each query group
/// selected and timed, the recall and time averaged over all of them.
template <HasClusterSize I>
ClusterSizeCase measure(const I& index, std::span<const ClusterCalibration> streams, std::vector<std::uint32_t>& selected) {
  ClusterSizeCase row{index.params.pages_per_cluster, 0, 0, 0};
  double queries = 0, seconds = 0;
  for (const ClusterCalibration& c : streams) {
    typename I::State state;
    index.build(state, c.keys);
    row.index_bytes += index.bytes(state);
    const std::size_t per_query = static_cast<std::size_t>(c.group) * c.keys.head_dim;
    // One untimed selection first: the first size tried must not pay for cold caches and
    // the index's scratch buffers growing.
    bool warm = false;
    for (std::size_t at = 0; at < c.queries.size(); at += per_query) {
      const IndexQuery q = calibration_query(c, at);
      if (!warm && q.candidates() > 0) {
        index.select(state, q, selected);
        warm = true;
      }
      selected.clear();
      const auto t0 = std::chrono::steady_clock::now();
      if (q.candidates() > 0) index.select(state, q, selected);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      row.mass_recall += q.candidates() > 0 ? candidate_mass_recall(c, q.q, selected) : 1.0;
      queries += 1;
    }
  }
  if (queries > 0) {
    row.mass_recall /= queries;
    row.select_us = 1e6 * seconds / queries;
  }
  return row;
}

/// The choice among measured cases: the fastest within `tolerance` of the best recall, times
/// within kTimeTie of the fastest tied (timing noise must not decide), and among ties the
/// largest clusters (the smallest index). 0 when no case measured a finite recall.
inline int pick(const std::vector<ClusterSizeCase>& cases, double tolerance) {
  double best = 0;
  for (const ClusterSizeCase& r : cases) best = std::max(best, r.mass_recall);
  double fastest = std::numeric_limits<double>::infinity();
  for (const ClusterSizeCase& r : cases)
    if (r.mass_recall >= best - tolerance) fastest = std::min(fastest, r.select_us);
  int size = 0;
  for (const ClusterSizeCase& r : cases)
    if (r.mass_recall >= best - tolerance && r.select_us <= fastest * (1.0 + kTimeTie) && r.pages_per_cluster > size) size = r.pages_per_cluster;
  return size;
}

}  // namespace cluster_size_detail

/// Builds `base` at each size in `sizes` over `streams`, and picks the fastest size whose mean
/// mass recall is at least the best size's minus `tolerance` (times within kTimeTie of the
/// fastest tie, and the largest of the tied sizes wins). `base`'s other parameters are kept.
template <HasClusterSize I>
ClusterSizeChoice choose_cluster_size(const I& base, std::span<const ClusterCalibration> streams, std::span<const int> sizes,
                                      double tolerance = 0.01) {
  cluster_size_detail::check(streams, sizes, tolerance);
  ClusterSizeChoice choice;
  std::vector<std::uint32_t> selected;
  for (int size : sizes) {
    I index = base;
    index.params.pages_per_cluster = size;
    index.params.validate();
    choice.cases.push_back(cluster_size_detail::measure(index, streams, selected));
  }
  choice.pages_per_cluster = cluster_size_detail::pick(choice.cases, tolerance);
  KVD_EXPECT(choice.pages_per_cluster > 0, "choose_cluster_size: no size measured a finite recall (are the queries finite?)");
  return choice;
}

}  // namespace kvdrive::index
