// Sparse decode attention against a double-precision reference, and the shared merge math.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

template <class T>
void check_against_reference(int group, int d, int page_tokens, int tokens, std::uint64_t seed) {
  CAPTURE(group);
  CAPTURE(d);
  CAPTURE(page_tokens);
  CAPTURE(tokens);
  CAPTURE(dtype_name(dtype_of<T>));
  const auto kf = test::random_floats(static_cast<std::size_t>(tokens) * d, seed);
  const auto vf = test::random_floats(static_cast<std::size_t>(tokens) * d, seed + 1);
  const auto q = test::random_floats(static_cast<std::size_t>(group) * d, seed + 2, 0.5f);
  // Pages in scattered memory: each page is its own allocation, K block then V block.
  const int pages = (tokens + page_tokens - 1) / page_tokens;
  std::vector<std::vector<T>> storage(static_cast<std::size_t>(pages));
  std::vector<float> kr(kf.size()), vr(vf.size());  // the stored values, rounded to T
  std::vector<attention::PageRef> refs;
  for (int p = 0; p < pages; ++p) {
    const int n = std::min(page_tokens, tokens - p * page_tokens);
    auto& buf = storage[static_cast<std::size_t>(p)];
    buf.resize(2 * static_cast<std::size_t>(page_tokens) * d);
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < d; ++j) {
        const std::size_t src = static_cast<std::size_t>(p * page_tokens + t) * d + j;
        buf[static_cast<std::size_t>(t) * d + j] = from_float<T>(kf[src]);
        buf[static_cast<std::size_t>(page_tokens + t) * d + j] = from_float<T>(vf[src]);
        kr[src] = to_float(buf[static_cast<std::size_t>(t) * d + j]);
        vr[src] = to_float(buf[static_cast<std::size_t>(page_tokens + t) * d + j]);
      }
    refs.push_back({buf.data(), buf.data() + static_cast<std::size_t>(page_tokens) * d, n});
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> out(static_cast<std::size_t>(group) * d), lse(static_cast<std::size_t>(group)),
      page_lse(static_cast<std::size_t>(pages) * group);
  attention::DecodeArgs a;
  a.q = q.data();
  a.group = group;
  a.head_dim = d;
  a.scale = scale;
  a.pages = refs;
  a.out = out.data();
  a.lse = lse.data();
  a.page_lse = page_lse.data();
  attention::sparse_decode<T>(a);

  for (int h = 0; h < group; ++h) {
    std::vector<const float*> ks, vs;
    for (int t = 0; t < tokens; ++t) {
      ks.push_back(kr.data() + static_cast<std::size_t>(t) * d);
      vs.push_back(vr.data() + static_cast<std::size_t>(t) * d);
    }
    double ref_lse;
    const auto ref = test::reference_attention(q.data() + static_cast<std::size_t>(h) * d, ks, vs, d, scale, &ref_lse);
    double max_err = 0, max_ref = 0;
    for (int j = 0; j < d; ++j) {
      max_err = std::max(max_err, std::fabs(ref[j] - out[static_cast<std::size_t>(h) * d + j]));
      max_ref = std::max(max_ref, std::fabs(ref[j]));
    }
    CHECK(max_err <= 2e-5 * std::max(1.0, max_ref));
    CHECK(std::fabs(ref_lse - lse[h]) <= 2e-5 * std::max(1.0, std::fabs(ref_lse)));
    // Each page's log-sum-exp against the reference over that page's tokens.
    for (int p = 0; p < pages; ++p) {
      const int first = p * page_tokens, n = std::min(page_tokens, tokens - first);
      double plse;
      test::reference_attention(q.data() + static_cast<std::size_t>(h) * d, std::vector<const float*>(ks.begin() + first, ks.begin() + first + n),
                                std::vector<const float*>(vs.begin() + first, vs.begin() + first + n), d, scale, &plse);
      REQUIRE(std::fabs(plse - page_lse[static_cast<std::size_t>(p) * group + h]) <= 2e-5 * std::max(1.0, std::fabs(plse)));
    }
  }
}

}  // namespace

