// index::SimHash (MagicPIG-like LSH) and index::ProductQuant (PQCache-like): their per-row
// functions against brute force, selection rules, growth page by page against build at once,
// byte counts, parameter validation, and recall against random selection on structured keys.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "index_support.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

using test::dot;
using test::mean_mass_recall;
using test::query_for;
using test::Stream;

/// Keys from a few topic directions: each page belongs to one topic (in runs of a few pages, as
/// a document's sections), its tokens are the topic direction at a per-page strength plus noise.
/// The group's query heads point near topic `target`.
Stream topic_stream(int pages, int pt, int d, int group, std::uint64_t seed, int topics = 8, int target = 3) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<std::vector<float>> dir(topics, std::vector<float>(d));
  for (auto& v : dir) {
    float n2 = 0;
    for (auto& x : v) {
      x = normal(rng);
      n2 += x * x;
    }
    for (auto& x : v) x /= std::sqrt(n2);
  }
  Stream s{
      pages, pt, d, group, std::vector<float>(static_cast<std::size_t>(pages) * pt * d), std::vector<float>(static_cast<std::size_t>(group) * d)};
  int topic = 0;
  for (int p = 0; p < pages; ++p) {
    if (p % 4 == 0) topic = static_cast<int>(rng() % static_cast<std::uint64_t>(topics));
    const float strength = 2.0f + 4.0f * uniform(rng);
    for (int t = 0; t < pt; ++t)
      for (int i = 0; i < d; ++i) s.keys[(static_cast<std::size_t>(p) * pt + t) * d + i] = strength * dir[topic][i] + 0.7f * normal(rng);
  }
  for (int h = 0; h < group; ++h)
    for (int i = 0; i < d; ++i) s.q[static_cast<std::size_t>(h) * d + i] = 4.0f * dir[target][i] + 0.5f * normal(rng);
  return s;
}

Stream random_stream(int pages, int pt, int d, int group, std::uint64_t seed) {
  return {pages,
          pt,
          d,
          group,
          test::random_floats(static_cast<std::size_t>(pages) * pt * d, seed),
          test::random_floats(static_cast<std::size_t>(group) * d, seed + 1)};
}

double norm(const float* x, int d) { return std::sqrt(dot(x, x, d)); }

/// Float dot products against double: within 1e-5 of |q| |x| (which bounds the sum of |q_i x_i|).
doctest::Approx near(double expect, double magnitude) { return doctest::Approx(expect).epsilon(1e-5).scale(magnitude); }

template <class I>
std::vector<std::uint32_t> pick(const I& index, const typename I::State& st, const index::IndexQuery& q) {
  std::vector<std::uint32_t> out;
  index.select(st, q, out);
  return out;
}

template <class I>
std::vector<float> estimates(const I& index, const typename I::State& st, const index::IndexQuery& q) {
  std::vector<float> est(static_cast<std::size_t>(q.group) * static_cast<std::size_t>(q.candidates()));
  index.estimate(st, q, est.data());
  return est;
}

void check_selection(const std::vector<std::uint32_t>& got, const index::IndexQuery& q) {
  CHECK(static_cast<std::int64_t>(got.size()) == std::min(q.budget_pages, q.candidates()));
  CHECK(std::is_sorted(got.begin(), got.end()));
  CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
  for (std::uint32_t p : got) {
    CHECK(p >= q.first_candidate);
    CHECK(p < q.end_candidate);
  }
}

/// The mean key of page p, as float.
std::vector<float> page_mean_of(const Stream& s, int p) {
  std::vector<float> m(static_cast<std::size_t>(s.d));
  index::page_mean(s.all(), p, m.data());
  return m;
}

}  // namespace

TEST_CASE("simhash_hamming counts differing bits like a bit-by-bit loop") {
  std::mt19937_64 rng(11);
  for (int words : {1, 2, 5, 24}) {
    std::vector<std::uint64_t> a(words), b(words);
    for (int trial = 0; trial < 20; ++trial) {
      for (int w = 0; w < words; ++w) {
        a[w] = rng();
        b[w] = trial % 3 == 0 ? a[w] : rng();
        if (trial % 5 == 1) b[w] = ~a[w];
      }
      int expect = 0;
      for (int w = 0; w < words; ++w)
        for (int bit = 0; bit < 64; ++bit) expect += ((a[w] >> bit) & 1u) != ((b[w] >> bit) & 1u);
      CHECK(index::simhash_hamming(a.data(), b.data(), words) == expect);
      CHECK(index::popcount64(a[0]) == [&] {
        int c = 0;
        for (int bit = 0; bit < 64; ++bit) c += static_cast<int>((a[0] >> bit) & 1u);
        return c;
      }());
    }
  }
}

