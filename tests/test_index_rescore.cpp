// Token-level rescoring (index/token_keys.hpp, index/token_rescore.hpp): the 4-bit key copies
// against the keys they code, the AVX2 estimate loop against the KVD_HOST_DEVICE one, the
// estimate against a double-precision reference over the decoded keys, and the wrapper's
// selection against brute force over that reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "index_support.hpp"
#include "kvdrive/index/hierarchical.hpp"
#include "kvdrive/index/mean_key.hpp"
#include "kvdrive/index/oracle.hpp"
#include "kvdrive/index/outlier_pages.hpp"
#include "kvdrive/index/quest.hpp"
#include "kvdrive/index/token_rescore.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

using test::Stream;

/// Keys with channels of very different sizes (as real keys have), so a single scale per token
/// would lose the small channels.
Stream make_stream(int pages, int pt, int d, int group, std::uint64_t seed) {
  Stream s{pages,
           pt,
           d,
           group,
           test::random_floats(static_cast<std::size_t>(pages) * pt * d, seed),
           test::random_floats(static_cast<std::size_t>(group) * d, seed + 1)};
  for (std::size_t i = 0; i < s.keys.size(); ++i) s.keys[i] *= (i % d) % 7 == 0 ? 12.0f : 1.0f;
  return s;
}

/// Channel c of coded row t of page p (t = page_tokens: the page's mean, a byte per channel;
/// else token t's residual, a nibble).
double decoded_row(const index::TokenKeys& k, std::int64_t p, int t, int c) {
  const int d = k.head_dim(), half = d / 2, tokens = k.page_tokens();
  int code = 0;
  if (t == tokens) {
    code = index::token_mean_codes(k.row(p), tokens, d)[c] - (index::kTokenMeanCodeMax + 1);
  } else {
    const std::uint8_t byte = k.row(p)[static_cast<std::size_t>(t) * half + (c % half)];
    code = (c < half ? byte & 0xF : byte >> 4) - (index::kTokenCodeMax + 1);
  }
  return static_cast<double>(k.channel_scales()[c]) * index::token_scale(k.row(p), tokens, d, t) * code;
}

/// Key c of token t of page p as the store codes it: the coded mean plus the coded residual.
double decoded(const index::TokenKeys& k, std::int64_t p, int t, int c) { return decoded_row(k, p, k.page_tokens(), c) + decoded_row(k, p, t, c); }

/// Head h's query as fold_query codes it, decoded: q8 x unit / (channel scale x softmax scale).
double decoded_query(const index::TokenQuery& tq, const index::TokenKeys& k, int h, int c, double softmax_scale) {
  const int d = k.head_dim();
  return tq.q8[static_cast<std::size_t>(h) * d + c] * static_cast<double>(tq.scale[static_cast<std::size_t>(h)]) /
         (static_cast<double>(k.channel_scales()[c]) * softmax_scale);
}

/// Head h's estimate of page p in double precision from the decoded keys and the decoded 8-bit
/// query: log-sum-exp (or max) over the page's tokens of scale x q . k.
double reference_estimate(const Stream& s, const index::TokenKeys& k, std::int64_t p, int h, bool max_token) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  index::TokenQuery tq;
  k.fold_query(test::query_for(s, 0, 1, 1), tq);
  std::vector<double> x(static_cast<std::size_t>(s.page_tokens));
  for (int t = 0; t < s.page_tokens; ++t) {
    double dot = 0;
    for (int c = 0; c < s.d; ++c) dot += decoded_query(tq, k, h, c, scale) * decoded(k, p, t, c);
    x[static_cast<std::size_t>(t)] = dot * scale;
  }
  const double m = *std::max_element(x.begin(), x.end());
  if (max_token) return m;
  double z = 0;
  for (double v : x) z += std::exp(v - m);
  return m + std::log(z);
}

}  // namespace

