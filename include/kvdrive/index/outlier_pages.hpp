// index::OutlierPages<Inner>: ShadowKV's outlier chunks as a wrapper of any page index. A page
// whose keys stray from their own mean (the lowest cosine similarity of a token to the page's
// mean key) is summarised worst by a mean or a box, so the pages that stray most are always
// selected: up to floor(share x budget) of them, within the budget (the inner index fills the
// rest). ShadowKV keeps 0.2-0.3% of the pages at 128K this way.
//
// State: every page's outlier score (1 - min_t cos(k_t, mean)) with its id, highest first (8
// bytes per page, counted in bytes()). The selection is the union of the candidate outliers and the
// inner index's answer for the rest; where the inner index also chose an outlier, it is asked
// once more for one page more per overlap, and the larger answer within the budget is kept.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/mean_key.hpp"
#include "kvdrive/index/page_summary.hpp"

namespace kvdrive::index {

struct OutlierPagesParams {
  double share = 0.125;  ///< at most floor(share x budget) outlier pages per selection

  void validate() const { KVD_EXPECT(share >= 0.0 && share < 1.0, "OutlierPages: share is {}, expected a fraction of the budget in [0, 1)", share); }
};

/// 1 - the lowest cosine similarity of one of the page's keys to the page's mean key: 0 for a
/// page of equal keys, up to 2 for a key opposite to the mean.
inline float outlier_score(const PageKeys& k, std::int64_t p) {
  std::vector<float> mean(static_cast<std::size_t>(k.head_dim));
  page_mean(k, p, mean.data());
  double mm = 0;
  for (float x : mean) mm += static_cast<double>(x) * x;
  double low = 1.0;
  for (int t = 0; t < k.page_tokens; ++t) {
    const float* key = k.page(p) + static_cast<std::size_t>(t) * k.head_dim;
    double dot = 0, kk = 0;
    for (int c = 0; c < k.head_dim; ++c)
      dot += static_cast<double>(key[c]) * mean[static_cast<std::size_t>(c)], kk += static_cast<double>(key[c]) * key[c];
    const double cos = mm > 0 && kk > 0 ? dot / std::sqrt(mm * kk) : 1.0;
    low = std::min(low, cos);
  }
  return static_cast<float>(1.0 - low);
}

template <IndexPolicy Inner>
struct OutlierPages {
  using InnerIndex = Inner;
  using Params = OutlierPagesParams;

  struct State {
    typename Inner::State inner;
    std::vector<std::pair<float, std::uint32_t>> order;  ///< (outlier score, page) of every page, highest first, ties to the lower page
  };

  Inner inner;
  Params params;

  OutlierPages() = default;
  explicit OutlierPages(Inner i, const Params& p = {}) : inner(std::move(i)), params(p) { params.validate(); }

  static std::string_view name() {
    static const std::string n = "outliers-" + std::string(Inner::name());
    return n;
  }

  void check(int head_dim) const { check_for_head_dim(inner, head_dim); }

  void build(State& s, const PageKeys& k) const {
    inner.build(s.inner, k);
    add(s, k);
  }
  void append(State& s, const PageKeys& k) const {
    inner.append(s.inner, k);
    add(s, k);
  }
  std::size_t bytes(const State& s) const { return inner.bytes(s.inner) + s.order.size() * sizeof(s.order[0]); }

  std::uint32_t cluster_of(const State& s, std::uint32_t page) const requires requires(const Inner& i, const typename Inner::State& st) {
    i.cluster_of(st, page);
  }
  { return inner.cluster_of(s.inner, page); }

  /// The candidates' strongest outliers, at most floor(share x budget), ascending.
  void outliers(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    out.clear();
    const auto cap = static_cast<std::size_t>(std::floor(params.share * static_cast<double>(q.budget_pages)));
    for (const auto& [score, page] : s.order) {
      if (out.size() >= cap) break;
      if (page >= q.first_candidate && page < q.end_candidate) out.push_back(page);
    }
    std::sort(out.begin(), out.end());
  }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    thread_local std::vector<std::uint32_t> pinned, answer, merged;
    outliers(s, q, pinned);
    if (pinned.empty() || q.budget_pages >= q.candidates()) {
      inner.select(s.inner, q, out);
      return;
    }
    IndexQuery rest = q;
    rest.budget_pages = q.budget_pages - static_cast<std::int64_t>(pinned.size());
    std::vector<std::uint32_t> best;
    for (int attempt = 0; attempt < 2 && rest.budget_pages > 0; ++attempt) {
      answer.clear();
      inner.select(s.inner, rest, answer);
      merged.clear();
      std::set_union(answer.begin(), answer.end(), pinned.begin(), pinned.end(), std::back_inserter(merged));
      const auto size = static_cast<std::int64_t>(merged.size());
      if (size <= q.budget_pages && merged.size() > best.size()) best = merged;
      if (size >= q.budget_pages) break;
      rest.budget_pages += q.budget_pages - size;  // the overlap: one page more per outlier it chose itself
    }
    if (best.empty()) best = pinned;
    out.insert(out.end(), best.begin(), best.end());
  }

 private:
  void add(State& s, const PageKeys& k) const {
    for (std::int64_t p = 0; p < k.pages; ++p) {
      const float v = outlier_score(k, p);
      const auto page = static_cast<std::uint32_t>(k.first_page + p);
      const std::pair<float, std::uint32_t> item{v, page};
      const auto at = std::upper_bound(s.order.begin(), s.order.end(), item,
                                       [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
      s.order.insert(at, item);
    }
  }
};
static_assert(IndexPolicy<OutlierPages<MeanKey>>);

}  // namespace kvdrive::index
