// Index policies: selection helpers, Dense, and the two oracles against brute force.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "kvdrive/research.hpp"
#include "index_support.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

using test::brute_top;
using test::dot;
using test::mean_mass_recall;
using test::query_for;
using test::Stream;

Stream make_stream(int pages, int pt, int d, int group, std::uint64_t seed) {
  Stream s{pages,
           pt,
           d,
           group,
           test::random_floats(static_cast<std::size_t>(pages) * pt * d, seed),
           test::random_floats(static_cast<std::size_t>(group) * d, seed + 1)};
  return s;
}

}  // namespace

TEST_CASE("kth_largest is the k-th of the rank keys sorted, at every k") {
  std::mt19937 rng(23);
  const float specials[] = {0.0f, -0.0f, NAN, -INFINITY, INFINITY, 1e-40f, -1e-40f, 3.0e38f};
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f);
  for (int round = 0; round < 124; ++round) {
    const std::size_t sizes[] = {7919, 8192, 12000, 16384};  // as many candidates as 64K-128K contexts have
    const std::size_t n = round >= 120 ? sizes[round - 120] : 1 + rng() % (round < 60 ? 64 : 5000);
    std::vector<float> score(n);
    for (float& x : score) {
      const auto pick = static_cast<unsigned>(rng() % 10);
      x = pick < 2 ? specials[rng() % 8] : pick < 5 ? static_cast<float>(static_cast<int>(rng() % 9) - 4) / 8.0f : std::exp(wide(rng)) - 1.0f;
    }
    std::vector<float> sorted(n);
    std::transform(score.begin(), score.end(), sorted.begin(), [](float x) { return std::isnan(x) ? -INFINITY : x; });
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (std::size_t k = 1; k <= n; k += 1 + rng() % (1 + n / 16)) {
      const float got = index::detail::kth_largest(score, k);
      CHECK_MESSAGE(got == sorted[k - 1], "n = " << n << ", k = " << k);
    }
  }
}

TEST_CASE("score_order keeps the order of scores and score_of_order inverts it") {
  const float scores[] = {-INFINITY, -3.0e38f, -2.5f, -1e-40f, -0.0f, 0.0f, 1e-40f, 1.0f, 2.5f, 3.0e38f, INFINITY};
  for (std::size_t i = 0; i < std::size(scores); ++i) {
    CHECK(index::score_of_order(index::score_order(scores[i])) == scores[i]);
    if (i > 0) CHECK((index::score_order(scores[i - 1]) < index::score_order(scores[i])) == (scores[i - 1] < scores[i]));
  }
  CHECK(index::score_order(-0.0f) == index::score_order(0.0f));
  CHECK(index::score_order(NAN) == index::score_order(-INFINITY));
}

TEST_CASE("selection_key: the k largest keys are top_pages' choice, ties, NaN and signed zeros included") {
  std::mt19937 rng(17);
  const float specials[] = {0.0f, -0.0f, NAN, -INFINITY, INFINITY, 1.5f, -1.5f};
  for (int round = 0; round < 200; ++round) {
    const std::size_t n = 1 + rng() % 300;
    std::vector<float> score(n);
    for (float& x : score) {
      const auto pick = static_cast<unsigned>(rng() % 10);
      x = pick < 4 ? specials[rng() % 7] : static_cast<float>(static_cast<int>(rng() % 21) - 10) / 4.0f;  // many ties
    }
    const std::int64_t k = static_cast<std::int64_t>(rng() % (n + 2));
    std::vector<std::uint32_t> want;
    index::top_pages(score, 100, k, want);
    std::vector<std::uint64_t> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = index::selection_key(score[i], static_cast<std::uint32_t>(i));
    std::vector<std::uint64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // unique
    std::vector<std::uint32_t> got;
    for (std::size_t r = 0; r < std::min<std::size_t>(static_cast<std::size_t>(k), n); ++r)
      got.push_back(100 + (0xFFFFFFFFu - static_cast<std::uint32_t>(sorted[r])));
    std::sort(got.begin(), got.end());
    CHECK(got == want);
  }
}

TEST_CASE("radix_threshold: the key where the weights of the largest keys reach the target, as a sort finds it") {
  std::mt19937_64 rng(23);
  for (int round = 0; round < 300; ++round) {
    const std::size_t n = 1 + rng() % 500;
    std::vector<std::uint64_t> keys(n);
    std::vector<unsigned> weight(n);
    for (std::size_t i = 0; i < n; ++i) {
      // Scores with many equal high bits (ties broken by the index), as selection_key makes them.
      keys[i] = index::selection_key(static_cast<float>(static_cast<int>(rng() % 40)) / 8.0f, static_cast<std::uint32_t>(i));
      weight[i] = round % 2 ? 1 : static_cast<unsigned>(rng() % 20);
    }
    unsigned long long total = 0;
    for (unsigned w : weight) total += w;
    const unsigned long long target = 1 + rng() % (total + 5);
    const std::uint64_t got = index::radix_threshold(keys, weight, target);
    // By sorting: walk the keys from the largest until the weight reaches the target.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return keys[a] > keys[b]; });
    std::uint64_t want = 0;
    unsigned long long sum = 0;
    for (std::size_t i : order) {
      sum += weight[i];
      if (sum >= target) {
        want = keys[i];
        break;
      }
    }
    CAPTURE(round);
    CHECK(got == want);
  }
}