TEST_CASE("TokenKeys codes every key within half a step of its channel and token scale") {
  for (int d : {8, 64, 48}) {
    CAPTURE(d);
    const Stream s = make_stream(12, 8, d, 1, 41 + static_cast<std::uint64_t>(d));
    index::TokenKeys k;
    k.append(s.range(0, 4));  // the first call fixes the channel scales
    // Later keys, twice as large as any before: their token scale grows, nothing clips.
    std::vector<float> later(s.keys.begin() + 4 * 8 * d, s.keys.end());
    for (float& x : later) x *= 2.0f;
    k.append({later.data(), 4, 8, 8, d, DType::f32});
    REQUIRE(k.pages() == 12);
    CHECK(k.pairs().size() == static_cast<std::size_t>(std::min(index::kTokenRadii, d / 2)));
    CHECK(k.bytes() == 12 * index::token_row_bytes(8, d) + static_cast<std::size_t>(d) * sizeof(float) + k.pairs().size());
    for (std::int64_t p = 0; p < 12; ++p)
      for (int t = 0; t < 8; ++t) {
        const float* key =
            p < 4 ? s.keys.data() + (static_cast<std::size_t>(p) * 8 + t) * d : later.data() + (static_cast<std::size_t>(p - 4) * 8 + t) * d;
        const double ts = index::token_scale(k.row(p), 8, d, t);
        for (int c = 0; c < d; ++c) {
          const double step = static_cast<double>(k.channel_scales()[c]) * ts;
          CHECK(std::fabs(decoded(k, p, t, c) - key[c]) <= 0.5 * step * (1 + 1e-5) + 1e-6 * (1 + std::fabs(key[c])));
        }
      }
    // Each page's mean is coded within half a step of its own scale too.
    for (std::int64_t p = 0; p < 12; ++p)
      for (int c = 0; c < d; ++c) {
        double mean = 0;
        for (int t = 0; t < 8; ++t)
          mean += p < 4 ? s.keys[(static_cast<std::size_t>(p) * 8 + t) * d + c] : later[(static_cast<std::size_t>(p - 4) * 8 + t) * d + c];
        mean /= 8;
        const double step = static_cast<double>(k.channel_scales()[c]) * index::token_scale(k.row(p), 8, d, 8);
        CHECK(std::fabs(decoded_row(k, p, 8, c) - mean) <= 0.5 * step * (1 + 1e-5) + 1e-6 * (1 + std::fabs(mean)));
      }
  }
}

TEST_CASE("token_page_estimates (AVX2 where built) equals the KVD_HOST_DEVICE estimate and a double reference") {
  for (int d : {64, 32, 48}) {
    for (int group : {1, 3, 8}) {
      for (int pt : {8, 5, 16, 12}) {
        for (bool max_token : {false, true}) {
          CAPTURE(d);
          CAPTURE(group);
          CAPTURE(pt);
          CAPTURE(max_token);
          const Stream s = make_stream(20, pt, d, group, 7 + static_cast<std::uint64_t>(d * 10 + group + pt));
          index::TokenKeys k;
          k.append(s.all());
          const auto q = test::query_for(s, 0, s.pages, 4);
          std::vector<float> est(static_cast<std::size_t>(group) * s.pages);
          index::TokenQuery tq;
          k.fold_query(q, tq);
          for (int h = 0; h < group; ++h)  // the 8-bit query is within half a unit of the folded one
            for (int c = 0; c < d; ++c) {
              const double folded = s.q[static_cast<std::size_t>(h) * d + c] * static_cast<double>(q.scale) * k.channel_scales()[c];
              CHECK(std::fabs(decoded_query(tq, k, h, c, q.scale) * q.scale * k.channel_scales()[c] - folded) <=
                    0.5 * tq.scale[static_cast<std::size_t>(h)] * (1 + 1e-5) + 1e-7);
            }
          std::vector<const std::uint8_t*> rows;
          for (std::int64_t p = 0; p < s.pages; ++p) rows.push_back(k.row(p));
          index::token_page_estimates(tq, group, rows.data(), rows.size(), pt, d, max_token, est.data(), rows.size());
          for (int h = 0; h < group; ++h)
            for (std::int64_t p = 0; p < s.pages; ++p) {
              const auto hh = static_cast<std::size_t>(h);
              const float one = index::token_page_estimate(tq.q8.data() + hh * d, tq.scale[hh], tq.sum[hh], k.row(p), pt, d, max_token);
              const float many = est[static_cast<std::size_t>(h) * s.pages + p];
              CHECK(many == doctest::Approx(one).epsilon(1e-5).scale(1.0));
              CHECK(one == doctest::Approx(reference_estimate(s, k, p, h, max_token)).epsilon(1e-4).scale(1.0));
            }
        }
      }
    }
  }
}