TEST_CASE("sparse decode attention matches a double-precision reference") {
  std::mt19937 rng(3);
  const int rounds = 4 * test::scale();
  std::uint64_t seed = 100;
  // head_dim 36 is not a multiple of 8: it takes the portable loops even in SIMD builds.
  for (int group : {1, 3, 4, 6, 8})
    for (int d : {64, 128, 36})
      for (int r = 0; r < rounds; ++r) {
        const int page_tokens = 1 + static_cast<int>(rng() % 16);
        const int tokens = 1 + static_cast<int>(rng() % 300);  // mostly not a page multiple
        check_against_reference<float>(group, d, page_tokens, tokens, seed++);
        check_against_reference<half>(group, d, page_tokens, tokens, seed++);
        check_against_reference<bfloat16>(group, d, page_tokens, tokens, seed++);
      }
}

TEST_CASE("sparse decode attention of a GQA group is each head's attention alone, bit for bit") {
  // The CPU loops block heads and tokens differently per group size (2 x 4, 3 x 2, 1 x 8); each
  // score and each output element is still one accumulator summed in the same order.
  for (int group : {2, 3, 4, 5, 6, 8})
    for (int d : {64, 36}) {
      CAPTURE(group);
      CAPTURE(d);
      const int page_tokens = 8, tokens = 203, pages = (tokens + page_tokens - 1) / page_tokens;
      const auto k = test::random_floats(static_cast<std::size_t>(tokens) * d, 7);
      const auto v = test::random_floats(static_cast<std::size_t>(tokens) * d, 8);
      const auto q = test::random_floats(static_cast<std::size_t>(group) * d, 9, 0.5f);
      std::vector<half> kh(k.size()), vh(v.size());
      for (std::size_t i = 0; i < k.size(); ++i) kh[i] = half(k[i]), vh[i] = half(v[i]);
      std::vector<attention::PageRef> refs;
      for (int p = 0; p < pages; ++p)
        refs.push_back({kh.data() + static_cast<std::size_t>(p) * page_tokens * d, vh.data() + static_cast<std::size_t>(p) * page_tokens * d,
                        std::min(page_tokens, tokens - p * page_tokens)});
      const auto attend = [&](const float* qs, int g, std::vector<float>& out, std::vector<float>& lse, std::vector<float>& plse) {
        out.assign(static_cast<std::size_t>(g) * d, 0.0f);
        lse.assign(static_cast<std::size_t>(g), 0.0f);
        plse.assign(static_cast<std::size_t>(pages) * g, 0.0f);
        attention::DecodeArgs a;
        a.q = qs;
        a.group = g;
        a.head_dim = d;
        a.scale = 0.125f;
        a.pages = refs;
        a.out = out.data();
        a.lse = lse.data();
        a.page_lse = plse.data();
        attention::sparse_decode<half>(a);
      };
      std::vector<float> out, lse, plse, out1, lse1, plse1;
      attend(q.data(), group, out, lse, plse);
      for (int h = 0; h < group; ++h) {
        attend(q.data() + static_cast<std::size_t>(h) * d, 1, out1, lse1, plse1);
        CHECK(std::memcmp(out1.data(), out.data() + static_cast<std::size_t>(h) * d, static_cast<std::size_t>(d) * sizeof(float)) == 0);
        CHECK(lse1[0] == lse[static_cast<std::size_t>(h)]);
        for (int p = 0; p < pages; ++p) REQUIRE(plse1[static_cast<std::size_t>(p)] == plse[static_cast<std::size_t>(p) * group + h]);
      }
    }
}