TEST_CASE("flatten: a Hierarchical state as the GPU reads it, every member once, with its cluster, page and mean") {
  const int d = 16, pt = 4, pages = 300;
  const auto keys = test::random_floats(static_cast<std::size_t>(pages) * pt * d, 31);
  index::Hierarchical h;
  index::Hierarchical::State st;
  h.build(st, index::PageKeys{keys.data(), 0, pages, pt, d, DType::f16});
  const index::HierarchicalFlat f = index::flatten(st);
  REQUIRE(f.clusters() == static_cast<std::int64_t>(index::Hierarchical::clusters(st)));
  CHECK(f.members() == pages);
  CHECK(f.dtype == DType::f16);
  CHECK(f.member_offsets.size() == static_cast<std::size_t>(f.clusters()) + 1);
  CHECK(f.centroids.size() == static_cast<std::size_t>(f.clusters()) * d * sizeof(half));
  CHECK(f.member_means.size() == static_cast<std::size_t>(pages) * d * sizeof(half));
  std::vector<int> seen(pages, 0);
  for (std::int64_t c = 0; c < f.clusters(); ++c)
    for (std::int64_t m = f.member_offsets[static_cast<std::size_t>(c)]; m < f.member_offsets[static_cast<std::size_t>(c) + 1]; ++m) {
      const std::uint32_t page = f.member_pages[static_cast<std::size_t>(m)];
      CHECK(f.member_cluster[static_cast<std::size_t>(m)] == c);
      CHECK(index::Hierarchical::cluster_of(st, page) == c);
      if (m > f.member_offsets[static_cast<std::size_t>(c)]) CHECK(page > f.member_pages[static_cast<std::size_t>(m) - 1]);
      ++seen[page];
    }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // A member's mean is its page's mean as the index stores it (the keys' mean, rounded to f16).
  for (std::int64_t m : {std::int64_t{0}, std::int64_t{123}, std::int64_t{299}}) {
    const std::uint32_t page = f.member_pages[static_cast<std::size_t>(m)];
    for (int j = 0; j < d; ++j) {
      double mean = 0;
      for (int t = 0; t < pt; ++t) mean += keys[(static_cast<std::size_t>(page) * pt + t) * d + j];
      half stored;
      std::memcpy(&stored, f.member_means.data() + (static_cast<std::size_t>(m) * d + j) * sizeof(half), sizeof(half));
      CHECK(to_float(stored) == doctest::Approx(mean / pt).epsilon(2e-3));
    }
  }
}

TEST_CASE("top_pages: best scores, ties to the lower page, ascending, NaN last") {
  std::vector<std::uint32_t> out;
  const std::vector<float> s{0.5f, 2.0f, 2.0f, NAN, 1.0f, 2.0f};
  index::top_pages(s, 10, 2, out);
  CHECK(out == std::vector<std::uint32_t>{11, 12});
  out.clear();
  index::top_pages(s, 0, 5, out);
  CHECK(out == std::vector<std::uint32_t>{0, 1, 2, 4, 5});
  out.clear();
  index::top_pages(s, 0, 99, out);
  CHECK(out.size() == 6);
}

TEST_CASE("order_by_score: best first, ties to the lower index, NaN last, -0 as +0, as a stable sort orders them") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    // Few distinct values, so ties are common; NaN, infinities and both zeros among them.
    const std::vector<float> values{1.0f, -1.0f, 0.0f, -0.0f, NAN, INFINITY, -INFINITY, 2.5f};
    std::vector<float> s(1 + rng() % 40);
    for (float& x : s) x = values[rng() % values.size()];
    std::vector<std::uint32_t> order;
    index::order_by_score(s, order);
    std::vector<std::uint32_t> expect(s.size());
    std::iota(expect.begin(), expect.end(), 0u);
    const auto key = [&](std::uint32_t i) { return std::isnan(s[i]) ? -INFINITY : s[i]; };
    std::stable_sort(expect.begin(), expect.end(), [&](std::uint32_t a, std::uint32_t b) { return key(a) > key(b); });
    REQUIRE(order == expect);
  }
}

TEST_CASE("gqa_scores: max over heads of the estimate minus that head's max") {
  // Two heads, three pages. Head 0 prefers page 0, head 1 page 2 by a larger margin.
  const std::vector<float> est{5.0f,  1.0f,  0.0f,    // head 0
                               -9.0f, -8.0f, 10.0f};  // head 1
  std::vector<float> out(3);
  index::gqa_scores(est.data(), 2, 3, out.data());
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == -4.0f);  // max(1-5, -8-10)
  CHECK(out[2] == 0.0f);
}

TEST_CASE("gqa_scores over many pages (eight lanes at a time where built) equals gqa_page_score, NaN and infinities included") {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (std::size_t n : {1u, 7u, 8u, 37u, 64u}) {
    for (int group : {1, 3}) {
      std::vector<float> est(static_cast<std::size_t>(group) * n);
      for (float& x : est) x = dist(rng);
      for (std::size_t i = 0; i < est.size(); i += 5) est[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? -INFINITY : est[i];
      std::vector<float> out(n), head_max(static_cast<std::size_t>(group), -INFINITY);
      for (int h = 0; h < group; ++h)
        for (std::size_t p = 0; p < n; ++p) {
          const float e = est[static_cast<std::size_t>(h) * n + p];
          head_max[static_cast<std::size_t>(h)] = e > head_max[static_cast<std::size_t>(h)] ? e : head_max[static_cast<std::size_t>(h)];
        }
      index::gqa_scores(est.data(), group, n, out.data());
      for (std::size_t p = 0; p < n; ++p) {
        const float want = index::gqa_page_score(est.data() + p, head_max.data(), group, n);
        CHECK((out[p] == want || (std::isnan(out[p]) && std::isnan(want))));
      }
    }
  }
}

TEST_CASE("Dense selects every candidate, whatever the budget") {
  const Stream s = make_stream(20, 4, 32, 2, 1);
  index::Dense dense;
  index::Dense::State st;
  dense.build(st, s.page_keys());
  std::vector<std::uint32_t> out;
  dense.select(st, query_for(s, 3, 17, 2), out);
  CHECK(out.size() == 14);
  CHECK(out.front() == 3);
  CHECK(out.back() == 16);
  CHECK(dense.bytes(st) == 0);
}

TEST_CASE("Oracle picks the true top pages by the GQA rule on max q.k") {
  for (int group : {1, 4, 8})
    for (int trial = 0; trial < 5 * test::scale(); ++trial) {
      const int pages = 30 + trial * 7, pt = 1 + trial % 8, d = 64;
      const Stream s = make_stream(pages, pt, d, group, 1000 + static_cast<std::uint64_t>(trial) * 10 + group);
      const int first = 2, end = pages - 3, budget = 1 + (end - first) / 5;
      // Independent expectation in double precision.
      std::vector<double> head_max(group, -INFINITY);
      std::vector<std::vector<double>> est(group, std::vector<double>(end - first));
      for (int h = 0; h < group; ++h)
        for (int p = first; p < end; ++p) {
          double best = -INFINITY;
          for (int t = 0; t < pt; ++t) best = std::max(best, dot(s.q.data() + h * d, s.keys.data() + static_cast<std::size_t>(p * pt + t) * d, d));
          est[h][p - first] = best;
          head_max[h] = std::max(head_max[h], best);
        }
      std::vector<double> score(end - first, -INFINITY);
      for (int h = 0; h < group; ++h)
        for (int i = 0; i < end - first; ++i) score[i] = std::max(score[i], est[h][i] - head_max[h]);

      index::Oracle oracle;
      index::Oracle::State st;
      // Built in two parts: prefill, then pages appended one by one as decode seals them.
      oracle.build(st, {s.keys.data(), 0, pages - 5, pt, d});
      for (int p = pages - 5; p < pages; ++p) oracle.append(st, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d});
      std::vector<std::uint32_t> got;
      oracle.select(st, query_for(s, first, end, budget), got);
      CHECK(got == brute_top(score, first, budget));
      CHECK(oracle.bytes(st) == s.keys.size() * sizeof(float));
    }
}