TEST_CASE("simhash_rows and pq_rows (the CPU batch loops) equal the per-row functions exactly") {
  std::mt19937_64 rng(12);
  for (int words : {1, 3, 4, 24, 130})  // 130 words: the AVX2 byte counters are widened midway
    for (int group : {1, 3, 4, 5, 8}) {
      const int n = 37;
      std::vector<std::uint64_t> pages(static_cast<std::size_t>(n) * words), q(static_cast<std::size_t>(group) * words);
      for (auto& x : pages) x = rng();
      for (auto& x : q) x = rng();
      std::vector<int> ham(static_cast<std::size_t>(group) * n);
      index::simhash_rows(pages.data(), n, q.data(), group, words, ham.data(), n);
      for (int h = 0; h < group; ++h)
        for (int i = 0; i < n; ++i)
          CHECK(ham[static_cast<std::size_t>(h) * n + i] ==
                index::simhash_hamming(pages.data() + static_cast<std::size_t>(i) * words, q.data() + static_cast<std::size_t>(h) * words, words));
    }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int M : {16, 7, 2})
    for (int group : {1, 2, 3, 4, 8}) {
      const int C = 32, n = 41;
      std::vector<float> lut(static_cast<std::size_t>(group) * M * C), lut_g(lut.size());
      for (auto& x : lut) x = u(rng);
      for (int j = 0; j < M * C; ++j)
        for (int h = 0; h < group; ++h) lut_g[static_cast<std::size_t>(j) * group + h] = lut[static_cast<std::size_t>(h) * M * C + j];
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(n) * M);
      for (auto& c : codes) c = static_cast<std::uint8_t>(rng() % C);
      std::vector<float> est(static_cast<std::size_t>(group) * n);
      index::pq_rows(lut_g.data(), group, codes.data(), n, M, C, est.data(), n);
      for (int h = 0; h < group; ++h)
        for (int i = 0; i < n; ++i)
          CHECK(est[static_cast<std::size_t>(h) * n + i] ==
                index::pq_page_score(lut.data() + static_cast<std::size_t>(h) * M * C, codes.data() + static_cast<std::size_t>(i) * M, M, C));
    }
}

TEST_CASE("SimHash: codes are the hyperplane signs; estimate() is |q| |mean| cos(pi h / B) from them") {
  const Stream s = random_stream(37, 4, 32, 3, 21);
  const index::SimHash sh({.K = 7, .L = 11});  // B = 77: two words, 51 unused bits
  CHECK(sh.bits() == 77);
  CHECK(sh.words() == 2);
  index::SimHash::State st;
  sh.build(st, s.all());
  REQUIRE(st.pages == 37);
  REQUIRE(st.planes.rows() == 77);
  // Brute force: signs of plane . mean in double, the estimate in double.
  std::vector<float> plane(32);
  auto code_of = [&](const float* x) {
    std::vector<std::uint64_t> c(2, 0);
    for (int j = 0; j < 77; ++j) {
      st.planes.row_float(j, plane.data());
      if (dot(plane.data(), x, 32) > 0) c[j / 64] |= std::uint64_t{1} << (j % 64);
    }
    return c;
  };
  const auto q = query_for(s, 0, 37, 5);
  const std::vector<float> est = estimates(sh, st, q);
  int code_mismatch = 0;
  for (int p = 0; p < 37; ++p) {
    const std::vector<float> mean = page_mean_of(s, p);
    const std::vector<std::uint64_t> c = code_of(mean.data());
    code_mismatch += !std::equal(c.begin(), c.end(), st.codes.row(p));
    CHECK((st.codes.row(p)[1] >> 13) == 0);  // trailing bits zero
    CHECK(st.norms.row<float>(p)[0] == doctest::Approx(std::sqrt(dot(mean.data(), mean.data(), 32))).epsilon(1e-5));
    for (int h = 0; h < 3; ++h) {
      const float* qh = s.q.data() + h * 32;
      const std::vector<std::uint64_t> qc = code_of(qh);
      int ham = 0;
      for (int j = 0; j < 77; ++j) ham += ((qc[j / 64] >> (j % 64)) & 1u) != ((st.codes.row(p)[j / 64] >> (j % 64)) & 1u);
      const double expect = std::sqrt(dot(qh, qh, 32)) * st.norms.row<float>(p)[0] * std::cos(std::numbers::pi * ham / 77.0);
      CHECK(est[static_cast<std::size_t>(h) * 37 + p] == near(expect, norm(qh, 32) * norm(mean.data(), 32)));
      CHECK(index::simhash_estimate(1.0f, 2.0f, ham, sh.cos_table()) == doctest::Approx(2.0 * std::cos(std::numbers::pi * ham / 77.0)));
    }
  }
  // A sign computed in float may differ from double only for a product within rounding of 0.
  CHECK(code_mismatch <= 1);
}

