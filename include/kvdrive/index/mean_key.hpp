// index::MeanKey (ShadowKV's landmarks): each page is represented by the mean of its keys; a
// page's estimate for a query head is q . mean, and pages are ranked by the GQA rule
// (Decision 4). The means are kept in float (head_dim x 4 bytes per page) for now.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

struct MeanKey {
  struct State {
    RowStore means;  ///< a row of head_dim per page
    std::int64_t pages = 0;
  };

  static constexpr std::string_view name() { return "mean-key"; }

  void build(State& s, const PageKeys& k) const { append(s, k); }
  void append(State& s, const PageKeys& k) const {
    if (s.pages == 0) s.means = RowStore(static_cast<std::size_t>(k.head_dim));
    std::vector<float> mean(static_cast<std::size_t>(k.head_dim));
    for (std::int64_t p = 0; p < k.pages; ++p, ++s.pages) {
      const float* page = k.page(p);
      std::fill(mean.begin(), mean.end(), 0.0f);
      for (int t = 0; t < k.page_tokens; ++t)
        for (int i = 0; i < k.head_dim; ++i) mean[static_cast<std::size_t>(i)] += page[static_cast<std::size_t>(t) * k.head_dim + i];
      for (auto& m : mean) m /= static_cast<float>(k.page_tokens);
      s.means.push(mean.data());
    }
  }
  std::size_t bytes(const State& s) const { return s.means.bytes(); }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const auto n = static_cast<std::size_t>(q.candidates());
    thread_local std::vector<float> est, score;
    est.resize(static_cast<std::size_t>(q.group) * n);
    score.resize(n);
    for (int h = 0; h < q.group; ++h)
      for (std::size_t i = 0; i < n; ++i)
        est[static_cast<std::size_t>(h) * n + i] =
            attention::dot8(q.q + static_cast<std::size_t>(h) * q.head_dim, s.means.row(q.first_candidate + static_cast<std::int64_t>(i)), q.head_dim);
    gqa_scores(est.data(), q.group, n, score.data());
    top_pages(score, q.first_candidate, q.budget_pages, out);
  }
};
static_assert(IndexPolicy<MeanKey>);

}  // namespace kvdrive::index