TEST_CASE("sparse decode attention is stable for large scores") {
  // Scores around 1e4 would overflow a naive exp; the log-sum-exp form must not.
  const int d = 64, tokens = 40;
  std::vector<float> k(static_cast<std::size_t>(tokens) * d, 0.0f), v(k.size());
  std::vector<float> q(static_cast<std::size_t>(d), 0.0f);
  q[0] = 100.0f;
  for (int t = 0; t < tokens; ++t) {
    k[static_cast<std::size_t>(t) * d] = 800.0f + static_cast<float>(t);
    v[static_cast<std::size_t>(t) * d + 1] = static_cast<float>(t);
  }
  std::vector<attention::PageRef> refs;
  std::vector<std::vector<float>> pages;
  for (int p = 0; p < tokens / 8; ++p) {
    std::vector<float> buf(2 * 8 * d);
    std::copy_n(k.data() + static_cast<std::size_t>(p) * 8 * d, 8 * d, buf.data());
    std::copy_n(v.data() + static_cast<std::size_t>(p) * 8 * d, 8 * d, buf.data() + 8 * d);
    pages.push_back(std::move(buf));
  }
  for (auto& b : pages) refs.push_back({b.data(), b.data() + 8 * d, 8});
  std::vector<float> out(d), lse(1);
  attention::DecodeArgs a;
  a.q = q.data();
  a.head_dim = d;
  a.scale = 1.0f / 8.0f;
  a.pages = refs;
  a.out = out.data();
  a.lse = lse.data();
  attention::sparse_decode<float>(a);
  CHECK(std::isfinite(lse[0]));
  // Score step between tokens is 100/8 = 12.5, so the last token carries essentially all mass.
  CHECK(out[1] == doctest::Approx(39.0).epsilon(1e-4));
}

TEST_CASE("merge_splits: splits of 8 pages attended apart and merged in order give the whole list's attention") {
  const int d = 32, g = 4, pt = 8;
  for (int pages : {1, 7, 8, 9, 30}) {
    CAPTURE(pages);
    const auto q = test::random_floats(static_cast<std::size_t>(g) * d, 5);
    std::vector<std::vector<float>> data;
    std::vector<attention::PageRef> refs;
    for (int p = 0; p < pages; ++p) {
      data.push_back(test::random_floats(2 * static_cast<std::size_t>(pt) * d, 100 + p));
      refs.push_back({data.back().data(), data.back().data() + pt * d, p + 1 == pages ? 3 : pt});
    }
    attention::DecodeArgs a;
    a.q = q.data();
    a.group = g;
    a.head_dim = d;
    a.scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> out(static_cast<std::size_t>(g) * d), lse(g);
    a.pages = refs;
    a.out = out.data();
    a.lse = lse.data();
    attention::sparse_decode<float>(a);
    const std::size_t splits = attention::split_count(refs.size());
    CHECK(splits == (static_cast<std::size_t>(pages) + 7) / 8);
    std::vector<float> outs(splits * g * d), lses(splits * g), merged(out.size()), merged_lse(g);
    for (std::size_t sp = splits; sp-- > 0;) {  // in any order: only the merge is ordered
      const std::size_t first = sp * attention::kSplitPages, n = std::min(attention::kSplitPages, refs.size() - first);
      attention::DecodeArgs sa = a;
      sa.pages = std::span<const attention::PageRef>(refs).subspan(first, n);
      sa.out = outs.data() + sp * g * d;
      sa.lse = lses.data() + sp * g;
      attention::sparse_decode<float>(sa);
    }
    attention::merge_splits(g, d, splits, outs.data(), lses.data(), merged.data(), merged_lse.data());
    for (std::size_t i = 0; i < out.size(); ++i) CHECK(merged[i] == doctest::Approx(out[i]).epsilon(1e-5));
    for (int h = 0; h < g; ++h) CHECK(merged_lse[h] == doctest::Approx(lse[h]).epsilon(1e-5));
  }
}