TEST_CASE("SimHash: the angle estimate converges to the true cosine as the bits grow") {
  // Pages of one token: the mean key is the key. Keys at known angles to the query.
  const int d = 64, pages = 64;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Stream s{pages, 1, d, 1, std::vector<float>(static_cast<std::size_t>(pages) * d), std::vector<float>(d)};
  for (auto& x : s.q) x = normal(rng);
  for (int p = 0; p < pages; ++p) {
    const float mix = static_cast<float>(p) / (pages - 1);  // from q-like to independent
    for (int i = 0; i < d; ++i) s.keys[static_cast<std::size_t>(p) * d + i] = (1 - mix) * s.q[i] + mix * normal(rng);
  }
  auto mean_abs_error = [&](int K, int L) {
    const index::SimHash sh({.K = K, .L = L, .seed = 99});
    index::SimHash::State st;
    sh.build(st, s.all());
    const std::vector<float> est = estimates(sh, st, query_for(s, 0, pages, 1));
    const double qn = std::sqrt(dot(s.q.data(), s.q.data(), d));
    double err = 0;
    for (int p = 0; p < pages; ++p) {
      const float* k = s.keys.data() + static_cast<std::size_t>(p) * d;
      const double kn = std::sqrt(dot(k, k, d));
      err += std::abs(est[p] / (qn * kn) - dot(s.q.data(), k, d) / (qn * kn));
    }
    return err / pages;
  };
  const double e16 = mean_abs_error(8, 2), e256 = mean_abs_error(16, 16), e4096 = mean_abs_error(16, 256);
  MESSAGE("mean |cos estimate - cos|: 16 bits " << e16 << ", 256 bits " << e256 << ", 4096 bits " << e4096);
  CHECK(e256 < e16);
  CHECK(e4096 < e256);
  CHECK(e4096 < 0.03);
}

TEST_CASE("pq_page_score is q . (the codes' reconstruction); pq::encode picks the nearest codewords") {
  const int d = 32, M = 4, C = 16, n = 200, sub = d / M;
  const std::vector<float> pts = test::random_floats(static_cast<std::size_t>(n) * d, 5);
  const std::vector<float> book = index::pq::train(pts.data(), n, d, M, C, 6, 7);
  REQUIRE(book.size() == static_cast<std::size_t>(C) * d);
  const std::vector<float> q = test::random_floats(d, 6);
  std::vector<float> lut(static_cast<std::size_t>(M) * C);
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < C; ++c)
      lut[m * C + c] = static_cast<float>(dot(q.data() + m * sub, book.data() + (static_cast<std::size_t>(m) * C + c) * sub, sub));
  std::vector<std::uint8_t> codes(M);
  for (int i = 0; i < n; ++i) {
    const float* x = pts.data() + static_cast<std::size_t>(i) * d;
    index::pq::encode(book.data(), x, d, M, C, codes.data());
    double recon_dot = 0, recon_sq = 0;
    for (int m = 0; m < M; ++m) {
      const float* cw = book.data() + (static_cast<std::size_t>(m) * C + codes[m]) * sub;
      recon_dot += dot(q.data() + m * sub, cw, sub);
      recon_sq += dot(cw, cw, sub);
      // Brute-force nearest codeword in double.
      double best = INFINITY;
      int arg = -1;
      for (int c = 0; c < C; ++c) {
        double dist = 0;
        for (int j = 0; j < sub; ++j) {
          const double diff = x[m * sub + j] - book[(static_cast<std::size_t>(m) * C + c) * sub + j];
          dist += diff * diff;
        }
        if (dist < best - 1e-9) best = dist, arg = c;
      }
      CHECK(codes[m] == arg);
    }
    CHECK(index::pq_page_score(lut.data(), codes.data(), M, C) == near(recon_dot, norm(q.data(), d) * std::sqrt(recon_sq)));
  }
}