TEST_CASE("OracleMass picks the pages of largest summed attention mass; none beats its recall") {
  std::mt19937 rng(5);
  for (int group : {1, 4})
    for (int trial = 0; trial < 4 * test::scale(); ++trial) {
      const int pages = 24, pt = 4, d = 32, first = 1, end = 22, budget = 5;
      const Stream s = make_stream(pages, pt, d, group, 2000 + static_cast<std::uint64_t>(trial) * 10 + group);
      index::OracleMass oracle;
      index::OracleMass::State st;
      oracle.build(st, s.page_keys());
      std::vector<std::uint32_t> got;
      oracle.select(st, query_for(s, first, end, budget), got);
      REQUIRE(got.size() == static_cast<std::size_t>(budget));
      // Brute force: the mass of each page summed over heads, in double.
      std::vector<double> mass(end - first, 0.0);
      for (int i = 0; i < end - first; ++i) mass[i] = mean_mass_recall(s, {static_cast<std::uint32_t>(first + i)});
      CHECK(got == brute_top(mass, first, budget));
      // No random selection of the same size does better.
      const double best = mean_mass_recall(s, got);
      for (int r = 0; r < 50; ++r) {
        std::vector<std::uint32_t> all(end - first);
        std::iota(all.begin(), all.end(), static_cast<std::uint32_t>(first));
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(budget);
        CHECK(mean_mass_recall(s, all) <= best + 1e-9);
      }
    }
}

TEST_CASE("Quest: the bound is never below the true max q.k, and it ranks like brute force") {
  for (int group : {1, 4})
    for (int trial = 0; trial < 4 * test::scale(); ++trial) {
      const int pages = 40, pt = 8, d = 64;
      const Stream s = make_stream(pages, pt, d, group, 3000 + static_cast<std::uint64_t>(trial) * 10 + group);
      index::Quest quest;
      index::Quest::State st;
      quest.build(st, {s.keys.data(), 0, 30, pt, d});
      for (int p = 30; p < pages; ++p) quest.append(st, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d});
      CHECK(quest.bytes(st) == static_cast<std::size_t>(pages) * 2 * d * sizeof(float));
      // Independent expectation: bounds from the keys, scores in double, the GQA rule, top-k.
      std::vector<std::vector<double>> est(group, std::vector<double>(pages));
      for (int h = 0; h < group; ++h)
        for (int p = 0; p < pages; ++p) {
          double bound = 0, true_max = -INFINITY;
          for (int i = 0; i < d; ++i) {
            double lo = INFINITY, hi = -INFINITY;
            for (int t = 0; t < pt; ++t) {
              const double x = s.keys[(static_cast<std::size_t>(p) * pt + t) * d + i];
              lo = std::min(lo, x);
              hi = std::max(hi, x);
            }
            const double qi = s.q[static_cast<std::size_t>(h) * d + i];
            bound += std::max(qi * lo, qi * hi);
          }
          for (int t = 0; t < pt; ++t)
            true_max = std::max(true_max, dot(s.q.data() + h * d, s.keys.data() + (static_cast<std::size_t>(p) * pt + t) * d, d));
          CHECK(bound >= true_max - 1e-4);
          CHECK(index::quest_page_score(s.q.data() + h * d, st.lo.row<float>(p), st.hi.row<float>(p), d) == doctest::Approx(bound).epsilon(1e-5));
          est[h][p] = bound;
        }
      const int first = 1, end = pages - 2, budget = 6;
      std::vector<double> score(end - first);
      // Candidates exclude the first and last pages; head maxima over the candidates only.
      std::vector<double> cand_max(group, -INFINITY);
      for (int h = 0; h < group; ++h)
        for (int i = first; i < end; ++i) cand_max[h] = std::max(cand_max[h], est[h][i]);
      for (int i = 0; i < end - first; ++i) {
        score[i] = -INFINITY;
        for (int h = 0; h < group; ++h) score[i] = std::max(score[i], est[h][first + i] - cand_max[h]);
      }
      std::vector<std::uint32_t> got;
      quest.select(st, query_for(s, first, end, budget), got);
      CHECK(got == brute_top(score, first, budget));
    }
}

