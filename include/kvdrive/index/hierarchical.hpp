// index::Hierarchical: KVDrive's two-level index. Each page is represented by its mean key; page
// means are grouped under cluster centroids by a clustering that keeps neighbouring pages
// together (clusters start as runs of pages_per_cluster consecutive pages, then a few k-means
// iterations let a page move only to clusters of nearby runs). Selection has two levels:
//   1. score every centroid: q . c + radius_weight * |q| * r, where r is the cluster's radius
//      (the largest distance from the centroid to a member mean), so the score bounds q . m for
//      every member m when radius_weight is 1; rank clusters by the GQA rule (Decision 4);
//   2. expand the best clusters until they hold expand x budget pages (and at least min_scored
//      of the candidates; all of them below score_all_below candidates), score their members,
//      and keep the top pages (GQA rule) within the budget. With pair_radii > 0 a member
//      scores q . mean + pair_weight x sum_j |q_pair_j| rho_j over the stream's chosen rotary
//      pairs (pair_radii.hpp), which keeps the single dominant tokens a mean dilutes.
// Growth: pages sealed during decode join the cluster with the nearest centroid, and a cluster
// that grows past split_factor x pages_per_cluster splits in two (with one page per cluster,
// every page is a cluster of its own, and the index selects exactly what MeanKey selects). When
// a chunk of pages arrives (the manager prefills in chunks of 32 pages) and the index has
// doubled since its last full clustering, it re-clusters everything; single pages sealed during
// decode only join and split, so no decode step pays for a full clustering of a long stream.
// Stored (KV dtype unless noted): member means (head_dim elements per page) kept per cluster,
// contiguous, so expanding a cluster streams one block; member page ids and cluster_of(page)
// (u32 each, 8 bytes per page); per cluster a centroid (head_dim elements), a float radius and
// its lowest and highest page id; with pair_radii, pair_radii values per member (KV dtype) and
// the stream's chosen pairs (one byte each), fixed from its first pages. cluster_of() serves the SSD layout (pages of a cluster are
// stored together).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/host_device.hpp"
#include "kvdrive/index/clustering.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/page_summary.hpp"
#include "kvdrive/index/pair_radii.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/scoring.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

/// The candidates whose members Hierarchical scores at level 2 (CPU and GPU): expand x budget,
/// and at least min_scored of the candidates, since at a small budget expand x budget clusters'
/// worth of pages misses too many of the pages that matter; and every candidate while there are
/// fewer than score_all_below of them, where a few clusters rank too coarsely to prune (on
/// SmolLM2's 1K-2K retrieval tasks pruning half the clusters cost 12 points of accuracy;
/// docs/indices.md, "Retrieval on the real model") and scoring them all costs a few microseconds.
KVD_HOST_DEVICE std::uint64_t members_to_score(double expand, double min_scored, std::int64_t score_all_below, std::int64_t budget,
                                               std::int64_t candidates) {
  if (candidates < score_all_below) return static_cast<std::uint64_t>(candidates > 0 ? candidates : 0);
  const double by_budget = ceil(expand * static_cast<double>(budget > 0 ? budget : 0));
  const double by_candidates = ceil(min_scored * static_cast<double>(candidates > 0 ? candidates : 0));
  return static_cast<std::uint64_t>(by_budget > by_candidates ? by_budget : by_candidates);
}

struct HierarchicalParams {
  int pages_per_cluster = 16;                  ///< cluster size at a full clustering
  double expand = 8.0;                         ///< expand clusters until they hold expand x budget pages
  double min_scored = 0.25;                    ///< ... and at least this fraction of the candidates (small budgets)
  std::int64_t score_all_below = 512;          ///< with fewer candidate pages, score them all (no cluster pruning)
  float radius_weight = 0.5f;                  ///< weight of |q| x radius in a centroid's score (0: centroid only)
  int neighbourhood = 2;                       ///< a page may move to clusters up to this many runs away
  int iterations = 4;                          ///< k-means iterations of a full clustering
  int split_factor = 2;                        ///< a cluster splits past split_factor x pages_per_cluster pages
  int pair_radii = 2;                          ///< rotary-pair radii per page in a member's score (0: its mean alone)
  float pair_weight = 0.5f;                    ///< weight of sum_j |q_pair_j| rho_j in a member's score
  RotaryPairs rotary = RotaryPairs::adjacent;  ///< how the keys' channels pair under RoPE