TEST_CASE("SimHash and ProductQuant select at most the budget: unique ascending candidates") {
  for (int group : {1, 4}) {
    const Stream s = topic_stream(300, 4, 32, group, 40 + group);
    const index::SimHash sh;
    index::SimHash::State sst;
    sh.build(sst, s.all());
    const index::ProductQuant pq({.M = 8, .C = 32, .train_pages = 100});
    index::ProductQuant::State untrained, trained;
    pq.build(untrained, s.range(0, 60));
    pq.build(trained, s.all());
    REQUIRE(!untrained.trained());
    REQUIRE(trained.trained());
    for (auto [first, end, budget] : {std::tuple{0, 300, 10}, {5, 290, 1}, {7, 8, 3}, {3, 50, 47}, {3, 50, 60}, {10, 10, 4}}) {
      const auto q = query_for(s, first, end, std::min(budget, end - first));
      check_selection(pick(sh, sst, q), q);
      check_selection(pick(pq, trained, q), q);
      if (end <= 60) check_selection(pick(pq, untrained, q), q);
    }
  }
}

TEST_CASE("SimHash and ProductQuant recover far more attention mass than random selection") {
  const int pages = 512, pt = 8, d = 64, budget = 32;  // 6.25%
  for (int group : {1, 4}) {
    const Stream s = topic_stream(pages, pt, d, group, 1234 + group);
    const auto q = query_for(s, 0, pages, budget);
    const index::SimHash sh;
    index::SimHash::State sst;
    sh.build(sst, s.all());
    const index::ProductQuant pq({.M = 16, .C = 256, .train_pages = 512});
    index::ProductQuant::State pst;
    pq.build(pst, s.all());
    REQUIRE(pst.trained());
    const index::MeanKey mk;
    index::MeanKey::State mst;
    mk.build(mst, s.all());
    const double r_sh = mean_mass_recall(s, pick(sh, sst, q));
    const double r_pq = mean_mass_recall(s, pick(pq, pst, q));
    const double r_mk = mean_mass_recall(s, pick(mk, mst, q));
    // Random selection's expected mass recall is budget / pages exactly (linearity).
    const double r_random = static_cast<double>(budget) / pages;
    MESSAGE("group " << group << ": mass recall simhash " << r_sh << ", product-quant " << r_pq << ", mean-key " << r_mk << ", random " << r_random);
    CHECK(r_sh > 5 * r_random);
    CHECK(r_pq > 5 * r_random);
    CHECK(r_sh > 0.8 * r_mk);
    CHECK(r_pq > 0.8 * r_mk);
  }
}

TEST_CASE("ProductQuant with a codeword per page reconstructs every mean exactly and ranks like MeanKey") {
  for (int group : {1, 4}) {
    const int pages = 48, pt = 4, d = 32;
    const Stream s = random_stream(pages, pt, d, group, 500 + group);
    const index::ProductQuant pq({.M = 8, .C = pages, .train_pages = pages});
    index::ProductQuant::State st;
    pq.build(st, s.all());
    REQUIRE(st.trained());
    CHECK(st.pending.rows() == 0);
    const std::vector<float> book = pq.codebook_float(st);
    const int sub = d / 8;
    for (int p = 0; p < pages; ++p) {
      const std::vector<float> mean = page_mean_of(s, p);
      for (int m = 0; m < 8; ++m)
        for (int j = 0; j < sub; ++j) CHECK(book[(static_cast<std::size_t>(m) * pages + st.codes.row(p)[m]) * sub + j] == mean[m * sub + j]);
    }
    const index::MeanKey mk;
    index::MeanKey::State mst;
    mk.build(mst, s.all());
    for (auto [first, end, budget] : {std::tuple{0, 48, 6}, {2, 45, 9}, {10, 30, 1}}) {
      const auto q = query_for(s, first, end, budget);
      CHECK(pick(pq, st, q) == pick(mk, mst, q));
      const std::vector<float> a = estimates(pq, st, q);
      for (int h = 0; h < group; ++h)
        for (int i = 0; i < end - first; ++i) {
          const std::vector<float> mean = page_mean_of(s, first + i);
          const float* qh = s.q.data() + h * d;
          CHECK(a[static_cast<std::size_t>(h) * (end - first) + i] == near(dot(qh, mean.data(), d), norm(qh, d) * norm(mean.data(), d)));
        }
    }
  }
}

