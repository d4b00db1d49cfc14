// custom::FirstKey: an index policy written outside the library, as docs/policies.md walks
// through. Each page is represented by its first key (a "landmark" token, kept in the KV dtype);
// a page's estimate for a query head is q . first key, and the GQA rule (Decision 4) with the
// library's top-k turns the estimates into the selection. Cheaper than MeanKey to build (no
// averaging), and usually worse: one token stands for eight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <kvdrive/index/concept.hpp>
#include <kvdrive/index/row_store.hpp>
#include <kvdrive/index/scoring.hpp>
#include <kvdrive/index/selection.hpp>

namespace custom {

struct FirstKey {
  /// Per stream: one row of head_dim values per sealed page (RowStore keeps them in the KV dtype).
  struct State {
    kvdrive::index::RowStore landmarks;
    std::int64_t pages = 0;
  };

  static constexpr std::string_view name() { return "first-key"; }

  /// Prefill: the prompt's sealed pages. Decode: each page sealed after. Must not throw once
  /// the manager commits, so nothing here validates; the keys arrive as float.
  void build(State& s, const kvdrive::index::PageKeys& k) const { append(s, k); }
  void append(State& s, const kvdrive::index::PageKeys& k) const {
    if (s.pages == 0) s.landmarks = kvdrive::index::RowStore(static_cast<std::size_t>(k.head_dim), k.dtype);
    for (std::int64_t p = 0; p < k.pages; ++p, ++s.pages) s.landmarks.push(k.page(p));  // row 0 of the page
  }

  std::size_t bytes(const State& s) const { return s.landmarks.bytes(); }

  /// The candidate pages [first_candidate, end_candidate) with the best estimates, at most
  /// budget_pages of them, ascending. const: selection commits nothing (Decision 8).
  void select(const State& s, const kvdrive::index::IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const auto n = static_cast<std::size_t>(q.candidates());
    kvdrive::index::select_by_estimates(q, out, [&](float* est) {  // est[h * n + i]: head h, candidate i
      kvdrive::dispatch_dtype(s.landmarks.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        s.landmarks.for_runs<T>(q.first_candidate, q.end_candidate, [&](std::int64_t first, std::int64_t count, const T* rows) {
          kvdrive::index::dot_rows(q.q, q.group, rows, count, q.head_dim, est + (first - q.first_candidate), n);
        });
      });
    });
  }
};
static_assert(kvdrive::index::IndexPolicy<FirstKey>);

}  // namespace custom
