// index::Quest (Tang et al., 2024): per page and channel, the minimum and maximum key. For a
// query q the page's score is sum_i max(q_i min_i, q_i max_i), an upper bound of q.k over the
// page's keys. Pages are ranked by the GQA rule (Decision 4) over the group's heads.
// The bounds are stored in the KV dtype (2 x head_dim elements per page): a min or max of keys
// is itself a key value, so the bound stays exact.
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

struct Quest {
  struct State {
    RowStore lo, hi;  ///< a row of head_dim per page, in the KV dtype
    std::int64_t pages = 0;
    int head_dim = 0;
  };

  static constexpr std::string_view name() { return "quest"; }

  void build(State& s, const PageKeys& k) const { append(s, k); }
  void append(State& s, const PageKeys& k) const {
    if (s.pages == 0) {
      s.head_dim = k.head_dim;
      s.lo = RowStore(static_cast<std::size_t>(k.head_dim), k.dtype);
      s.hi = RowStore(static_cast<std::size_t>(k.head_dim), k.dtype);
    }
    std::vector<float> lo(static_cast<std::size_t>(k.head_dim)), hi(lo.size());
    for (std::int64_t p = 0; p < k.pages; ++p, ++s.pages) {
      page_bounds(k, p, lo.data(), hi.data());
      s.lo.push(lo.data());
      s.hi.push(hi.data());
    }
  }
  std::size_t bytes(const State& s) const { return s.lo.bytes() + s.hi.bytes(); }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const auto n = static_cast<std::size_t>(q.candidates());
    select_by_estimates(q, out, [&](float* est) {
      dispatch_dtype(s.lo.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        s.lo.for_runs<T>(q.first_candidate, q.end_candidate, [&](std::int64_t first, std::int64_t count, const T* lo) {
          quest_rows(q.q, q.group, lo, s.hi.row<T>(first), count, q.head_dim, est + (first - q.first_candidate), n);
        });
      });
    });
  }
};
static_assert(IndexPolicy<Quest>);

}  // namespace kvdrive::index