TEST_CASE("ProductQuant: ADC estimates of the index equal q . reconstruction; untrained pages score exactly") {
  const int pages = 150, pt = 4, d = 64, group = 2;
  const Stream s = topic_stream(pages, pt, d, group, 77);
  const index::ProductQuant pq({.M = 16, .C = 64, .train_pages = 128, .iterations = 5});
  index::ProductQuant::State st;
  pq.build(st, s.range(0, 100));
  REQUIRE(!st.trained());
  {
    const auto q = query_for(s, 0, 100, 5);
    const std::vector<float> e = estimates(pq, st, q);
    for (int h = 0; h < group; ++h)
      for (int p = 0; p < 100; ++p) {
        const std::vector<float> mean = page_mean_of(s, p);
        const float* qh = s.q.data() + h * d;
        CHECK(e[static_cast<std::size_t>(h) * 100 + p] == near(dot(qh, mean.data(), d), norm(qh, d) * norm(mean.data(), d)));
      }
  }
  pq.append(st, s.range(100, 50));  // 150 >= 128 held: trains on 128 evenly spaced, encodes all
  REQUIRE(st.trained());
  CHECK(st.codes.rows() == pages);
  const std::vector<float> book = pq.codebook_float(st);
  const auto q = query_for(s, 3, 140, 5);
  const std::vector<float> e = estimates(pq, st, q);
  std::vector<std::uint8_t> code(16);
  for (int p = 3; p < 140; ++p) {
    const std::vector<float> mean = page_mean_of(s, p);
    index::pq::encode(book.data(), mean.data(), d, 16, 64, code.data());
    CHECK(std::equal(code.begin(), code.end(), st.codes.row(p)));
    for (int h = 0; h < group; ++h) {
      double expect = 0, recon_sq = 0;
      for (int m = 0; m < 16; ++m) {
        const float* cw = book.data() + (static_cast<std::size_t>(m) * 64 + code[m]) * 4;
        expect += dot(s.q.data() + h * d + m * 4, cw, 4);
        recon_sq += dot(cw, cw, 4);
      }
      CHECK(e[static_cast<std::size_t>(h) * 137 + (p - 3)] == near(expect, norm(s.q.data() + h * d, d) * std::sqrt(recon_sq)));
    }
  }
}

TEST_CASE("bytes(): every stored byte, by formula") {
  const int pt = 4, d = 32;
  const Stream s = random_stream(70, pt, d, 1, 9);
  const index::SimHash sh({.K = 10, .L = 15});  // B = 150: 3 words
  index::SimHash::State sst;
  CHECK(sh.bytes(sst) == 0);
  sh.build(sst, s.range(0, 0));  // nothing sealed yet: nothing stored
  CHECK(sh.bytes(sst) == 0);
  sh.build(sst, s.range(0, 50));
  CHECK(sh.bytes(sst) == 150u * d * 4 + 50u * 3 * 8 + 50u * 4);
  sh.append(sst, s.range(50, 20));
  CHECK(sh.bytes(sst) == 150u * d * 4 + 70u * 3 * 8 + 70u * 4);

  const index::ProductQuant pq({.M = 4, .C = 16, .train_pages = 60});
  index::ProductQuant::State pst;
  CHECK(pq.bytes(pst) == 0);
  pq.build(pst, s.range(0, 0));
  CHECK(pq.bytes(pst) == 0);
  pq.build(pst, s.range(0, 50));
  CHECK(pq.bytes(pst) == 50u * d * 4);  // pending means
  pq.append(pst, s.range(50, 20));
  CHECK(pq.bytes(pst) == 16u * d * 4 + 70u * 4);  // codebooks + M bytes per page
}