  void validate() const {
    KVD_EXPECT(pages_per_cluster >= 1 && pages_per_cluster <= (1 << 20), "Hierarchical: pages_per_cluster is {}, expected 1..1048576",
               pages_per_cluster);
    KVD_EXPECT(expand >= 1.0 && std::isfinite(expand), "Hierarchical: expand is {}, expected a finite value >= 1", expand);
    KVD_EXPECT(min_scored >= 0.0 && min_scored <= 1.0, "Hierarchical: min_scored is {}, expected a fraction in [0, 1]", min_scored);
    KVD_EXPECT(score_all_below >= 0, "Hierarchical: score_all_below is {}, expected >= 0 candidate pages", score_all_below);
    KVD_EXPECT(radius_weight >= 0.0f && std::isfinite(radius_weight), "Hierarchical: radius_weight is {}, expected a finite value >= 0",
               radius_weight);
    KVD_EXPECT(neighbourhood >= 0, "Hierarchical: neighbourhood is {}, expected >= 0", neighbourhood);
    KVD_EXPECT(iterations >= 0 && iterations <= 100, "Hierarchical: iterations is {}, expected 0..100", iterations);
    KVD_EXPECT(split_factor >= 2, "Hierarchical: split_factor is {}, expected >= 2", split_factor);
    KVD_EXPECT(pair_radii >= 0 && pair_radii <= 128, "Hierarchical: pair_radii is {}, expected 0..128", pair_radii);
    KVD_EXPECT(pair_weight >= 0.0f && std::isfinite(pair_weight), "Hierarchical: pair_weight is {}, expected a finite value >= 0", pair_weight);
  }
};

struct Hierarchical {
  using Params = HierarchicalParams;

  struct Cluster {
    std::vector<std::uint32_t> pages;  ///< member page ids, ascending
    std::vector<std::byte> means;      ///< member means [members][head_dim], in the KV dtype
    std::vector<std::byte> radii;      ///< member rotary-pair radii [members][pairs], in the KV dtype
    std::uint32_t min_page = 0, max_page = 0;
  };

  struct State {
    DType dtype = DType::f32;
    int head_dim = 0;
    std::int64_t pages = 0;
    std::int64_t clustered_at = 0;  ///< pages at the last full clustering
    std::vector<Cluster> clusters;
    std::vector<std::byte> centroids;       ///< [clusters][head_dim], in the KV dtype
    std::vector<float> radius;              ///< per cluster
    std::vector<std::uint32_t> cluster_of;  ///< per page
    std::vector<std::uint8_t> pairs;        ///< the rotary pairs members are scored on (pair_radii)
  };

  Params params;

  Hierarchical() = default;
  explicit Hierarchical(const Params& p) : params(p) { params.validate(); }

  static constexpr std::string_view name() { return "hierarchical"; }

  /// KvManager's check at construction: the pair radii fit the head's rotary pairs.
  void check(int head_dim) const {
    KVD_EXPECT(params.pair_radii <= head_dim / 2, "Hierarchical: pair_radii {} exceeds the {} rotary pairs of a {}-dimensional head",
               params.pair_radii, head_dim / 2, head_dim);
  }

  /// The cluster that holds page p (p < pages indexed).
  static std::uint32_t cluster_of(const State& s, std::uint32_t p) { return s.cluster_of[p]; }
  static std::size_t clusters(const State& s) { return s.clusters.size(); }

  void build(State& s, const PageKeys& k) const { append(s, k); }