TEST_CASE("MeanKey ranks pages by q . mean key under the GQA rule, like brute force") {
  for (int group : {1, 4})
    for (int trial = 0; trial < 4 * test::scale(); ++trial) {
      const int pages = 40, pt = 8, d = 64, first = 2, end = 37, budget = 7;
      const Stream s = make_stream(pages, pt, d, group, 4000 + static_cast<std::uint64_t>(trial) * 10 + group);
      index::MeanKey mk;
      index::MeanKey::State st;
      mk.build(st, {s.keys.data(), 0, 25, pt, d});
      for (int p = 25; p < pages; ++p) mk.append(st, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d});
      CHECK(mk.bytes(st) == static_cast<std::size_t>(pages) * d * sizeof(float));
      std::vector<std::vector<double>> est(group, std::vector<double>(pages));
      std::vector<double> cand_max(group, -INFINITY);
      for (int h = 0; h < group; ++h)
        for (int p = first; p < end; ++p) {
          double e = 0;
          for (int i = 0; i < d; ++i) {
            double mean = 0;
            for (int t = 0; t < pt; ++t) mean += s.keys[(static_cast<std::size_t>(p) * pt + t) * d + i];
            e += s.q[static_cast<std::size_t>(h) * d + i] * mean / pt;
          }
          est[h][p] = e;
          cand_max[h] = std::max(cand_max[h], e);
        }
      std::vector<double> score(end - first, -INFINITY);
      for (int h = 0; h < group; ++h)
        for (int i = 0; i < end - first; ++i) score[i] = std::max(score[i], est[h][first + i] - cand_max[h]);
      std::vector<std::uint32_t> got;
      mk.select(st, query_for(s, first, end, budget), got);
      CHECK(got == brute_top(score, first, budget));
    }
}

TEST_CASE("metrics: top-k recall, mass recall (mean and min over heads), relative error") {
  CHECK(eval::topk_recall(std::vector<std::uint32_t>{1, 4, 9}, std::vector<std::uint32_t>{9, 2, 1, 7}) == 0.5);
  CHECK(eval::topk_recall(std::vector<std::uint32_t>{}, std::vector<std::uint32_t>{}) == 1.0);
  CHECK(eval::relative_error(std::vector<float>{3, 4}, std::vector<float>{0, 4}) == doctest::Approx(0.75));

  // Mass recall from dense attention's per-page log-sum-exp, against softmax sums in double.
  const int pages = 12, pt = 4, d = 32, group = 3;
  const Stream s = make_stream(pages, pt, d, group, 77);
  std::vector<float> values(s.keys.size(), 0.0f);
  std::vector<attention::PageRef> refs;
  for (int p = 0; p < pages; ++p)
    refs.push_back({s.keys.data() + static_cast<std::size_t>(p) * pt * d, values.data() + static_cast<std::size_t>(p) * pt * d, pt});
  std::vector<float> out(static_cast<std::size_t>(group) * d), lse(group), page_lse(static_cast<std::size_t>(pages) * group);
  attention::DecodeArgs a;
  a.q = s.q.data();
  a.group = group;
  a.head_dim = d;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.pages = refs;
  a.out = out.data();
  a.lse = lse.data();
  a.page_lse = page_lse.data();
  attention::sparse_decode<float>(a);
  const std::vector<std::uint32_t> attended{0, 3, 4, 11};
  std::vector<double> per_head;
  for (int h = 0; h < group; ++h) {
    std::vector<double> w(static_cast<std::size_t>(pages) * pt);
    double m = -INFINITY, z = 0, in = 0;
    for (std::size_t t = 0; t < w.size(); ++t)
      m = std::max(m, w[t] = dot(s.q.data() + h * d, s.keys.data() + t * d, d) / std::sqrt(static_cast<double>(d)));
    for (auto& x : w) z += (x = std::exp(x - m));
    for (std::uint32_t p : attended)
      for (int t = 0; t < pt; ++t) in += w[static_cast<std::size_t>(p) * pt + t];
    per_head.push_back(in / z);
  }
  const eval::MassRecall r = eval::mass_recall(page_lse, lse, group, attended);
  CHECK(r.mean == doctest::Approx((per_head[0] + per_head[1] + per_head[2]) / 3).epsilon(1e-5));
  CHECK(r.min == doctest::Approx(*std::min_element(per_head.begin(), per_head.end())).epsilon(1e-5));
  std::vector<std::uint32_t> all(pages);
  std::iota(all.begin(), all.end(), 0u);
  CHECK(eval::mass_recall(page_lse, lse, group, all).min == doctest::Approx(1.0).epsilon(1e-5));
  CHECK_THROWS_WITH_AS(eval::mass_recall(page_lse, lse, group, std::vector<std::uint32_t>{12}), doctest::Contains("page 12 out of range"), Error);
}

// ---- clustered indices, dtype storage, and the rules every index follows ----------------------

namespace {

/// Keys with topic structure: runs of tokens share a topic direction (plus noise), and the
/// queries lean toward a few topics, so a good index beats random selection clearly.
Stream make_topic_stream(int pages, int pt, int d, int group, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int topics = 12;
  std::vector<float> dirs(static_cast<std::size_t>(topics) * d);
  for (auto& x : dirs) x = n01(rng);
  Stream s{
      pages, pt, d, group, std::vector<float>(static_cast<std::size_t>(pages) * pt * d), std::vector<float>(static_cast<std::size_t>(group) * d)};
  int topic = 0;
  for (int t = 0; t < pages * pt; ++t) {
    if (t % (pt * 3) == 0 && rng() % 2 == 0) topic = static_cast<int>(rng() % topics);
    for (int j = 0; j < d; ++j) s.keys[static_cast<std::size_t>(t) * d + j] = dirs[static_cast<std::size_t>(topic) * d + j] + 0.7f * n01(rng);
  }
  for (int h = 0; h < group; ++h) {
    const int a = static_cast<int>(rng() % topics), b = static_cast<int>(rng() % topics);
    for (int j = 0; j < d; ++j)
      s.q[static_cast<std::size_t>(h) * d + j] =
          1.5f * dirs[static_cast<std::size_t>(a) * d + j] + 0.8f * dirs[static_cast<std::size_t>(b) * d + j] + 0.3f * n01(rng);
  }
  return s;
}

template <class T>
void round_keys(std::vector<float>& keys) {
  for (float& x : keys) x = to_float(from_float<T>(x));
}

std::vector<std::unique_ptr<eval::AnyIndex>> every_index() {
  std::vector<std::unique_ptr<eval::AnyIndex>> v;
  v.push_back(eval::make_any_index(index::Oracle{}));
  v.push_back(eval::make_any_index(index::OracleMass{}));
  v.push_back(eval::make_any_index(index::Quest{}));
  v.push_back(eval::make_any_index(index::MeanKey{}));
  v.push_back(eval::make_any_index(index::Centroid{index::CentroidParams{.pages_per_cluster = 4, .segment_pages = 32}}));
  v.push_back(eval::make_any_index(index::Hierarchical{index::HierarchicalParams{.pages_per_cluster = 4}}));
  // Large clusters expanded to exactly the budget: candidate ranges cut through clusters.
  v.push_back(eval::make_any_index(index::Hierarchical{index::HierarchicalParams{.pages_per_cluster = 16, .expand = 1.0}}));
  v.push_back(eval::make_any_index(index::SimHash{}));
  v.push_back(eval::make_any_index(index::ProductQuant{index::ProductQuant::Params{.M = 8, .C = 32, .train_pages = 64}}));
  return v;
}

}  // namespace

