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

#include "kvdrive/attention/math.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

/// Keeps all sealed keys of a stream in float; shared by both oracles.
struct ExactKeys {
  std::vector<float> keys;  ///< [pages][page_tokens][head_dim]
  std::int64_t pages = 0;
  int page_tokens = 0;
  int head_dim = 0;

  void add(const PageKeys& k) {
    if (pages == 0) {
      page_tokens = k.page_tokens;
      head_dim = k.head_dim;
    }
    const float* end = k.page(k.pages);
    keys.insert(keys.end(), k.data, end);
    pages += k.pages;
  }
  const float* page(std::int64_t p) const {
    return keys.data() + static_cast<std::size_t>(p) * page_tokens * head_dim;
  }
  /// Scaled q.k of every token of page p for query head q_h, written to s[page_tokens].
  void scores(const float* q_h, float scale, std::int64_t p, float* s) const {
    const float* k = page(p);
    for (int t = 0; t < page_tokens; ++t)
      s[t] = attention::dot8(q_h, k + static_cast<std::size_t>(t) * head_dim, head_dim) * scale;
  }
};

struct Oracle {
  using State = ExactKeys;
  static constexpr std::string_view name() { return "oracle"; }

  void build(State& s, const PageKeys& k) const { s.add(k); }
  void append(State& s, const PageKeys& k) const { s.add(k); }
  std::size_t bytes(const State& s) const { return s.keys.size() * sizeof(float); }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const std::size_t n = static_cast<std::size_t>(q.candidates());
    std::vector<float> est(static_cast<std::size_t>(q.group) * n), tok(static_cast<std::size_t>(s.page_tokens));
    for (int h = 0; h < q.group; ++h)
      for (std::size_t i = 0; i < n; ++i) {
        s.scores(q.q + static_cast<std::size_t>(h) * q.head_dim, q.scale,
                 q.first_candidate + static_cast<std::int64_t>(i), tok.data());
        float best = tok[0];
        for (float v : tok) best = v > best ? v : best;
        est[static_cast<std::size_t>(h) * n + i] = best;
      }
    std::vector<float> score(n);
    gqa_scores(est.data(), q.group, n, score.data());
    top_pages(score, q.first_candidate, q.budget_pages, out);
  }
};
static_assert(IndexPolicy<Oracle>);

struct OracleMass {
  using State = ExactKeys;
  static constexpr std::string_view name() { return "oracle-mass"; }

  void build(State& s, const PageKeys& k) const { s.add(k); }
  void append(State& s, const PageKeys& k) const { s.add(k); }
  std::size_t bytes(const State& s) const { return s.keys.size() * sizeof(float); }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const std::size_t n = static_cast<std::size_t>(q.candidates());
    std::vector<float> page_lse(static_cast<std::size_t>(s.pages)), tok(static_cast<std::size_t>(s.page_tokens));
    std::vector<float> mass(n, 0.0f);
    for (int h = 0; h < q.group; ++h) {
      float total_m = attention::neg_inf(), total_l = 0.0f;
      for (std::int64_t p = 0; p < s.pages; ++p) {
        s.scores(q.q + static_cast<std::size_t>(h) * q.head_dim, q.scale, p, tok.data());
        float m = tok[0];
        for (float v : tok) m = v > m ? v : m;
        float l = 0.0f;
        for (float v : tok) l += attention::exp_shifted(v - m);
        page_lse[static_cast<std::size_t>(p)] = attention::partial_lse(m, l);
        const float mn = m > total_m ? m : total_m;
        total_l = total_l * attention::exp_shifted(total_m - mn) + l * attention::exp_shifted(m - mn);
        total_m = mn;
      }
      const float total = attention::partial_lse(total_m, total_l);
      for (std::size_t i = 0; i < n; ++i)
        mass[i] += attention::page_mass(page_lse[static_cast<std::size_t>(q.first_candidate) + i], total);
    }
    top_pages(mass, q.first_candidate, q.budget_pages, out);
  }
};
static_assert(IndexPolicy<OracleMass>);

}  // namespace kvdrive::index
