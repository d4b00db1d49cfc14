// index::TokenRescore<Inner>: a page index wrapped by a token-level second look (after RocketKV
// and Twilight, whose second stage scores a candidate pool's keys token by token; Twilight on
// INT4 keys). A first look picks a pool of `pool` x budget pages (at least `pool_share` of the
// candidates); then every pooled page is scored from 4-bit copies of its keys (index::TokenKeys),
// token by token, and the budget's best pages by the GQA rule (Decision 4) are kept. The first
// look is the key copies' own by default (every candidate's page mean at 7 bits plus two
// rotary-pair radii: Hierarchical's member estimate, flat and in integers), or the inner index's
// selection (`inner_pool`). The inner index also lays out the SSD (cluster_of).
//
// Why: a page summary (a mean, a min/max box) dilutes a page whose attention sits on one token,
// which is what the real model's retrieval heads do (docs/indices.md, "Token-level rescoring").
// A page's token estimate is the log-sum-exp of its tokens' estimated q.k x scale: the log of its
// attention mass up to the softmax's normaliser, what OracleMass ranks by; `max_token` ranks by
// the best token instead.
//
// The coded keys are the index's own state (bytes() counts them), so selection never reads a
// tier and cannot depend on where pages live (Decisions 2 and 7). A step costs one coded mean per
// candidate (or the inner index's selection at pool x budget), plus pool pages x page_tokens
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
#include "kvdrive/index/pair_radii.hpp"
#include "kvdrive/index/selection.hpp"
#include "kvdrive/index/token_keys.hpp"

namespace kvdrive::index {

struct TokenRescoreParams {
  double pool = 8.0;        ///< the first look (or the inner index) proposes pool x budget pages (all candidates when that is more)
  double pool_share = 0.5;  ///< and at least this share of the candidates (a small budget's pool stays wide)
  /// Take the pool from the inner index's selection (true) rather than from the key copies' own
  /// first look (false): the same pages on real attention at several times the cost
  /// (docs/indices.md, "What it costs").
  bool inner_pool = false;
  /// With inner_pool, take the pool from the inner index's coarse proposal where it has one
  /// (Hierarchical: its best whole clusters, no member scored): faster, but on real attention it
  /// drops pages that the member ranking pools, so off by default.
  bool coarse_pool = false;
  float pair_weight = 0.5f;                    ///< the first look's weight of the radii (Hierarchical's pair_weight)
  RotaryPairs rotary = RotaryPairs::adjacent;  ///< how RoPE pairs the keys' channels (the radii's pairs)
  bool max_token = false;                      ///< rank a page by its best token (true) or by its tokens' log-sum-exp (false)
  /// How the group's heads combine: false, Decision 4's rule (the max over heads of each head's
  /// estimate less its largest); true, OracleMass's rule on the estimates: a page's estimated
  /// attention mass summed over the heads, each head's normalised over the pages it attends for
  /// sure (sink, the sealed local pages) and the pool (log-sum-exp estimates only).
  bool sum_mass = false;

  void validate() const {
    KVD_EXPECT(pool >= 1.0 && std::isfinite(pool), "TokenRescore: pool is {}, expected a finite factor >= 1 of the budget", pool);
    KVD_EXPECT(pool_share >= 0.0 && pool_share <= 1.0, "TokenRescore: pool_share is {}, expected a share of the candidates in [0, 1]", pool_share);
    KVD_EXPECT(!(sum_mass && max_token), "TokenRescore: sum_mass needs log-sum-exp estimates (max_token off)");
    KVD_EXPECT(pair_weight >= 0.0f && std::isfinite(pair_weight), "TokenRescore: pair_weight is {}, expected a finite value >= 0", pair_weight);
    KVD_EXPECT(!coarse_pool || inner_pool, "TokenRescore: coarse_pool is the inner index's proposal (set inner_pool)");
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
    s.keys.append(k, params.rotary);
  }
  void append(State& s, const PageKeys& k) const {
    inner.append(s.inner, k);
    s.keys.append(k, params.rotary);
  }
  std::size_t bytes(const State& s) const { return inner.bytes(s.inner) + s.keys.bytes(); }

  /// The inner index's cluster of a page (for the SSD layout that stores a cluster together).
  std::uint32_t cluster_of(const State& s, std::uint32_t page) const requires requires(const Inner& i, const typename Inner::State& st) {
    i.cluster_of(st, page);
  }
  { return inner.cluster_of(s.inner, page); }

  /// How many pages the inner index proposes for a query: pool x budget or pool_share x the
  /// candidates, the more of the two, within [budget, candidates].
  std::int64_t pool_pages(const IndexQuery& q) const {
    const auto n = q.candidates();
    const double want = std::max(std::ceil(params.pool * static_cast<double>(q.budget_pages)), std::ceil(params.pool_share * static_cast<double>(n)));
    return want >= static_cast<double>(n) ? n : std::max<std::int64_t>(q.budget_pages, static_cast<std::int64_t>(want));
  }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    if (select_all_within_budget(q, out)) return;
    thread_local std::vector<std::uint32_t> pool;
    thread_local std::vector<float> pool_means;
    thread_local TokenQuery tq;
    pool.clear();
    pool_means.clear();
    s.keys.fold_query(q, tq, params.pair_weight);
    const std::int64_t want = pool_pages(q);
    if (want >= q.candidates()) {
      for (std::int64_t p = q.first_candidate; p < q.end_candidate; ++p) pool.push_back(static_cast<std::uint32_t>(p));
    } else if (!params.inner_pool) {
      first_look_pool(s.keys, q, tq, want, pool, pool_means);
    } else if constexpr (requires { inner.propose(s.inner, q, want, pool); }) {
      if (params.coarse_pool) inner.propose(s.inner, q, want, pool);
      else select_pool(s, q, want, pool);
    } else {
      select_pool(s, q, want, pool);
    }
    rescore(s.keys, q, tq, pool, pool_means.empty() ? nullptr : pool_means.data(), out);
  }