/// Head h's first look at page p in double precision: the decoded query . the decoded mean x the
/// softmax scale, plus 0.5 x the scale x || q[pair j] || x rho_j, rho_j from the keys themselves
/// (the largest distance of a token's pair j from the exact page mean's).
double reference_first_look(const Stream& s, const index::TokenKeys& k, std::int64_t p, int h) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  index::TokenQuery tq;
  k.fold_query(test::query_for(s, 0, 1, 1), tq);
  double dot = 0;
  for (int c = 0; c < s.d; ++c) dot += decoded_query(tq, k, h, c, scale) * decoded_row(k, p, s.page_tokens, c);
  double bonus = 0;
  for (std::uint8_t j : k.pairs()) {
    const int a = 2 * j, b = 2 * j + 1;  // adjacent pairs
    double ma = 0, mb = 0, rho = 0;
    for (int t = 0; t < s.page_tokens; ++t) {
      ma += s.keys[(static_cast<std::size_t>(p) * s.page_tokens + t) * s.d + a] / static_cast<double>(s.page_tokens);
      mb += s.keys[(static_cast<std::size_t>(p) * s.page_tokens + t) * s.d + b] / static_cast<double>(s.page_tokens);
    }
    for (int t = 0; t < s.page_tokens; ++t) {
      const double x = s.keys[(static_cast<std::size_t>(p) * s.page_tokens + t) * s.d + a] - ma;
      const double y = s.keys[(static_cast<std::size_t>(p) * s.page_tokens + t) * s.d + b] - mb;
      rho = std::max(rho, std::hypot(x, y));
    }
    bonus += 0.5 * scale * std::hypot(s.q[static_cast<std::size_t>(h) * s.d + a], s.q[static_cast<std::size_t>(h) * s.d + b]) * rho;
  }
  return dot * scale + bonus;
}

TEST_CASE("token_first_looks (AVX2 where built) equals the KVD_HOST_DEVICE first look and a double reference") {
  for (int d : {64, 128, 48}) {
    for (int group : {1, 3, 4, 7}) {
      CAPTURE(d);
      CAPTURE(group);
      const Stream s = make_stream(21, 8, d, group, 300 + static_cast<std::uint64_t>(d + group));
      index::TokenKeys k;
      k.append(s.all());
      // Each page mean is coded within half a step of its scale at 7 bits.
      for (std::int64_t p = 0; p < s.pages; ++p)
        for (int c = 0; c < d; ++c) {
          double mean = 0;
          for (int t = 0; t < 8; ++t) mean += s.keys[(static_cast<std::size_t>(p) * 8 + t) * d + c] / 8.0;
          const double step = static_cast<double>(k.channel_scales()[c]) * index::token_scale(k.row(p), 8, d, 8);
          CHECK(std::fabs(decoded_row(k, p, 8, c) - mean) <= 0.5 * step * (1 + 1e-5) + 1e-6 * (1 + std::fabs(mean)));
        }
      index::TokenQuery tq;
      k.fold_query(test::query_for(s, 0, s.pages, 4), tq);
      std::vector<const std::uint8_t*> rows;
      for (std::int64_t p = 0; p < s.pages; ++p) rows.push_back(k.row(p));
      std::vector<float> est(static_cast<std::size_t>(group) * s.pages);
      index::token_first_looks(tq, group, rows.data(), rows.size(), 8, d, est.data(), rows.size());
      for (int h = 0; h < group; ++h)
        for (std::int64_t p = 0; p < s.pages; ++p) {
          const auto hh = static_cast<std::size_t>(h);
          const float one =
              index::token_first_look(tq.q8.data() + hh * d, tq.scale[hh], tq.sum[hh], tq.pair_w.data() + hh * index::kTokenRadii, k.row(p), 8, d);
          CHECK(est[hh * s.pages + p] == doctest::Approx(one).epsilon(1e-5).scale(1.0));
          CHECK(one == doctest::Approx(reference_first_look(s, k, p, h)).epsilon(1e-4).scale(1.0));
        }
    }
  }
}