TEST_CASE("every index returns at most the budget, unique ascending candidate pages") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (int trial = 0; trial < 2 * test::scale(); ++trial) {
      const int pages = 150, pt = 8, d = 64, group = 4;
      Stream s = make_topic_stream(pages, pt, d, group, 7000 + static_cast<std::uint64_t>(trial));
      for (auto& ix : every_index()) {
        CAPTURE(ix->name());
        ix->build({s.keys.data(), 0, 100, pt, d, dt});
        for (int p = 100; p < pages; ++p) ix->append({s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d, dt});
        for (auto [first, end, budget] :
             {std::tuple{1, 148, 10}, std::tuple{3, 90, 1}, std::tuple{1, 149, 148}, std::tuple{20, 40, 20}, std::tuple{0, 150, 37},
              std::tuple{1, 49, 3}, std::tuple{5, 27, 7}, std::tuple{17, 33, 2}, std::tuple{9, 120, 8}}) {
          std::vector<std::uint32_t> got;
          ix->select(query_for(s, first, end, budget), got);
          CHECK(static_cast<int>(got.size()) == std::min(budget, end - first));
          CHECK(std::is_sorted(got.begin(), got.end()));
          CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
          for (std::uint32_t p : got) CHECK((static_cast<int>(p) >= first && static_cast<int>(p) < end));
        }
        CHECK(ix->bytes() > 0);
      }
    }
}

TEST_CASE("index data is stored in the KV dtype: 16-bit KV halves the bytes; Quest stays a bound") {
  const int pages = 50, pt = 8, d = 64, group = 4;
  Stream s = make_topic_stream(pages, pt, d, group, 42);
  round_keys<half>(s.keys);
  index::Quest quest;
  index::Quest::State q32, q16;
  quest.build(q32, {s.keys.data(), 0, pages, pt, d, DType::f32});
  quest.build(q16, {s.keys.data(), 0, pages, pt, d, DType::f16});
  CHECK(quest.bytes(q16) * 2 == quest.bytes(q32));
  CHECK(quest.bytes(q16) == static_cast<std::size_t>(pages) * 2 * d * 2);
  for (int h = 0; h < group; ++h)
    for (int p = 0; p < pages; ++p) {
      double true_max = -INFINITY;
      for (int t = 0; t < pt; ++t)
        true_max = std::max(true_max, dot(s.q.data() + h * d, s.keys.data() + (static_cast<std::size_t>(p) * pt + t) * d, d));
      // The bounds are key values, so storing them in f16 loses nothing.
      CHECK(index::quest_page_score(s.q.data() + h * d, q16.lo.row<half>(p), q16.hi.row<half>(p), d) >= true_max - 1e-3);
    }
  index::MeanKey mk;
  index::MeanKey::State m32, m16;
  mk.build(m32, {s.keys.data(), 0, pages, pt, d, DType::f32});
  mk.build(m16, {s.keys.data(), 0, pages, pt, d, DType::bf16});
  CHECK(mk.bytes(m16) * 2 == mk.bytes(m32));
}

TEST_CASE("Hierarchical with one page per cluster and no pair radii selects exactly what MeanKey selects") {
  for (DType dt : {DType::f32, DType::f16})
    for (int trial = 0; trial < 3 * test::scale(); ++trial) {
      const int pages = 120, pt = 8, d = 64, group = 4;
      Stream s = make_topic_stream(pages, pt, d, group, 8000 + static_cast<std::uint64_t>(trial));
      index::Hierarchical hi{index::HierarchicalParams{.pages_per_cluster = 1, .pair_radii = 0}};
      index::MeanKey mk;
      index::Hierarchical::State hs;
      index::MeanKey::State ms;
      hi.build(hs, {s.keys.data(), 0, 70, pt, d, dt});
      mk.build(ms, {s.keys.data(), 0, 70, pt, d, dt});
      for (int p = 70; p < pages; ++p) {
        hi.append(hs, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d, dt});
        mk.append(ms, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d, dt});
      }
      for (int budget : {1, 5, 12, 40}) {
        std::vector<std::uint32_t> a, b;
        hi.select(hs, query_for(s, 1, 112, budget), a);
        mk.select(ms, query_for(s, 1, 112, budget), b);
        CHECK(a == b);
      }
    }
}

