// index::TokenRescore<Inner>: a page index wrapped by a token-level second look (after RocketKV
// and Twilight, whose second stage scores a candidate pool's keys token by token; Twilight on
// INT4 keys). The inner index picks a pool of `pool` x budget pages by its own page estimate;
// then every pooled page is scored from 4-bit copies of its keys (index::TokenKeys), token by
// token, and the budget's best pages by the GQA rule (Decision 4) are kept.
//
// Why: a page summary (a mean, a min/max box) dilutes a page whose attention sits on one token,
// which is what the real model's retrieval heads do (docs/indices.md, "Token-level rescoring").
// A page's token estimate is the log-sum-exp of its tokens' estimated q.k x scale: the log of its
// attention mass up to the softmax's normaliser, what OracleMass ranks by; `max_token` ranks by
// the best token instead.
//
// The coded keys are the index's own state (bytes() counts them), so selection never reads a
// tier and cannot depend on where pages live (Decisions 2 and 7). The pool is the inner index's
// selection, so its cost is the inner index's at pool x budget, plus pool pages x page_tokens
// token dots.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/mean_key.hpp"
#include "kvdrive/index/selection.hpp"
#include "kvdrive/index/token_keys.hpp"

namespace kvdrive::index {

struct TokenRescoreParams {
  double pool = 4.0;       ///< the inner index proposes pool x budget pages (all candidates when that is more)
  bool max_token = false;  ///< rank a page by its best token (true) or by its tokens' log-sum-exp (false)

  void validate() const {
    KVD_EXPECT(pool >= 1.0 && std::isfinite(pool), "TokenRescore: pool is {}, expected a finite factor >= 1 of the budget", pool);
  }
};

template <IndexPolicy Inner>
struct TokenRescore {
  using InnerIndex = Inner;
  using Params = TokenRescoreParams;

  struct State {
    typename Inner::State inner;
    TokenKeys keys;
  };

  Inner inner;
  Params params;

  TokenRescore() = default;
  explicit TokenRescore(Inner i, const Params& p = {}) : inner(std::move(i)), params(p) { params.validate(); }

  static std::string_view name() {
    static const std::string n = "rescored-" + std::string(Inner::name());
    return n;
  }

  void check(int head_dim) const {
    KVD_EXPECT(head_dim >= 2 && head_dim % 2 == 0, "TokenRescore: head_dim {} must be even (two 4-bit codes to a byte)", head_dim);
    check_for_head_dim(inner, head_dim);
  }

  void build(State& s, const PageKeys& k) const {
    inner.build(s.inner, k);
    s.keys.append(k);
  }
  void append(State& s, const PageKeys& k) const {
    inner.append(s.inner, k);
    s.keys.append(k);
  }
  std::size_t bytes(const State& s) const { return inner.bytes(s.inner) + s.keys.bytes(); }

  /// The inner index's cluster of a page (for the SSD layout that stores a cluster together).
  std::uint32_t cluster_of(const State& s, std::uint32_t page) const
    requires requires(const Inner& i, const typename Inner::State& st) { i.cluster_of(st, page); }
  {
    return inner.cluster_of(s.inner, page);
  }

  /// How many pages the inner index proposes for a query: pool x budget, within [budget, candidates].
  std::int64_t pool_pages(const IndexQuery& q) const {
    const double want = std::ceil(params.pool * static_cast<double>(q.budget_pages));
    const auto n = q.candidates();
    return want >= static_cast<double>(n) ? n : std::max<std::int64_t>(q.budget_pages, static_cast<std::int64_t>(want));
  }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    if (select_all_within_budget(q, out)) return;
    thread_local std::vector<std::uint32_t> pool;
    pool.clear();
    const std::int64_t want = pool_pages(q);
    if (want >= q.candidates()) {
      for (std::int64_t p = q.first_candidate; p < q.end_candidate; ++p) pool.push_back(static_cast<std::uint32_t>(p));
    } else {
      IndexQuery wide = q;
      wide.budget_pages = want;
      inner.select(s.inner, wide, pool);
    }
    rescore(s.keys, q, pool, out);
  }

  /// The budget's best pages of `pool` by their token estimates (GQA rule), appended ascending.
  void rescore(const TokenKeys& keys, const IndexQuery& q, std::span<const std::uint32_t> pool, std::vector<std::uint32_t>& out) const {
    const std::size_t n = pool.size();
    thread_local std::vector<float> qs, est, score;
    thread_local std::vector<const std::uint8_t*> rows;
    qs.resize(static_cast<std::size_t>(q.group) * q.head_dim);
    keys.fold_query(q, qs.data());
    rows.resize(n);
    for (std::size_t i = 0; i < n; ++i) rows[i] = keys.row(pool[i]);
    est.resize(static_cast<std::size_t>(q.group) * n);
    score.resize(n);
    token_page_estimates(qs.data(), q.group, rows.data(), n, keys.page_tokens(), keys.head_dim(), params.max_token, est.data(), n);
    gqa_scores(est.data(), q.group, n, score.data());
    top_pages_of(score, pool, q.budget_pages, out);
  }
};
static_assert(IndexPolicy<TokenRescore<MeanKey>>);

}  // namespace kvdrive::index