TEST_CASE("merge_partial: two halves merge into the whole") {
  const int d = 16, n = 30;
  const auto q = test::random_floats(d, 1);
  const auto k = test::random_floats(static_cast<std::size_t>(n) * d, 2);
  const auto v = test::random_floats(static_cast<std::size_t>(n) * d, 3);
  auto partial = [&](int first, int last, float& m, float& l, std::vector<float>& acc) {
    m = attention::neg_inf();
    l = 0;
    acc.assign(d, 0.0f);
    for (int t = first; t < last; ++t) m = std::max(m, attention::dot8(q.data(), k.data() + t * d, d));
    for (int t = first; t < last; ++t) {
      const float w = attention::exp_shifted(attention::dot8(q.data(), k.data() + t * d, d) - m);
      l += w;
      for (int j = 0; j < d; ++j) acc[j] += w * v[static_cast<std::size_t>(t) * d + j];
    }
  };
  float m1, l1, m2, l2;
  std::vector<float> a1, a2;
  partial(0, 11, m1, l1, a1);
  partial(11, n, m2, l2, a2);
  attention::merge_partial(m1, l1, a1.data(), m2, l2, a2.data(), d);
  std::vector<const float*> ks, vs;
  for (int t = 0; t < n; ++t) {
    ks.push_back(k.data() + t * d);
    vs.push_back(v.data() + t * d);
  }
  double ref_lse;
  const auto ref = test::reference_attention(q.data(), ks, vs, d, 1.0, &ref_lse);
  for (int j = 0; j < d; ++j) CHECK(a1[j] / l1 == doctest::Approx(ref[j]).epsilon(1e-5));
  CHECK(attention::partial_lse(m1, l1) == doctest::Approx(ref_lse).epsilon(1e-5));
  // Merging an empty partial changes nothing.
  const float m_before = m1, l_before = l1;
  attention::merge_partial(m1, l1, a1.data(), attention::neg_inf(), 0.0f, a2.data(), d);
  CHECK(m1 == m_before);
  CHECK(l1 == l_before);
}

TEST_CASE("exp_rank (and exp_rank8 where built) is within 1e-5 of exp on x <= 0, and tiny below -87") {
  double worst = 0;
  std::vector<float> xs;
  for (int i = 0; i <= 200000; ++i) xs.push_back(-87.0f * static_cast<float>(i) / 200000.0f);
  for (const float x : xs) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(attention::exp_rank(x) - ref) / ref);
  }
  CHECK(worst < 1e-5);  // 3e-6 from the polynomial, the rest from rounding x log2 e near -126
  CHECK(worst > 1e-7);  // the cheap polynomial, not a copy of exp_shifted
  CHECK(attention::exp_rank(0.0f) == 1.0f);
  CHECK(attention::exp_rank(2.0f) == 1.0f);  // x > 0 is clamped, as exp_shifted's: callers pass score - max
  for (const float x : {-88.0f, -1000.0f, -INFINITY, NAN}) {
    CHECK(attention::exp_rank(x) >= 0.0f);
    CHECK(attention::exp_rank(x) < 2e-38f);
  }
#if KVD_CPU_AVX2
  xs.insert(xs.end(), {-88.0f, -1000.0f, -INFINITY, NAN, -0.5f * 0.693147f, -1.5f * 0.693147f, 2.0f});
  while (xs.size() % 8) xs.push_back(-1.0f);
  for (std::size_t i = 0; i < xs.size(); i += 8) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, attention::exp_rank8(_mm256_loadu_ps(xs.data() + i)));
    for (int j = 0; j < 8; ++j) {
      const float one = attention::exp_rank(xs[i + static_cast<std::size_t>(j)]);
      CHECK(std::fabs(lanes[j] - one) <= 2e-7f * one);  // the same split; FMA contraction may differ in the last bit
    }
  }
#endif
}

TEST_CASE("exp_shifted and log_positive are within a few ulp of the C library") {
  double worst_exp = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f * static_cast<float>(i) / 200000.0f;
    const double ref = std::exp(static_cast<double>(x));
    const double got = attention::exp_shifted(x);
    worst_exp = std::max(worst_exp, std::fabs(got - ref) / ref);
  }
  CHECK(worst_exp < 4e-7);  // about 3 ulp of float
  CHECK(attention::exp_shifted(0.0f) == 1.0f);
  CHECK(attention::exp_shifted(-INFINITY) == 0.0f);
  CHECK(attention::exp_shifted(-1000.0f) == 0.0f);
  CHECK(attention::exp_shifted(1e-3f) == 1.0f);  // x > 0 is clamped: callers pass score - max

  std::mt19937 rng(9);
  std::uniform_real_distribution<float> e(-30.0f, 30.0f);
  double worst_log = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::pow(10.0f, e(rng));
    const double ref = std::log(static_cast<double>(x));
    worst_log = std::max(worst_log, std::fabs(attention::log_positive(x) - ref) / std::max(1.0, std::fabs(ref)));
  }
  CHECK(worst_log < 3e-7);
  CHECK(attention::log_positive(1.0f) == 0.0f);
  CHECK(attention::partial_lse(2.0f, 0.0f) == -INFINITY);
}