TEST_CASE("SimHash: page by page, in chunks or at once, the same codes and selections") {
  const Stream s = topic_stream(200, 4, 64, 4, 31);
  const index::SimHash sh;
  index::SimHash::State once, by_page, chunked;
  sh.build(once, s.all());
  sh.build(by_page, s.range(0, 1));
  for (int p = 1; p < 200; ++p) sh.append(by_page, s.range(p, 1));
  sh.build(chunked, s.range(0, 32));
  for (int p = 32; p < 200; p += 32) sh.append(chunked, s.range(p, std::min(32, 200 - p)));
  for (int p = 0; p < 200; ++p) {
    CHECK(std::equal(once.codes.row(p), once.codes.row(p) + sh.words(), by_page.codes.row(p)));
    CHECK(std::equal(once.codes.row(p), once.codes.row(p) + sh.words(), chunked.codes.row(p)));
  }
  for (auto [first, end, budget] : {std::tuple{0, 200, 12}, {1, 190, 20}, {50, 60, 3}}) {
    const auto q = query_for(s, first, end, budget);
    const auto expect = pick(sh, once, q);
    CHECK(pick(sh, by_page, q) == expect);
    CHECK(pick(sh, chunked, q) == expect);
    CHECK(estimates(sh, by_page, q) == estimates(sh, once, q));
  }
  CHECK(sh.bytes(once) == sh.bytes(by_page));
}

TEST_CASE("ProductQuant: trained on the same pages, page by page or in the manager's 32-page chunks, the same index") {
  // Training happens when the index first holds T = max(train_pages, C) = 96 pages. Page by page,
  // in chunks of 32 (96 is a multiple) and build(first 96) + appends all train on pages 0..95, so
  // codebooks, codes and selections must be identical. (build() of all 200 at once trains on 96
  // evenly spaced pages of the 200 instead: a different, equally valid codebook.)
  const Stream s = topic_stream(200, 4, 64, 4, 32);
  const index::ProductQuant pq({.M = 8, .C = 64, .train_pages = 96});
  index::ProductQuant::State by_page, chunked, first_t, once;
  for (int p = 0; p < 200; ++p) (p == 0 ? pq.build(by_page, s.range(0, 1)) : pq.append(by_page, s.range(p, 1)));
  pq.build(chunked, s.range(0, 32));
  for (int p = 32; p < 200; p += 32) pq.append(chunked, s.range(p, std::min(32, 200 - p)));
  pq.build(first_t, s.range(0, 96));
  for (int p = 96; p < 200; ++p) pq.append(first_t, s.range(p, 1));
  pq.build(once, s.all());
  for (const auto* st : {&by_page, &chunked, &first_t, &once}) {
    REQUIRE(st->trained());
    CHECK(st->codes.rows() == 200);
    CHECK(pq.bytes(*st) == 64u * 64 * 4 + 200u * 8);
  }
  const std::vector<float> book = pq.codebook_float(by_page);
  CHECK(pq.codebook_float(chunked) == book);
  CHECK(pq.codebook_float(first_t) == book);
  CHECK(pq.codebook_float(once) != book);
  for (int p = 0; p < 200; ++p) {
    CHECK(std::equal(by_page.codes.row(p), by_page.codes.row(p) + 8, chunked.codes.row(p)));
    CHECK(std::equal(by_page.codes.row(p), by_page.codes.row(p) + 8, first_t.codes.row(p)));
  }
  for (auto [first, end, budget] : {std::tuple{0, 200, 12}, {1, 190, 20}, {50, 60, 3}}) {
    const auto q = query_for(s, first, end, budget);
    CHECK(pick(pq, chunked, q) == pick(pq, by_page, q));
    CHECK(pick(pq, first_t, q) == pick(pq, by_page, q));
    CHECK(estimates(pq, chunked, q) == estimates(pq, by_page, q));
  }
  // Before training, every path is MeanKey on the same pages.
  index::ProductQuant::State partial;
  pq.build(partial, s.range(0, 95));
  REQUIRE(!partial.trained());
  const index::MeanKey mk;
  index::MeanKey::State mst;
  mk.build(mst, s.range(0, 95));
  const auto q = query_for(s, 0, 95, 9);
  CHECK(pick(pq, partial, q) == pick(mk, mst, q));
  CHECK(pq.bytes(partial) == mk.bytes(mst));
}