TEST_CASE("pair radii: each page's largest residual per rotary pair, and the pairs where pages are large and spread") {
  const int pt = 4, d = 8;  // 4 rotary pairs
  // Page 0: tokens differ only in channel 2 (adjacent pairs: pair 1; halves: pair 2).
  std::vector<float> keys(static_cast<std::size_t>(pt) * d, 1.0f);
  for (int t = 0; t < pt; ++t) keys[static_cast<std::size_t>(t) * d + 2] = static_cast<float>(t);  // 0 1 2 3, mean 1.5
  const index::PageKeys k{keys.data(), 0, 1, pt, d, DType::f32};
  std::vector<float> mean(d), rho(d / 2);
  index::page_mean(k, 0, mean.data());
  index::page_pair_radii(k, 0, mean.data(), index::RotaryPairs::adjacent, rho.data());
  CHECK(rho == std::vector<float>{0.0f, 1.5f, 0.0f, 0.0f});
  index::page_pair_radii(k, 0, mean.data(), index::RotaryPairs::halves, rho.data());
  CHECK(rho == std::vector<float>{0.0f, 0.0f, 1.5f, 0.0f});
  // Two pages: pair 3 is large but never spread, pair 1 spread but small, pair 2 both.
  const std::vector<float> means = {0, 0, 0.1f, 0, 2, 0, 9, 0, /**/ 0, 0, 0.1f, 0, 2, 0, 9, 0};
  const std::vector<float> radii = {0, 4, 3, 0, /**/ 0, 4, 3, 0};
  CHECK(index::choose_pairs(means.data(), radii.data(), 2, d, 2, index::RotaryPairs::adjacent) == std::vector<std::uint8_t>{2, 1});
  CHECK_THROWS_AS(index::Hierarchical(index::HierarchicalParams{.pair_weight = -1.0f}), Error);
  const index::Hierarchical too_many{index::HierarchicalParams{.pair_radii = 5}};
  CHECK_THROWS_AS(too_many.check(d), Error);
  CHECK_NOTHROW(too_many.check(2 * d));
}

TEST_CASE("Hierarchical with pair radii and one page per cluster selects the best pages by q.mean + w sum |q_pair| rho") {
  for (DType dt : {DType::f32, DType::f16})
    for (int r : {1, 3}) {
      const int pages = 90, pt = 8, d = 32, group = 3;
      Stream s = make_topic_stream(pages, pt, d, group, 5100 + static_cast<std::uint64_t>(r));
      const index::HierarchicalParams params{.pages_per_cluster = 1, .pair_radii = r, .pair_weight = 0.75f};
      index::Hierarchical hi{params};
      index::Hierarchical::State hs;
      hi.build(hs, {s.keys.data(), 0, 60, pt, d, dt});
      for (int p = 60; p < pages; ++p) hi.append(hs, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d, dt});
      REQUIRE(hs.pairs.size() == static_cast<std::size_t>(r));
      // The reference: every page's summary from its keys, in the index's dtype, each head's
      // estimate in double, then the GQA rule (Decision 4: max over heads of the estimate less
      // that head's largest over the candidates) and the top pages, ties to the lower page.
      const index::PageKeys all{s.keys.data(), 0, pages, pt, d, dt};
      std::vector<double> est(static_cast<std::size_t>(group) * pages);
      for (int p = 0; p < pages; ++p) {
        std::vector<float> mean(d), rho(d / 2);
        index::page_mean(all, p, mean.data());
        index::round_to_dtype(dt, mean.data(), mean.size());
        index::page_pair_radii(all, p, mean.data(), index::RotaryPairs::adjacent, rho.data());
        index::round_to_dtype(dt, rho.data(), rho.size());
        for (int h = 0; h < group; ++h) {
          const float* qh = s.q.data() + static_cast<std::size_t>(h) * d;
          double e = dot(qh, mean.data(), d);
          for (std::uint8_t j : hs.pairs) e += 0.75 * std::hypot(qh[2 * j], qh[2 * j + 1]) * rho[j];
          est[static_cast<std::size_t>(h) * pages + p] = e;
        }
      }
      const int first = 1, end = 85;
      std::vector<double> gqa(static_cast<std::size_t>(end - first), -1e300);
      for (int h = 0; h < group; ++h) {
        const double top = *std::max_element(est.begin() + h * pages + first, est.begin() + h * pages + end);
        for (int p = first; p < end; ++p)
          gqa[static_cast<std::size_t>(p - first)] =
              std::max(gqa[static_cast<std::size_t>(p - first)], est[static_cast<std::size_t>(h) * pages + p] - top);
      }
      for (int budget : {1, 6, 20}) {
        std::vector<std::uint32_t> got, diff;
        hi.select(hs, query_for(s, first, end, budget), got);
        const std::vector<std::uint32_t> want = brute_top(gqa, first, budget);
        std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
        INFO(dtype_name(dt) << " pairs " << r << " budget " << budget);
        CHECK(got.size() == want.size());
        CHECK(diff.size() <= 2);  // one page swapped at a near-tie (float against double sums)
      }
      // Without the radii the same index is the page mean's selection, which differs here.
      index::Hierarchical plain{index::HierarchicalParams{.pages_per_cluster = 1, .pair_radii = 0}};
      index::Hierarchical::State ps;
      plain.build(ps, all);
      std::vector<std::uint32_t> with, without;
      hi.select(hs, query_for(s, first, end, 20), with);
      plain.select(ps, query_for(s, first, end, 20), without);
      CHECK(with != without);
    }
}

TEST_CASE("Hierarchical: min_scored 1 scores every candidate, so the clustering no longer changes the selection") {
  const int pages = 300, pt = 8, d = 32, group = 3;
  Stream s = make_topic_stream(pages, pt, d, group, 77);
  const index::PageKeys all{s.keys.data(), 0, pages, pt, d, DType::f16};
  const auto select = [&](index::HierarchicalParams p, int budget) {
    index::Hierarchical hi{p};
    index::Hierarchical::State st;
    hi.build(st, all);
    std::vector<std::uint32_t> out;
    hi.select(st, query_for(s, 1, pages - 8, budget), out);
    return out;
  };
  int differ = 0;
  for (int budget : {2, 5, 12}) {
    const auto every = select({.pages_per_cluster = 8, .expand = 1.0, .min_scored = 1.0}, budget);
    // One page per cluster scores every candidate too: the members' scores do not depend on the
    // clusters, so the two selections are the same pages.
    CHECK(every == select({.pages_per_cluster = 1, .expand = 1.0, .min_scored = 1.0}, budget));
    CHECK(every.size() == static_cast<std::size_t>(budget));
    differ += every != select({.pages_per_cluster = 8, .expand = 1.0, .min_scored = 0.0, .score_all_below = 0}, budget);
  }
  CHECK(differ > 0);  // expanding only budget pages' clusters misses some of them
  CHECK_THROWS_WITH_AS(index::Hierarchical(index::HierarchicalParams{.min_scored = 1.5}), doctest::Contains("min_scored is 1.5"), Error);
}

