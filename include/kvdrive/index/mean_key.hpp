// index::MeanKey (ShadowKV's landmarks): each page is represented by the mean of its keys; a
// page's estimate for a query head is q . mean, and pages are ranked by the GQA rule
// (Decision 4). The means are stored in the KV dtype (head_dim elements per page).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/page_summary.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/scoring.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

struct MeanKey {
  struct State {
    RowStore means;  ///< a row of head_dim per page, in the KV dtype
    std::int64_t pages = 0;
  };

  static constexpr std::string_view name() { return "mean-key"; }

  void build(State& s, const PageKeys& k) const { append(s, k); }
  void append(State& s, const PageKeys& k) const {
    if (s.pages == 0) s.means = RowStore(static_cast<std::size_t>(k.head_dim), k.dtype);
    std::vector<float> mean(static_cast<std::size_t>(k.head_dim));
    for (std::int64_t p = 0; p < k.pages; ++p, ++s.pages) {
      page_mean(k, p, mean.data());
      s.means.push(mean.data());
    }
  }
  std::size_t bytes(const State& s) const { return s.means.bytes(); }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const auto n = static_cast<std::size_t>(q.candidates());
    select_by_estimates(q, out, [&](float* est) {
      dispatch_dtype(s.means.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        s.means.for_runs<T>(q.first_candidate, q.end_candidate, [&](std::int64_t first, std::int64_t count, const T* rows) {
          dot_rows(q.q, q.group, rows, count, q.head_dim, est + (first - q.first_candidate), n);
        });
      });
    });
  }
};
static_assert(IndexPolicy<MeanKey>);

}  // namespace kvdrive::index