TEST_CASE("TokenRescore's own pool is the best candidates by the first look, then the budget's best by the token estimate") {
  const Stream s = make_stream(120, 8, 64, 3, 1234);
  const index::TokenRescore<index::Quest> ix{index::Quest{}, {.pool = 4, .pool_share = 0.0}};
  index::TokenRescore<index::Quest>::State st;
  ix.build(st, s.range(0, 64));
  ix.append(st, s.range(64, 56));
  for (std::int64_t budget : {2, 6, 20}) {
    CAPTURE(budget);
    const auto q = test::query_for(s, 1, 110, budget);
    std::vector<double> first(109, -INFINITY), score;
    for (int h = 0; h < 3; ++h) {
      std::vector<double> e(109);
      for (int i = 0; i < 109; ++i) e[static_cast<std::size_t>(i)] = reference_first_look(s, st.keys, 1 + i, h);
      const double mx = *std::max_element(e.begin(), e.end());
      for (std::size_t i = 0; i < e.size(); ++i) first[i] = std::max(first[i], e[i] - mx);
    }
    std::vector<std::uint32_t> pool = test::brute_top(first, 1, static_cast<int>(ix.pool_pages(q))), got;
    REQUIRE(pool.size() == static_cast<std::size_t>(std::min<std::int64_t>(4 * budget, 109)));
    score.assign(pool.size(), -INFINITY);
    for (int h = 0; h < 3; ++h) {
      std::vector<double> e(pool.size());
      for (std::size_t i = 0; i < pool.size(); ++i) e[i] = reference_estimate(s, st.keys, pool[i], h, false);
      const double mx = *std::max_element(e.begin(), e.end());
      for (std::size_t i = 0; i < pool.size(); ++i) score[i] = std::max(score[i], e[i] - mx);
    }
    std::vector<std::uint32_t> want;
    for (std::uint32_t i : test::brute_top(score, 0, static_cast<int>(budget))) want.push_back(pool[i]);
    std::sort(want.begin(), want.end());
    ix.select(st, q, got);
    CHECK(got == want);
  }
}