TEST_CASE("Hierarchical: below score_all_below candidates every candidate is scored; from it on, the clusters prune") {
  const int pages = 300, pt = 8, d = 32, group = 3;
  Stream s = make_topic_stream(pages, pt, d, group, 78);
  const index::PageKeys all{s.keys.data(), 0, pages, pt, d, DType::f16};
  const auto select = [&](index::HierarchicalParams p, std::int64_t first, std::int64_t end, int budget) {
    index::Hierarchical hi{p};
    index::Hierarchical::State st;
    hi.build(st, all);
    std::vector<std::uint32_t> out;
    hi.select(st, query_for(s, first, end, budget), out);
    return out;
  };
  const index::HierarchicalParams every{.pages_per_cluster = 8, .expand = 1.0, .min_scored = 1.0, .score_all_below = 0};
  const index::HierarchicalParams pruned{.pages_per_cluster = 8, .expand = 1.0, .min_scored = 0.0, .score_all_below = 0};
  const std::int64_t first = 1, end = pages - 8, candidates = end - first;
  int differ = 0;
  for (int budget : {2, 5, 12}) {
    const auto all_scored = select(every, first, end, budget), some_scored = select(pruned, first, end, budget);
    differ += all_scored != some_scored;
    // One candidate more than there are: every candidate is scored, whatever min_scored says.
    index::HierarchicalParams below = pruned;
    below.score_all_below = candidates + 1;
    CHECK(select(below, first, end, budget) == all_scored);
    // Exactly as many as there are: the threshold is not reached, so the clusters prune as before.
    index::HierarchicalParams at = pruned;
    at.score_all_below = candidates;
    CHECK(select(at, first, end, budget) == some_scored);
  }
  CHECK(differ > 0);  // else the check above could not tell pruning from scoring everything
  CHECK(index::members_to_score(8.0, 0.25, 512, 8, 511) == 511);
  CHECK(index::members_to_score(8.0, 0.25, 512, 8, 512) == 128);  // max(8 x 8, 0.25 x 512)
  CHECK(index::members_to_score(8.0, 0.25, 512, 100, 1000) == 800);
  CHECK_THROWS_WITH_AS(index::Hierarchical(index::HierarchicalParams{.score_all_below = -1}), doctest::Contains("score_all_below is -1"), Error);
}

TEST_CASE("Hierarchical: clusters partition the pages, keep neighbours together, and bound their members") {
  const int pages = 400, pt = 8, d = 32, group = 2, cpc = 8;
  Stream s = make_topic_stream(pages, pt, d, group, 99);
  index::HierarchicalParams params{.pages_per_cluster = cpc};
  index::Hierarchical hi{params};
  index::Hierarchical::State st;
  hi.build(st, {s.keys.data(), 0, 300, pt, d});
  // After a full clustering a page has moved at most `neighbourhood` runs away from its own run,
  // so a cluster's pages span at most 2 x neighbourhood + 1 runs.
  for (const auto& cl : st.clusters) CHECK(cl.max_page - cl.min_page < static_cast<std::uint32_t>((2 * params.neighbourhood + 1) * cpc));
  for (int p = 300; p < pages; ++p) hi.append(st, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d});
  std::vector<int> seen(pages, 0);
  for (std::size_t c = 0; c < st.clusters.size(); ++c) {
    const auto& cl = st.clusters[c];
    CHECK(!cl.pages.empty());
    CHECK(cl.pages.size() <= static_cast<std::size_t>(params.split_factor * cpc));
    for (std::uint32_t p : cl.pages) {
      ++seen[p];
      CHECK(index::Hierarchical::cluster_of(st, p) == c);
    }
    // The radius bounds every member: q.m <= q.c + |q| r (Cauchy-Schwarz), the level-1 score.
    for (int h = 0; h < group; ++h) {
      const float* q = s.q.data() + h * d;
      const double qn = std::sqrt(dot(q, q, d));
      const double qc = dot(q, reinterpret_cast<const float*>(st.centroids.data()) + c * d, d);
      for (std::size_t j = 0; j < cl.pages.size(); ++j)
        CHECK(dot(q, reinterpret_cast<const float*>(cl.means.data()) + j * d, d) <= qc + qn * st.radius[c] + 1e-4);
    }
  }
  for (int p = 0; p < pages; ++p) CHECK(seen[p] == 1);
  // Bytes: means, pair radii and centroids (f32 here), two u32 per page, radius and page range
  // per cluster, a byte per chosen pair.
  const std::size_t r = static_cast<std::size_t>(index::HierarchicalParams{}.pair_radii);
  REQUIRE(st.pairs.size() == r);
  CHECK(hi.bytes(st) == static_cast<std::size_t>(pages) * (d * 4 + r * 4 + 8) + st.clusters.size() * (d * 4 + 4 + 8) + r);
}