  void append(State& s, const PageKeys& k) const {
    if (k.pages <= 0) return;
    if (s.pages == 0) {
      s.dtype = k.dtype;
      s.head_dim = k.head_dim;
    }
    const auto d = static_cast<std::size_t>(s.head_dim);
    std::vector<float> fresh(static_cast<std::size_t>(k.pages) * d);
    for (std::int64_t p = 0; p < k.pages; ++p) page_mean(k, p, fresh.data() + static_cast<std::size_t>(p) * d);
    // Means are kept in the KV dtype; cluster on the values the index actually stores.
    round_to_dtype(s.dtype, fresh.data(), fresh.size());
    const std::vector<float> fresh_radii = pair_radii_of(s, k, fresh);
    const std::size_t r = s.pairs.size();
    // Chunks (prefill) re-cluster everything once the index has doubled since its last full
    // clustering; single pages (decode) only join and split, so a decode step never stalls on a
    // full clustering of a long stream.
    if (s.clusters.empty() || (k.pages > 1 && s.pages + k.pages >= 2 * s.clustered_at)) {
      std::vector<float> all = means_in_page_order(s), all_radii = radii_in_page_order(s);
      all.insert(all.end(), fresh.begin(), fresh.end());
      all_radii.insert(all_radii.end(), fresh_radii.begin(), fresh_radii.end());
      recluster(s, all, all_radii);
      return;
    }
    for (std::int64_t p = 0; p < k.pages; ++p)
      join_nearest(s, fresh.data() + static_cast<std::size_t>(p) * d, fresh_radii.data() + static_cast<std::size_t>(p) * r);
  }