TEST_CASE("TokenRescore keeps the best pages of its pool by the token estimate, under either group rule, within the budget") {
  const Stream s = make_stream(64, 8, 64, 3, 99);
  for (const auto& [sum_mass, share] : {std::pair{false, 0.0}, {true, 0.0}, {false, 0.25}}) {
    CAPTURE(sum_mass);
    CAPTURE(share);
    const index::TokenRescore<index::Quest> ix{index::Quest{}, {.pool = 3, .pool_share = share, .inner_pool = true, .sum_mass = sum_mass}};
    index::TokenRescore<index::Quest>::State st;
    ix.build(st, s.range(0, 40));
    ix.append(st, s.range(40, 24));
    CHECK(ix.bytes(st) == index::Quest{}.bytes(st.inner) + st.keys.bytes());
    for (std::int64_t budget : {1, 5, 12}) {
      CAPTURE(budget);
      const auto q = test::query_for(s, 1, 60, budget);
      std::vector<std::uint32_t> pool, got;
      index::Quest{}.select(st.inner, test::query_for(s, 1, 60, ix.pool_pages(q)), pool);
      // 3 x the budget, or a share of the 59 candidates (0.25: 15 pages) when that is more.
      REQUIRE(pool.size() == static_cast<std::size_t>(std::min<std::int64_t>(std::max<std::int64_t>(3 * budget, share > 0 ? 15 : 0), 59)));
      ix.select(st, q, got);
      // Brute force over the pool on the double reference: Decision 4's rule, or each head's
      // estimated mass (normalised over the pool, page 0 and pages 60-63) summed over the group.
      std::vector<double> score(pool.size(), sum_mass ? 0.0 : -INFINITY);
      for (int h = 0; h < 3; ++h) {
        std::vector<double> e(pool.size());
        for (std::size_t i = 0; i < pool.size(); ++i) e[i] = reference_estimate(s, st.keys, pool[i], h, false);
        if (sum_mass) {
          double z = 0;
          for (double x : e) z += std::exp(x);
          for (std::int64_t p : {0, 60, 61, 62, 63}) z += std::exp(reference_estimate(s, st.keys, p, h, false));
          for (std::size_t i = 0; i < pool.size(); ++i) score[i] += std::exp(e[i]) / z;
        } else {
          const double mx = *std::max_element(e.begin(), e.end());
          for (std::size_t i = 0; i < pool.size(); ++i) score[i] = std::max(score[i], e[i] - mx);
        }
      }
      const auto order = test::brute_top(score, 0, static_cast<int>(budget));
      std::vector<std::uint32_t> want;
      for (std::uint32_t i : order) want.push_back(pool[i]);
      std::sort(want.begin(), want.end());
      CHECK(got == want);
    }
    // A pool as large as the candidates scores every candidate; a budget covering them takes all.
    std::vector<std::uint32_t> all;
    ix.select(st, test::query_for(s, 1, 60, 59), all);
    CHECK(all.size() == 59);
    CHECK_THROWS_AS(ix.check(63), Error);
  }
  CHECK_THROWS_AS(index::TokenRescore<index::Quest>(index::Quest{}, {.pool = 0.5}), Error);
  CHECK_THROWS_AS(index::TokenRescore<index::Quest>(index::Quest{}, {.pool_share = 1.5}), Error);
  CHECK_THROWS_AS(index::TokenRescore<index::Quest>(index::Quest{}, {.max_token = true, .sum_mass = true}), Error);
  CHECK_THROWS_AS(index::TokenRescore<index::Quest>(index::Quest{}, {.coarse_pool = true}), Error);
  CHECK_THROWS_AS(index::TokenRescore<index::Quest>(index::Quest{}, {.pair_weight = -1.0f}), Error);
}