TEST_CASE("ProductQuant: interim codebooks as the pages double, then the final codebooks exactly as without them") {
  // T = 256; interim codebooks from 32 pages: trained at 32, 64 and 128 pages with 8, 16 and 32
  // codewords (pages / 4), scored through; the final training at 256 pages is the one an index
  // without interim codebooks makes, so from there the two are the same index.
  const int pages = 300, chunk = 4, d = 64;
  const Stream s = topic_stream(pages, 4, d, 4, 33);
  const index::ProductQuant pq({.M = 8, .C = 64, .train_pages = 256, .first_train_pages = 32});
  const index::ProductQuant plain({.M = 8, .C = 64, .train_pages = 256, .first_train_pages = 0});
  const index::MeanKey mk;
  index::ProductQuant::State st, ref;
  index::MeanKey::State mst;
  int interim_checked = 0;
  for (int p = 0; p < pages; p += chunk) {
    const auto r = s.range(p, chunk);
    for (auto [ix, state] : {std::pair{&pq, &st}, std::pair{&plain, &ref}}) (p == 0 ? ix->build(*state, r) : ix->append(*state, r));
    (p == 0 ? mk.build(mst, r) : mk.append(mst, r));
    const int held = p + chunk;
    CAPTURE(held);
    if (held < 32) {
      CHECK(!st.trained());
      continue;
    }
    if (held >= 256) {
      REQUIRE(st.frozen());
      CHECK(st.codewords == 64);
      continue;
    }
    int at = 32;
    while (2 * at <= held) at *= 2;
    REQUIRE(st.trained());
    CHECK(!st.frozen());
    CHECK(!ref.trained());
    CHECK(st.trained_at == at);
    CHECK(st.codewords == at / 4);
    CHECK(st.codes.rows() == held);
    CHECK(pq.bytes(st) == mk.bytes(mst) + st.codebook.bytes() + st.codes.bytes());  // the means are kept, and counted
    if (held % 20 != 0) continue;
    // Scored through the interim codebook: each estimate is q . (the page's reconstruction).
    const auto q = query_for(s, 0, held, 5);
    const std::vector<float> est = estimates(pq, st, q), book = pq.codebook_float(st);
    const int sub = d / 8;
    int off_mean = 0;
    for (int h = 0; h < q.group; ++h)
      for (int page = 0; page < held; ++page) {
        const float* qh = q.q + static_cast<std::size_t>(h) * d;
        double want = 0;
        for (int m = 0; m < 8; ++m)
          want += dot(qh + m * sub, book.data() + (static_cast<std::size_t>(m) * st.codewords + st.codes.row(page)[m]) * sub, sub);
        const float got = est[static_cast<std::size_t>(h) * held + page];
        CHECK(got == near(want, norm(qh, d) * 10));
        off_mean += std::abs(got - dot(qh, page_mean_of(s, page).data(), d)) > 1e-3;
      }
    CHECK(off_mean > held);  // not MeanKey
    ++interim_checked;
  }
  CHECK(interim_checked >= 5);
  CHECK(pq.codebook_float(st) == plain.codebook_float(ref));
  for (int p = 0; p < pages; ++p) CHECK(std::equal(st.codes.row(p), st.codes.row(p) + 8, ref.codes.row(p)));
  CHECK(pq.bytes(st) == plain.bytes(ref));
  for (auto [first, end, budget] : {std::tuple{0, 300, 12}, {1, 290, 20}, {50, 60, 3}}) {
    const auto q = query_for(s, first, end, budget);
    CHECK(pick(pq, st, q) == pick(plain, ref, q));
  }
}

