// The two oracles (Decision 5), for evaluation: they keep every key in float (documented
// exception to "index data in the KV dtype": they are references, not candidates for
// deployment) and score pages exactly.
//   Oracle:     per head, a page's estimate is its true max scaled q.k; pages are ranked by the
//               GQA rule (Decision 4).
//   OracleMass: pages ranked by their true attention mass summed over the group's heads, each
//               head's softmax taken over all sealed pages. The sum is what mean mass recall
//               adds up, so this choice maximises it: the upper reference for recall.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

/// Keeps all sealed keys of a stream in float, one RowStore row per page; shared by both oracles.
struct ExactKeys {
  RowStore keys;  ///< a row per page: [page_tokens][head_dim]
  std::int64_t pages = 0;
  int page_tokens = 0;
  int head_dim = 0;

  std::size_t bytes() const { return keys.bytes(); }

  void add(const PageKeys& k) {
    if (pages == 0) {
      page_tokens = k.page_tokens;
      head_dim = k.head_dim;
      keys = RowStore(static_cast<std::size_t>(k.page_tokens) * k.head_dim);
    }
    for (std::int64_t i = 0; i < k.pages; ++i, ++pages) keys.push(k.page(i));
  }
  const float* page(std::int64_t p) const { return keys.row<float>(p); }
  /// Scaled q.k of every token of page p for each of the group's heads: s[group][rows], rows =
  /// attention::padded_rows(page_tokens).
  void scores(const float* q, int group, float scale, std::int64_t p, float* s) const {
    attention::page_scores(q, group, page(p), page_tokens, head_dim, scale, s);
  }
};

/// Which true score an exact oracle ranks pages by.
enum class OracleRule { max_score, mass };

/// The exact oracles; see the top of this file. Use the aliases Oracle and OracleMass.
template <OracleRule Rule>
struct ExactOracle {
  using State = ExactKeys;
  static constexpr std::string_view name() { return Rule == OracleRule::max_score ? "oracle" : "oracle-mass"; }

  void build(State& s, const PageKeys& k) const { s.add(k); }
  void append(State& s, const PageKeys& k) const { s.add(k); }
  std::size_t bytes(const State& s) const { return s.bytes(); }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const std::size_t n = static_cast<std::size_t>(q.candidates());
    const int rows = attention::padded_rows(s.page_tokens);
    if constexpr (Rule == OracleRule::max_score) {
      std::vector<float> est(static_cast<std::size_t>(q.group) * n), tok(static_cast<std::size_t>(q.group) * rows);
      for (std::size_t i = 0; i < n; ++i) {
        s.scores(q.q, q.group, q.scale, q.first_candidate + static_cast<std::int64_t>(i), tok.data());
        for (int h = 0; h < q.group; ++h) {
          const float* th = tok.data() + static_cast<std::size_t>(h) * rows;
          float best = th[0];
          for (int t = 1; t < s.page_tokens; ++t) best = th[t] > best ? th[t] : best;
          est[static_cast<std::size_t>(h) * n + i] = best;
        }
      }
      std::vector<float> score(n);
      gqa_scores(est.data(), q.group, n, score.data());
      top_pages(score, q.first_candidate, q.budget_pages, out);
    } else {
      const auto g = static_cast<std::size_t>(q.group);
      std::vector<float> page_lse(static_cast<std::size_t>(s.pages) * g), tok(g * rows);
      std::vector<float> total_m(g, attention::neg_inf()), total_l(g, 0.0f);
      for (std::int64_t p = 0; p < s.pages; ++p) {
        s.scores(q.q, q.group, q.scale, p, tok.data());
        for (std::size_t h = 0; h < g; ++h) {
          const attention::RowSoftmax row = attention::softmax_row(tok.data() + h * rows, s.page_tokens, rows);
          page_lse[static_cast<std::size_t>(p) * g + h] = attention::partial_lse(row.max, row.sum);
          const float mn = row.max > total_m[h] ? row.max : total_m[h];
          total_l[h] = total_l[h] * attention::exp_shifted(total_m[h] - mn) + row.sum * attention::exp_shifted(row.max - mn);
          total_m[h] = mn;
        }
      }
      std::vector<float> mass(n, 0.0f);
      for (std::size_t h = 0; h < g; ++h) {
        const float total = attention::partial_lse(total_m[h], total_l[h]);
        for (std::size_t i = 0; i < n; ++i)
          mass[i] += attention::page_mass(page_lse[(static_cast<std::size_t>(q.first_candidate) + i) * g + h], total);
      }
      top_pages(mass, q.first_candidate, q.budget_pages, out);
    }
  }
};

using Oracle = ExactOracle<OracleRule::max_score>;
using OracleMass = ExactOracle<OracleRule::mass>;
static_assert(IndexPolicy<Oracle> && IndexPolicy<OracleMass>);

}  // namespace kvdrive::index