  std::size_t bytes(const State& s) const {
    std::size_t b = s.cluster_of.size() * sizeof(std::uint32_t) + s.centroids.size() + s.radius.size() * sizeof(float);
    for (const Cluster& c : s.clusters) b += c.pages.size() * sizeof(std::uint32_t) + c.means.size() + c.radii.size() + 2 * sizeof(std::uint32_t);
    return b + s.pairs.size();
  }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    if (select_all_within_budget(q, out)) return;
    SelectScratch& w = select_scratch();
    eligible_clusters(s, q, w.eligible);
    rank_clusters(s, q, w);
    score_members(s, q, w);
    top_pages_of(w.pscore, w.ids, q.budget_pages, out);
  }

  /// A coarse pool of about `pages` candidates for a second look (index::TokenRescore), appended
  /// ascending: the candidate members of the best clusters by level 1 alone, whole clusters until
  /// they hold `pages`, no member scored. Below score_all_below candidates, where select() prunes
  /// no cluster, select()'s best `pages` by their members' estimates instead.
  void propose(const State& s, const IndexQuery& q, std::int64_t pages, std::vector<std::uint32_t>& out) const {
    IndexQuery wide = q;
    wide.budget_pages = pages;
    if (q.candidates() < params.score_all_below || pages >= q.candidates()) return select(s, wide, out);
    SelectScratch& w = select_scratch();
    eligible_clusters(s, q, w.eligible);
    rank_clusters(s, q, w);
    thread_local std::vector<std::uint8_t> taken;
    taken.assign(static_cast<std::size_t>(q.candidates()), 0);
    std::int64_t members = 0;
    for (std::size_t i = 0; i < w.order.size() && members < pages; ++i) {
      const Span& sp = w.eligible[w.order[i]];
      const Cluster& c = s.clusters[sp.cluster];
      for (std::uint32_t j = sp.first; j < sp.last; ++j) taken[static_cast<std::size_t>(c.pages[j] - q.first_candidate)] = 1;
      members += sp.last - sp.first;
    }
    for (std::size_t i = 0; i < taken.size(); ++i)
      if (taken[i]) out.push_back(static_cast<std::uint32_t>(q.first_candidate + static_cast<std::int64_t>(i)));
  }

 private:
  /// The candidate members of one cluster: a contiguous run [first, last) of its (ascending)
  /// member list, and so of its means.
  struct Span {
    std::uint32_t cluster, first, last;
  };
  /// select()'s buffers, kept per thread so that a decode step allocates nothing.
  struct SelectScratch {
    std::vector<Span> eligible;            ///< clusters holding candidates
    std::vector<float> cest, est, cscore;  ///< level 1: per centroid, per eligible cluster
    std::vector<std::uint32_t> order;      ///< eligible clusters, best first
    std::vector<float> pest, pscore;       ///< level 2: per member of the expanded clusters
    std::vector<float> qpair;              ///< |q_pair| per head and chosen pair (pair_radii)
    std::vector<float> rho;                ///< one cluster run's radii as float
    std::vector<std::uint32_t> ids;        ///< their page ids
  };
  static SelectScratch& select_scratch() {
    thread_local SelectScratch w;
    return w;
  }

  /// The clusters that hold candidate pages, with the run of their members that are.
  static void eligible_clusters(const State& s, const IndexQuery& q, std::vector<Span>& eligible) {
    eligible.clear();
    for (std::uint32_t c = 0; c < s.clusters.size(); ++c) {
      const Cluster& cl = s.clusters[c];
      if (cl.max_page < q.first_candidate || cl.min_page >= q.end_candidate) continue;
      const auto lo = std::lower_bound(cl.pages.begin(), cl.pages.end(), static_cast<std::uint32_t>(q.first_candidate));
      const auto hi = std::lower_bound(lo, cl.pages.end(), static_cast<std::uint32_t>(q.end_candidate));
      if (lo != hi) eligible.push_back({c, static_cast<std::uint32_t>(lo - cl.pages.begin()), static_cast<std::uint32_t>(hi - cl.pages.begin())});
    }
  }

  /// Level 1: scores the eligible clusters' centroids (q . c + radius_weight |q| r per head, then
  /// the GQA rule) and orders them best first (w.order).
  void rank_clusters(const State& s, const IndexQuery& q, SelectScratch& w) const {
    const int g = q.group, d = q.head_dim;
    const std::size_t nc = s.clusters.size(), ne = w.eligible.size();
    w.cest.resize(static_cast<std::size_t>(g) * nc);
    dispatch_dtype(s.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      dot_rows(q.q, g, reinterpret_cast<const T*>(s.centroids.data()), static_cast<std::int64_t>(nc), d, w.cest.data(), nc);
    });
    w.est.resize(static_cast<std::size_t>(g) * ne);
    for (int h = 0; h < g; ++h) {
      const float* qh = q.q + static_cast<std::size_t>(h) * d;
      float norm = 0;
      for (int j = 0; j < d; ++j) norm += qh[j] * qh[j];
      const float reach = params.radius_weight * std::sqrt(norm);
      for (std::size_t e = 0; e < ne; ++e)
        w.est[static_cast<std::size_t>(h) * ne + e] =
            w.cest[static_cast<std::size_t>(h) * nc + w.eligible[e].cluster] + reach * s.radius[w.eligible[e].cluster];
    }
    w.cscore.resize(ne);
    gqa_scores(w.est.data(), g, ne, w.cscore.data());
    order_by_score(w.cscore, w.order);
  }

  /// Level 2: the candidate members of the best clusters, until there are expand x budget of
  /// them (at least the budget, since expand >= 1), scored by their means (w.pscore, w.ids).
  void score_members(const State& s, const IndexQuery& q, SelectScratch& w) const {
    const int g = q.group, d = q.head_dim;
    const auto target =
        static_cast<std::size_t>(members_to_score(params.expand, params.min_scored, params.score_all_below, q.budget_pages, q.candidates()));
    std::size_t take = 0, members = 0;
    while (take < w.eligible.size() && members < target) {
      const Span& sp = w.eligible[w.order[take++]];
      members += sp.last - sp.first;
    }
    w.pest.resize(static_cast<std::size_t>(g) * members);
    w.ids.clear();
    dispatch_dtype(s.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (std::size_t i = 0; i < take; ++i) {
        const Span& sp = w.eligible[w.order[i]];
        const Cluster& c = s.clusters[sp.cluster];
        dot_rows(q.q, g, reinterpret_cast<const T*>(c.means.data()) + static_cast<std::size_t>(sp.first) * d,
                 static_cast<std::int64_t>(sp.last - sp.first), d, w.pest.data() + w.ids.size(), members);
        w.ids.insert(w.ids.end(), c.pages.begin() + sp.first, c.pages.begin() + sp.last);
      }
    });
    if (!s.pairs.empty()) add_pair_bonus(s, q, take, members, w);
    w.pscore.resize(members);
    gqa_scores(w.pest.data(), g, members, w.pscore.data());
  }

  /// pair_radii: each expanded member's estimate gains pair_weight x sum_j |q_pair_j| rho_j.
  /// A cluster's run of radii is converted to float once (exactly) for all the group's heads.
  void add_pair_bonus(const State& s, const IndexQuery& q, std::size_t take, std::size_t members, SelectScratch& w) const {
    const int g = q.group, d = q.head_dim, r = static_cast<int>(s.pairs.size());
    w.qpair.resize(static_cast<std::size_t>(g) * r);
    for (int h = 0; h < g; ++h)
      for (int i = 0; i < r; ++i)
        w.qpair[static_cast<std::size_t>(h * r + i)] =
            pair_norm(q.q + static_cast<std::size_t>(h) * d, params.rotary, s.pairs[static_cast<std::size_t>(i)], d);
    const std::size_t row = static_cast<std::size_t>(r) * dtype_size(s.dtype);
    std::size_t m = 0;
    for (std::size_t i = 0; i < take; ++i) {
      const Span& sp = w.eligible[w.order[i]];
      const std::size_t n = sp.last - sp.first;
      w.rho.resize(n * static_cast<std::size_t>(r));
      load_row(s.dtype, s.clusters[sp.cluster].radii.data() + sp.first * row, w.rho.data(), w.rho.size());
      for (int h = 0; h < g; ++h) {
        const float* qn = w.qpair.data() + static_cast<std::size_t>(h * r);
        float* e = w.pest.data() + static_cast<std::size_t>(h) * members + m;
        if (r == 2) {  // the default: unrolled, so the loop over members vectorises
          for (std::size_t j = 0; j < n; ++j) e[j] += pair_bonus2(qn, w.rho.data() + 2 * j, params.pair_weight);
        } else {
          for (std::size_t j = 0; j < n; ++j) e[j] += pair_bonus(qn, w.rho.data() + j * static_cast<std::size_t>(r), r, params.pair_weight);
        }
      }
      m += n;
    }
  }

  /// pair_radii: the fresh pages' radii on the stream's pairs [pages][pairs], in the KV dtype's
  /// values; the stream's pairs are chosen from its first pages.
  std::vector<float> pair_radii_of(State& s, const PageKeys& k, const std::vector<float>& means) const {
    if (params.pair_radii == 0) return {};
    const int d = s.head_dim, all = d / 2;
    std::vector<float> rho(static_cast<std::size_t>(k.pages) * all);
    for (std::int64_t p = 0; p < k.pages; ++p)
      page_pair_radii(k, p, means.data() + static_cast<std::size_t>(p) * d, params.rotary, rho.data() + static_cast<std::size_t>(p) * all);
    if (s.pairs.empty()) s.pairs = choose_pairs(means.data(), rho.data(), k.pages, d, params.pair_radii, params.rotary);
    const std::size_t r = s.pairs.size();
    std::vector<float> out(static_cast<std::size_t>(k.pages) * r);
    for (std::int64_t p = 0; p < k.pages; ++p)
      for (std::size_t i = 0; i < r; ++i) out[static_cast<std::size_t>(p) * r + i] = rho[static_cast<std::size_t>(p) * all + s.pairs[i]];
    round_to_dtype(s.dtype, out.data(), out.size());
    return out;
  }

  /// Every page's mean as float, in page order.
  static std::vector<float> means_in_page_order(const State& s) {
    const auto d = static_cast<std::size_t>(s.head_dim);
    const std::size_t row = d * dtype_size(s.dtype);
    std::vector<float> all(static_cast<std::size_t>(s.pages) * d);
    for (const Cluster& c : s.clusters)
      for (std::size_t j = 0; j < c.pages.size(); ++j) load_row(s.dtype, c.means.data() + j * row, all.data() + c.pages[j] * d, d);
    return all;
  }

  /// Every page's pair radii as float, in page order (empty without pair_radii).
  static std::vector<float> radii_in_page_order(const State& s) {
    const std::size_t r = s.pairs.size(), row = r * dtype_size(s.dtype);
    std::vector<float> all(static_cast<std::size_t>(s.pages) * r);
    if (r == 0) return all;
    for (const Cluster& c : s.clusters)
      for (std::size_t j = 0; j < c.pages.size(); ++j) load_row(s.dtype, c.radii.data() + j * row, all.data() + c.pages[j] * r, r);
    return all;
  }

  /// Appends one member's radii (r values) to cluster c.
  static void push_radii(const State& s, Cluster& c, const float* radii) {
    const std::size_t r = s.pairs.size(), at = c.radii.size();
    if (r == 0) return;
    c.radii.resize(at + r * dtype_size(s.dtype));
    store_row(s.dtype, radii, c.radii.data() + at, r);
  }

  /// A full clustering of every page: runs of pages_per_cluster pages, then local k-means.
  void recluster(State& s, const std::vector<float>& means, const std::vector<float>& radii) const {
    const int d = s.head_dim;
    const auto n = static_cast<std::int64_t>(means.size() / static_cast<std::size_t>(d));
    const std::int64_t cpc = params.pages_per_cluster;
    const int k = static_cast<int>((n + cpc - 1) / cpc);
    std::vector<std::uint32_t> assign(static_cast<std::size_t>(n));
    for (std::int64_t p = 0; p < n; ++p) assign[static_cast<std::size_t>(p)] = static_cast<std::uint32_t>(p / cpc);
    const std::int64_t r = params.neighbourhood;
    std::vector<float> centroids;
    local_lloyd(
        means.data(), n, d, k, assign, params.iterations,
        [&](std::int64_t p) {
          const std::int64_t run = p / cpc;
          return std::pair<std::int64_t, std::int64_t>{std::max<std::int64_t>(0, run - r), std::min<std::int64_t>(k - 1, run + r)};
        },
        centroids);
    s.clusters.assign(static_cast<std::size_t>(k), Cluster{});
    s.cluster_of = assign;
    s.pages = n;
    s.clustered_at = n;
    const std::size_t row = static_cast<std::size_t>(d) * dtype_size(s.dtype);
    for (std::int64_t p = 0; p < n; ++p) {
      Cluster& c = s.clusters[assign[static_cast<std::size_t>(p)]];
      c.pages.push_back(static_cast<std::uint32_t>(p));
      const std::size_t at = c.means.size();
      c.means.resize(at + row);
      store_row(s.dtype, means.data() + static_cast<std::size_t>(p) * d, c.means.data() + at, static_cast<std::size_t>(d));
      push_radii(s, c, radii.data() + static_cast<std::size_t>(p) * s.pairs.size());
    }
    s.centroids.assign(static_cast<std::size_t>(k) * row, std::byte{});
    s.radius.assign(static_cast<std::size_t>(k), 0.0f);
    for (int c = 0; c < k; ++c) refresh(s, static_cast<std::uint32_t>(c));
    for (std::uint32_t c = 0; c < s.clusters.size(); ++c)
      while (too_big(s.clusters[c])) split(s, c);
  }

  bool too_big(const Cluster& c) const {
    return c.pages.size() > static_cast<std::size_t>(params.split_factor) * static_cast<std::size_t>(params.pages_per_cluster);
  }

  /// Recomputes cluster c's centroid, radius and page range from its members.
  static void refresh(State& s, std::uint32_t c) {
    Cluster& cl = s.clusters[c];
    const auto d = static_cast<std::size_t>(s.head_dim);
    const std::size_t n = cl.pages.size();
    std::vector<float> m(n * d), centroid(d, 0.0f);
    load_row(s.dtype, cl.means.data(), m.data(), n * d);
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < d; ++i) centroid[i] += m[j * d + i];
    for (float& x : centroid) x /= static_cast<float>(n);
    const std::size_t row = d * dtype_size(s.dtype);
    store_row(s.dtype, centroid.data(), s.centroids.data() + c * row, d);
    // The radius is measured from the stored (rounded) centroid, so it bounds what is scored.
    std::vector<float> stored(d);
    load_row(s.dtype, s.centroids.data() + c * row, stored.data(), d);
    float r2 = 0;
    for (std::size_t j = 0; j < n; ++j) r2 = std::max(r2, l2_squared(m.data() + j * d, stored.data(), static_cast<int>(d)));
    s.radius[c] = std::sqrt(r2) * (1.0f + 1e-6f);
    cl.min_page = cl.pages.front();
    cl.max_page = cl.pages.back();
  }

  /// A new page (the next page id) joins the cluster with the nearest centroid; with one page
  /// per cluster it is a cluster of its own.
  void join_nearest(State& s, const float* mean, const float* radii) const {
    const auto d = static_cast<std::size_t>(s.head_dim);
    const std::size_t row = d * dtype_size(s.dtype);
    if (params.pages_per_cluster == 1) {
      const auto c = static_cast<std::uint32_t>(s.clusters.size());
      Cluster& cl = s.clusters.emplace_back();
      cl.pages.push_back(static_cast<std::uint32_t>(s.pages++));
      cl.means.resize(row);
      store_row(s.dtype, mean, cl.means.data(), d);
      push_radii(s, cl, radii);
      s.centroids.resize(s.centroids.size() + row);
      s.radius.push_back(0.0f);
      s.cluster_of.push_back(c);
      refresh(s, c);
      return;
    }
    std::vector<float> c(d);
    std::uint32_t best = 0;
    float best_d = INFINITY;
    for (std::uint32_t i = 0; i < s.clusters.size(); ++i) {
      load_row(s.dtype, s.centroids.data() + i * row, c.data(), d);
      const float dist = l2_squared(mean, c.data(), static_cast<int>(d));
      if (dist < best_d) best_d = dist, best = i;
    }
    Cluster& cl = s.clusters[best];
    const auto page = static_cast<std::uint32_t>(s.pages++);
    cl.pages.push_back(page);
    const std::size_t at = cl.means.size();
    cl.means.resize(at + row);
    store_row(s.dtype, mean, cl.means.data() + at, d);
    push_radii(s, cl, radii);
    s.cluster_of.push_back(best);
    refresh(s, best);
    if (too_big(cl)) split(s, best);
  }

  /// Splits cluster c in two: its lower and upper halves by page id, refined by 2-means.
  void split(State& s, std::uint32_t c) const {
    const auto d = static_cast<std::size_t>(s.head_dim);
    const std::size_t row = d * dtype_size(s.dtype);
    Cluster old = std::move(s.clusters[c]);
    const std::size_t n = old.pages.size(), rrow = s.pairs.size() * dtype_size(s.dtype);
    std::vector<float> m(n * d);
    load_row(s.dtype, old.means.data(), m.data(), n * d);
    std::vector<std::uint32_t> assign(n);
    for (std::size_t j = 0; j < n; ++j) assign[j] = j < n / 2 ? 0u : 1u;
    std::vector<float> centroids;
    local_lloyd(
        m.data(), static_cast<std::int64_t>(n), static_cast<int>(d), 2, assign, params.iterations,
        [](std::int64_t) {
          return std::pair<std::int64_t, std::int64_t>{0, 1};
        },
        centroids);
    const auto fresh = static_cast<std::uint32_t>(s.clusters.size());
    Cluster halves[2];
    for (std::size_t j = 0; j < n; ++j) {
      Cluster& h = halves[assign[j]];
      h.pages.push_back(old.pages[j]);
      h.means.insert(h.means.end(), old.means.begin() + static_cast<std::ptrdiff_t>(j * row),
                     old.means.begin() + static_cast<std::ptrdiff_t>((j + 1) * row));
      h.radii.insert(h.radii.end(), old.radii.begin() + static_cast<std::ptrdiff_t>(j * rrow),
                     old.radii.begin() + static_cast<std::ptrdiff_t>((j + 1) * rrow));
      s.cluster_of[old.pages[j]] = assign[j] == 0 ? c : fresh;
    }
    s.clusters[c] = std::move(halves[0]);
    s.clusters.push_back(std::move(halves[1]));
    s.centroids.resize(s.centroids.size() + row);
    s.radius.push_back(0.0f);
    refresh(s, c);
    refresh(s, fresh);
  }
};
static_assert(IndexPolicy<Hierarchical>);

}  // namespace kvdrive::index