TEST_CASE("Hierarchical::propose takes whole clusters, the best first, and TokenRescore rescores that pool") {
  const Stream s = make_stream(200, 8, 64, 3, 7);
  index::HierarchicalParams hp;
  hp.pages_per_cluster = 8;
  hp.score_all_below = 0;  // prune clusters at any size
  const index::Hierarchical h(hp);
  index::Hierarchical::State st;
  h.build(st, s.all());
  const auto q = test::query_for(s, 1, 190, 4);
  for (std::int64_t want : {1, 40, 95, 150}) {
    CAPTURE(want);
    std::vector<std::uint32_t> pool;
    h.propose(st, q, want, pool);
    REQUIRE(static_cast<std::int64_t>(pool.size()) >= want);
    CHECK(std::is_sorted(pool.begin(), pool.end()));
    CHECK(std::adjacent_find(pool.begin(), pool.end()) == pool.end());
    CHECK(pool.front() >= 1);
    CHECK(pool.back() < 190);
    // Whole clusters: every candidate of a pooled page's cluster is pooled, and no more than the
    // last cluster taken (at most the largest pooled one) past `want`.
    std::vector<int> in_pool(200, 0), cluster_size(st.clusters.size(), 0);
    for (std::uint32_t p : pool) in_pool[p] = 1;
    for (std::uint32_t p = 1; p < 190; ++p) ++cluster_size[index::Hierarchical::cluster_of(st, p)];
    int largest = 0;
    for (std::uint32_t p : pool) {
      const auto c = index::Hierarchical::cluster_of(st, p);
      for (std::uint32_t r = 1; r < 190; ++r)
        if (index::Hierarchical::cluster_of(st, r) == c) CHECK(in_pool[r] == 1);
      largest = std::max(largest, cluster_size[c]);
    }
    CHECK(static_cast<std::int64_t>(pool.size()) < want + largest);
  }
  // Below score_all_below candidates the proposal is select()'s best by member estimates.
  index::HierarchicalParams flat = hp;
  flat.score_all_below = 1000;
  const index::Hierarchical hf(flat);
  index::Hierarchical::State sf;
  hf.build(sf, s.all());
  std::vector<std::uint32_t> proposed, selected;
  hf.propose(sf, q, 60, proposed);
  hf.select(sf, test::query_for(s, 1, 190, 60), selected);
  CHECK(proposed == selected);
  // TokenRescore over a coarse Hierarchical keeps the budget's best of the proposal by the
  // double reference (Decision 4's rule), and the fine pool (coarse_pool off) is select()'s.
  for (bool coarse : {true, false}) {
    CAPTURE(coarse);
    const index::TokenRescore<index::Hierarchical> ix{h, {.pool = 8, .pool_share = 0.0, .inner_pool = true, .coarse_pool = coarse}};
    index::TokenRescore<index::Hierarchical>::State rs;
    ix.build(rs, s.all());
    std::vector<std::uint32_t> pool, got;
    if (coarse) h.propose(rs.inner, q, ix.pool_pages(q), pool);
    else h.select(rs.inner, test::query_for(s, 1, 190, ix.pool_pages(q)), pool);
    ix.select(rs, q, got);
    std::vector<double> score(pool.size(), -INFINITY);
    for (int hh = 0; hh < 3; ++hh) {
      std::vector<double> e(pool.size());
      for (std::size_t i = 0; i < pool.size(); ++i) e[i] = reference_estimate(s, rs.keys, pool[i], hh, false);
      const double mx = *std::max_element(e.begin(), e.end());
      for (std::size_t i = 0; i < pool.size(); ++i) score[i] = std::max(score[i], e[i] - mx);
    }
    std::vector<std::uint32_t> want;
    for (std::uint32_t i : test::brute_top(score, 0, 4)) want.push_back(pool[i]);
    std::sort(want.begin(), want.end());
    CHECK(got == want);
  }
}

TEST_CASE("TokenRescore finds the page whose attention sits on one token, which a page mean dilutes") {
  // 96 pages of small random keys; page 37 holds one token along the query and seven against
  // it, so its mean is unremarkable while its one token takes most of the attention.
  for (int trial = 0; trial < 5; ++trial) {
    CAPTURE(trial);
    Stream s = make_stream(96, 8, 64, 1, 500 + static_cast<std::uint64_t>(trial));
    for (float& x : s.keys) x *= 0.3f;
    const int needle = 37;
    for (int t = 0; t < 8; ++t)
      for (int c = 0; c < 64; ++c)
        s.keys[(static_cast<std::size_t>(needle) * 8 + t) * 64 + c] = (t == 3 ? 1.0f : -0.2f) * s.q[static_cast<std::size_t>(c)] * 1.5f;
    const auto q = test::query_for(s, 1, 90, 4);
    index::MeanKey mk;
    index::MeanKey::State ms;
    mk.build(ms, s.all());
    std::vector<std::uint32_t> by_mean, rescored, oracle;
    mk.select(ms, q, by_mean);
    const index::TokenRescore<index::MeanKey> ix{mk, {.pool = 1e9}};
    index::TokenRescore<index::MeanKey>::State st;
    ix.build(st, s.all());
    ix.select(st, q, rescored);
    index::OracleMass om;
    index::OracleMass::State os;
    om.build(os, s.all());
    om.select(os, q, oracle);
    CHECK(std::find(by_mean.begin(), by_mean.end(), needle) == by_mean.end());
    CHECK(std::find(rescored.begin(), rescored.end(), needle) != rescored.end());
    CHECK(std::find(oracle.begin(), oracle.end(), needle) != oracle.end());
  }
}