TEST_CASE("growing page by page vs building at once: Centroid identical, Hierarchical within tolerance") {
  const int pages = 260, pt = 8, d = 64, group = 4, first = 1, end = 252, budget = 16;
  for (int trial = 0; trial < 2 * test::scale(); ++trial) {
    Stream s = make_topic_stream(pages, pt, d, group, 9100 + static_cast<std::uint64_t>(trial));
    auto grow = [&](auto policy) {
      typename decltype(policy)::State one, all;
      policy.build(all, s.page_keys());
      policy.build(one, {s.keys.data(), 0, 1, pt, d});
      for (int p = 1; p < pages; ++p) policy.append(one, {s.keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d});
      std::vector<std::uint32_t> a, b;
      policy.select(one, query_for(s, first, end, budget), a);
      policy.select(all, query_for(s, first, end, budget), b);
      return std::pair{a, b};
    };
    const auto [c_one, c_all] = grow(index::Centroid{index::CentroidParams{.pages_per_cluster = 4, .segment_pages = 64}});
    CHECK(c_one == c_all);
    // Page by page Hierarchical only joins and splits; at once it clusters fully: the documented
    // tolerance between the two is 0.05 of mass recall.
    const auto [h_one, h_all] = grow(index::Hierarchical{index::HierarchicalParams{.pages_per_cluster = 4}});
    CHECK(std::abs(mean_mass_recall(s, h_one) - mean_mass_recall(s, h_all)) <= 0.05);
  }
}

TEST_CASE("clustered indices beat random selection clearly") {
  const int pages = 300, pt = 8, d = 64, group = 4, budget = 20;
  std::mt19937_64 rng(5);
  double random = 0, hier = 0, cent = 0;
  const int trials = 4 * test::scale();
  for (int trial = 0; trial < trials; ++trial) {
    Stream s = make_topic_stream(pages, pt, d, group, 9300 + static_cast<std::uint64_t>(trial));
    index::Hierarchical hi{index::HierarchicalParams{.pages_per_cluster = 8}};
    index::Centroid ce{index::CentroidParams{.pages_per_cluster = 8, .segment_pages = 128}};
    index::Hierarchical::State hs;
    index::Centroid::State cs;
    hi.build(hs, s.page_keys());
    ce.build(cs, s.page_keys());
    std::vector<std::uint32_t> a, b, r(pages);
    hi.select(hs, query_for(s, 0, pages, budget), a);
    ce.select(cs, query_for(s, 0, pages, budget), b);
    std::iota(r.begin(), r.end(), 0u);
    std::shuffle(r.begin(), r.end(), rng);
    r.resize(budget);
    hier += mean_mass_recall(s, a) / trials;
    cent += mean_mass_recall(s, b) / trials;
    random += mean_mass_recall(s, r) / trials;
  }
  MESSAGE("mass recall at " << budget << "/" << pages << " pages: hierarchical " << hier << ", centroid " << cent << ", random " << random);
  CHECK(hier > 2 * random);
  CHECK(cent > 1.5 * random);
}

TEST_CASE("bad index parameters throw a clear kvdrive::Error") {
  CHECK_THROWS_WITH_AS(index::Hierarchical(index::HierarchicalParams{.pages_per_cluster = 0}), doctest::Contains("pages_per_cluster is 0"), Error);
  CHECK_THROWS_AS(index::Hierarchical(index::HierarchicalParams{.expand = 0.5}), Error);
  CHECK_THROWS_AS(index::Hierarchical(index::HierarchicalParams{.split_factor = 1}), Error);
  CHECK_THROWS_WITH_AS(index::Centroid(index::CentroidParams{.pages_per_cluster = 0}), doctest::Contains("pages_per_cluster is 0"), Error);
  CHECK_THROWS_AS(index::Centroid(index::CentroidParams{.pages_per_cluster = 16, .segment_pages = 8}), Error);
}

namespace {

/// A tiny stream trace with random keys, values and queries.
eval::StreamTrace tiny_trace(std::int64_t prefix, std::int64_t steps, int d, int group, std::uint64_t seed) {
  eval::StreamTrace t;
  t.head_dim = d;
  t.group = group;
  t.prefix = prefix;
  t.steps = steps;
  t.keys = test::random_floats(static_cast<std::size_t>(prefix + steps) * d, seed);
  t.values = test::random_floats(t.keys.size(), seed + 1);
  t.queries = test::random_floats(static_cast<std::size_t>(steps) * group * d, seed + 2, 2.0f);
  return t;
}

/// A broken policy: selects one page past the candidates.
struct PastTheEnd {
  struct State {};
  static constexpr std::string_view name() { return "past-the-end"; }
  void build(State&, const index::PageKeys&) const {}
  void append(State&, const index::PageKeys&) const {}
  void select(const State&, const index::IndexQuery& q, std::vector<std::uint32_t>& out) const {
    out.push_back(static_cast<std::uint32_t>(q.end_candidate));
  }
  std::size_t bytes(const State&) const { return 0; }
};

}  // namespace

TEST_CASE("evaluate_stream: dense and budget 1 recall everything; a broken index is reported by name") {
  const eval::StreamTrace t = tiny_trace(300, 12, 32, 4, 77);
  eval::EvalSettings set;
  set.dtype = DType::f32;
  set.budget = 1.0;
  std::vector<std::unique_ptr<eval::AnyIndex>> all;
  all.push_back(eval::make_any_index(index::Dense{}));
  all.push_back(eval::make_any_index(index::Quest{}));
  all.push_back(eval::make_any_index(index::Hierarchical{}));
  for (const eval::IndexTally& r : eval::evaluate_stream(t, all, set)) {
    CAPTURE(r.name);
    CHECK(r.steps == 12);
    CHECK(r.mean(r.mass_recall) == doctest::Approx(1.0).epsilon(1e-5));
    CHECK(r.mean(r.topk_recall) == 1.0);
    CHECK(r.mean(r.out_err) < 1e-5);
  }
  set.budget = 0.1;
  std::vector<std::unique_ptr<eval::AnyIndex>> broken;
  broken.push_back(eval::make_any_index(PastTheEnd{}));
  CHECK_THROWS_WITH_AS(eval::evaluate_stream(t, broken, set), doctest::Contains("index past-the-end selected page"), Error);
}

TEST_CASE("the GQA rule: a +inf estimate at a head's maximum scores 0, not NaN") {
  const float est[] = {INFINITY, 1.0f, 0.0f, 3.0f};  // head 0: pages 0, 1; head 1: pages 0, 1
  float score[2];
  index::gqa_scores(est, 2, 2, score);
  CHECK(score[0] == 0.0f);
  CHECK(score[1] == 0.0f);  // head 1's best
}