TEST_CASE("bad parameters throw kvdrive::Error naming the value and the accepted range") {
  using index::ProductQuant;
  using index::SimHash;
  CHECK_THROWS_WITH_AS((SimHash({.K = 0})), doctest::Contains("K (bits per table) is 0; expected 1 to 64"), Error);
  CHECK_THROWS_WITH_AS((SimHash({.K = 65})), doctest::Contains("K (bits per table) is 65"), Error);
  CHECK_THROWS_WITH_AS((SimHash({.K = 10, .L = 0})), doctest::Contains("L (tables) is 0; expected 1 to 1024"), Error);
  CHECK_THROWS_WITH_AS((SimHash({.K = 10, .L = 1025})), doctest::Contains("L (tables) is 1025"), Error);
  CHECK_NOTHROW((SimHash({.K = 64, .L = 1024})));
  CHECK_THROWS_WITH_AS((ProductQuant({.M = 0})), doctest::Contains("M (subspaces) is 0"), Error);
  CHECK_THROWS_WITH_AS((ProductQuant({.M = 2000})), doctest::Contains("M (subspaces) is 2000"), Error);
  CHECK_THROWS_WITH_AS((ProductQuant({.C = 0})), doctest::Contains("C (codewords per subspace) is 0; expected 1 to 256"), Error);
  CHECK_THROWS_WITH_AS((ProductQuant({.C = 257})), doctest::Contains("C (codewords per subspace) is 257"), Error);
  CHECK_THROWS_WITH_AS((ProductQuant({.train_pages = 0})), doctest::Contains("train_pages is 0"), Error);
  CHECK_THROWS_WITH_AS((ProductQuant({.first_train_pages = -1})), doctest::Contains("first_train_pages is -1"), Error);
  CHECK_THROWS_WITH_AS((ProductQuant({.iterations = -1})), doctest::Contains("iterations is -1"), Error);
  CHECK_THROWS_WITH_AS((ProductQuant({.M = 12}).check(64)), doctest::Contains("M = 12 subspaces do not divide head_dim 64"), Error);
  CHECK_NOTHROW((ProductQuant({.M = 16}).check(128)));

  const std::vector<float> pts = test::random_floats(10 * 8, 1);
  CHECK_THROWS_WITH_AS((index::pq::train(pts.data(), 10, 8, 3, 4)), doctest::Contains("3 subspaces do not divide dimension 8"), Error);
  CHECK_THROWS_WITH_AS((index::pq::train(pts.data(), 10, 8, 2, 11)),
                       doctest::Contains("codebook of 11 codewords is larger than the 10 training points"), Error);
  CHECK_THROWS_WITH_AS((index::pq::train(pts.data(), 10, 8, 2, 300)), doctest::Contains("300 codewords per subspace; expected 1 to 256"), Error);
  CHECK_NOTHROW((index::pq::train(pts.data(), 10, 8, 2, 10)));

  // build() never throws: an M that does not divide head_dim falls back to its largest divisor below M.
  const Stream s = random_stream(40, 2, 64, 1, 3);
  const ProductQuant pq({.M = 12, .C = 8, .train_pages = 16});
  ProductQuant::State st;
  CHECK_NOTHROW(pq.build(st, s.all()));
  CHECK(st.subspaces == 8);
  CHECK(st.trained());
  check_selection(pick(pq, st, query_for(s, 0, 40, 4)), query_for(s, 0, 40, 4));
}

TEST_CASE("f16 and bf16 KV dtypes: the index data halves, selections stay good") {
  const int pages = 512, pt = 8, d = 64, budget = 32;
  Stream s = topic_stream(pages, pt, d, 4, 2024);
  const auto q = query_for(s, 0, pages, budget);
  const index::SimHash sh;
  const index::ProductQuant pq({.M = 16, .C = 128, .train_pages = 256});
  std::size_t sh_f32 = 0, pq_f32 = 0, pq_pending_f32 = 0;
  double r_sh_f32 = 0, r_pq_f32 = 0;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    s.dtype = t;
    index::SimHash::State sst;
    sh.build(sst, s.all());
    index::ProductQuant::State pst, pending;
    pq.build(pst, s.all());
    pq.build(pending, s.range(0, 100));
    REQUIRE(pst.trained());
    CHECK(sst.planes.dtype() == t);
    CHECK(sst.norms.dtype() == t);
    CHECK(pst.codebook.dtype() == t);
    const std::size_t esize = dtype_size(t);
    CHECK(sh.bytes(sst) == static_cast<std::size_t>(sh.bits()) * d * esize + pages * 24u * 8 + pages * esize);
    CHECK(pq.bytes(pst) == 128u * d * esize + pages * 16u);
    CHECK(pq.bytes(pending) == 100u * d * esize);
    const double r_sh = mean_mass_recall(s, pick(sh, sst, q)), r_pq = mean_mass_recall(s, pick(pq, pst, q));
    MESSAGE(dtype_name(t) << ": mass recall simhash " << r_sh << ", product-quant " << r_pq);
    if (t == DType::f32) {
      sh_f32 = sst.planes.bytes() + sst.norms.bytes();
      pq_f32 = pst.codebook.bytes();
      pq_pending_f32 = pq.bytes(pending);
      r_sh_f32 = r_sh;
      r_pq_f32 = r_pq;
    } else {
      CHECK(sst.planes.bytes() + sst.norms.bytes() == sh_f32 / 2);  // the sign bits do not shrink
      CHECK(pst.codebook.bytes() == pq_f32 / 2);                    // nor do the codes
      CHECK(pq.bytes(pending) == pq_pending_f32 / 2);
      CHECK(r_sh > 0.9 * r_sh_f32);
      CHECK(r_pq > 0.9 * r_pq_f32);
    }
  }
}