TEST_CASE("TokenRescore over Hierarchical forwards the cluster of a page and grows page by page") {
  const Stream s = make_stream(80, 8, 64, 2, 3);
  const index::TokenRescore<index::Hierarchical> ix{index::Hierarchical{index::HierarchicalParams{.pages_per_cluster = 4}}, {}};
  index::TokenRescore<index::Hierarchical>::State st;
  ix.build(st, s.range(0, 40));
  for (int p = 40; p < 80; ++p) ix.append(st, s.range(p, 1));
  CHECK(st.keys.pages() == 80);
  for (std::uint32_t p : {0u, 17u, 79u}) CHECK(ix.cluster_of(st, p) == ix.inner.cluster_of(st.inner, p));
  std::vector<std::uint32_t> got;
  ix.select(st, test::query_for(s, 1, 70, 6), got);
  CHECK(got.size() == 6);
  CHECK(std::is_sorted(got.begin(), got.end()));
  CHECK(got.front() >= 1);
  CHECK(got.back() < 70);
}

TEST_CASE("OutlierPages always selects the pages whose keys stray most from their mean, within the budget") {
  Stream s = make_stream(60, 8, 64, 2, 11);
  // Pages of near-equal keys, except pages 9, 30 and 41, each with one key opposite to the rest.
  for (int p = 0; p < 60; ++p)
    for (int t = 1; t < 8; ++t)
      for (int c = 0; c < 64; ++c) {
        float& x = s.keys[(static_cast<std::size_t>(p) * 8 + t) * 64 + c];
        x = s.keys[static_cast<std::size_t>(p) * 8 * 64 + c] + 0.05f * x;
      }
  for (int p : {9, 30, 41})
    for (int c = 0; c < 64; ++c) s.keys[(static_cast<std::size_t>(p) * 8 + 5) * 64 + c] *= -1.0f;
  index::OutlierPages<index::MeanKey> ix{index::MeanKey{}, {.share = 0.25}};
  index::OutlierPages<index::MeanKey>::State st;
  ix.build(st, s.range(0, 32));
  ix.append(st, s.range(32, 28));
  CHECK(ix.bytes(st) == index::MeanKey{}.bytes(st.inner) + 60 * sizeof(st.order[0]));
  for (int p : {9, 30, 41}) CHECK(index::outlier_score(s.all(), p) > 0.5f);
  CHECK(index::outlier_score(s.all(), 10) < 0.05f);
  // Budget 8: two outliers (floor(0.25 x 8)), the strongest candidates; MeanKey fills the rest.
  const auto q = test::query_for(s, 1, 40, 8);  // page 41 is no candidate
  std::vector<std::uint32_t> got, pinned, rest;
  ix.select(st, q, got);
  ix.outliers(st, q, pinned);
  CHECK(pinned == std::vector<std::uint32_t>{9, 30});
  CHECK(got.size() == 8);
  CHECK(std::is_sorted(got.begin(), got.end()));
  for (std::uint32_t p : pinned) CHECK(std::find(got.begin(), got.end(), p) != got.end());
  index::MeanKey{}.select(st.inner, test::query_for(s, 1, 40, 8), rest);
  for (std::uint32_t p : got)  // every page is an outlier or among MeanKey's best
    CHECK((std::find(pinned.begin(), pinned.end(), p) != pinned.end() || std::find(rest.begin(), rest.end(), p) != rest.end()));
  // share 0 is the inner index itself.
  const index::OutlierPages<index::MeanKey> off{index::MeanKey{}, {.share = 0}};
  std::vector<std::uint32_t> plain;
  off.select(st, q, plain);
  CHECK(plain == rest);
  CHECK_THROWS_AS(index::OutlierPages<index::MeanKey>(index::MeanKey{}, {.share = 1}), Error);
}