  /// The inner index's best `want` pages for q.
  void select_pool(const State& s, const IndexQuery& q, std::int64_t want, std::vector<std::uint32_t>& pool) const {
    IndexQuery wide = q;
    wide.budget_pages = want;
    inner.select(s.inner, wide, pool);
  }

  /// The best `want` candidates by the key copies' first look (GQA rule), ascending, and their
  /// means' scores [group][pool] (what the second look adds its tokens' residuals to).
  static void first_look_pool(const TokenKeys& keys, const IndexQuery& q, const TokenQuery& tq, std::int64_t want, std::vector<std::uint32_t>& pool,
                              std::vector<float>& pool_means) {
    const auto n = static_cast<std::size_t>(q.candidates());
    thread_local std::vector<const std::uint8_t*> rows;
    thread_local std::vector<float> est, mean, score;
    rows.resize(n);
    for (std::size_t i = 0; i < n; ++i) rows[i] = keys.row(q.first_candidate + static_cast<std::int64_t>(i));
    est.resize(static_cast<std::size_t>(q.group) * n);
    mean.resize(est.size());
    score.resize(n);
    token_first_looks(tq, q.group, rows.data(), n, keys.page_tokens(), keys.head_dim(), est.data(), n, mean.data());
    gqa_scores(est.data(), q.group, n, score.data());
    top_pages(score, q.first_candidate, want, pool);
    pool_means.resize(static_cast<std::size_t>(q.group) * pool.size());
    for (int h = 0; h < q.group; ++h)
      for (std::size_t i = 0; i < pool.size(); ++i)
        pool_means[static_cast<std::size_t>(h) * pool.size() + i] =
            mean[static_cast<std::size_t>(h) * n + static_cast<std::size_t>(pool[i] - static_cast<std::uint32_t>(q.first_candidate))];
  }

  /// The budget's best pages of `pool` by their token estimates (GQA rule), appended ascending;
  /// means [group][pool] are the pool's means' scores where the first look gave them.
  void rescore(const TokenKeys& keys, const IndexQuery& q, const TokenQuery& tq, std::span<const std::uint32_t> pool, const float* means,
               std::vector<std::uint32_t>& out) const {
    const std::size_t n = pool.size();
    thread_local std::vector<float> est, score;
    thread_local std::vector<const std::uint8_t*> rows;
    rows.resize(n);
    for (std::size_t i = 0; i < n; ++i) rows[i] = keys.row(pool[i]);
    est.resize(static_cast<std::size_t>(q.group) * n);
    score.resize(n);
    token_page_estimates(tq, q.group, rows.data(), n, keys.page_tokens(), keys.head_dim(), params.max_token, est.data(), n, means);
    if (params.sum_mass) summed_mass(keys, q, tq, est.data(), n, score.data());
    else gqa_scores(est.data(), q.group, n, score.data());
    top_pages_of(score, pool, q.budget_pages, out);
  }

  /// score[i] = log sum_h exp(est[h][i] - z_h), z_h the log-sum-exp of head h's estimates over
  /// the pool and the sealed pages that are no candidates (sink, local).
  static void summed_mass(const TokenKeys& keys, const IndexQuery& q, const TokenQuery& tq, const float* est, std::size_t n, float* score) {
    thread_local std::vector<const std::uint8_t*> rows;
    thread_local std::vector<float> fixed;
    rows.clear();
    for (std::int64_t p = 0; p < keys.pages(); ++p)
      if (p < q.first_candidate || p >= q.end_candidate) rows.push_back(keys.row(p));
    fixed.resize(static_cast<std::size_t>(q.group) * rows.size());
    token_page_estimates(tq, q.group, rows.data(), rows.size(), keys.page_tokens(), keys.head_dim(), false, fixed.data(), rows.size());
    for (std::size_t i = 0; i < n; ++i) score[i] = -INFINITY;
    for (int h = 0; h < q.group; ++h) {
      const float* e = est + static_cast<std::size_t>(h) * n;
      const float* f = fixed.data() + static_cast<std::size_t>(h) * rows.size();
      float m = -INFINITY;
      for (std::size_t i = 0; i < n; ++i) m = std::max(m, e[i]);
      for (std::size_t j = 0; j < rows.size(); ++j) m = std::max(m, f[j]);
      double total = 0;
      for (std::size_t i = 0; i < n; ++i) total += std::exp(static_cast<double>(e[i] - m));
      for (std::size_t j = 0; j < rows.size(); ++j) total += std::exp(static_cast<double>(f[j] - m));
      const float z = m + static_cast<float>(std::log(total));
      for (std::size_t i = 0; i < n; ++i) {  // log(exp(a) + exp(b)), the larger first
        const float a = score[i], b = e[i] - z, hi = std::max(a, b), lo = std::min(a, b);
        score[i] = hi == -INFINITY ? hi : hi + std::log1p(std::exp(lo - hi));
      }
    }
  }
};
static_assert(IndexPolicy<TokenRescore<MeanKey>>);

}  // namespace kvdrive::index
