// index::Quest (Tang et al., 2024): per page and channel, the minimum and maximum key. For a
// query q the page's score is sum_i max(q_i min_i, q_i max_i), an upper bound of q.k over the
// page's keys. Pages are ranked by the GQA rule (Decision 4) over the group's heads.
// The bounds are kept in float (2 x head_dim x 4 bytes per page); storing them in the KV dtype
// is the selection issue's refinement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/host_device.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/selection.hpp"

namespace kvdrive::index {

/// Quest's bound for one page: sum over channels of max(q_i lo_i, q_i hi_i).
KVD_HOST_DEVICE float quest_page_score(const float* q, const float* lo, const float* hi, int d) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < d; ++i) {
    const float a = q[i] * lo[i], b = q[i] * hi[i];
    part[i & 7] += a > b ? a : b;
  }
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

struct Quest {
  struct State {
    RowStore lo, hi;  ///< a row of head_dim per page
    std::int64_t pages = 0;
    int head_dim = 0;
  };

  static constexpr std::string_view name() { return "quest"; }

  void build(State& s, const PageKeys& k) const { append(s, k); }
  void append(State& s, const PageKeys& k) const {
    if (s.pages == 0) {
      s.head_dim = k.head_dim;
      s.lo = RowStore(static_cast<std::size_t>(k.head_dim));
      s.hi = RowStore(static_cast<std::size_t>(k.head_dim));
    }
    for (std::int64_t p = 0; p < k.pages; ++p) {
      const float* page = k.page(p);
      std::vector<float> lo(page, page + k.head_dim), hi(lo);
      for (int t = 1; t < k.page_tokens; ++t)
        for (int i = 0; i < k.head_dim; ++i) {
          const float x = page[static_cast<std::size_t>(t) * k.head_dim + i];
          lo[static_cast<std::size_t>(i)] = x < lo[static_cast<std::size_t>(i)] ? x : lo[static_cast<std::size_t>(i)];
          hi[static_cast<std::size_t>(i)] = x > hi[static_cast<std::size_t>(i)] ? x : hi[static_cast<std::size_t>(i)];
        }
      s.lo.push(lo.data());
      s.hi.push(hi.data());
      ++s.pages;
    }
  }
  std::size_t bytes(const State& s) const { return s.lo.bytes() + s.hi.bytes(); }

  void select(const State& s, const IndexQuery& q, std::vector<std::uint32_t>& out) const {
    const auto n = static_cast<std::size_t>(q.candidates());
    const int d = q.head_dim;
    thread_local std::vector<float> est, score;
    est.resize(static_cast<std::size_t>(q.group) * n);
    score.resize(n);
    for (int h = 0; h < q.group; ++h) {
      const float* qh = q.q + static_cast<std::size_t>(h) * d;
      float* eh = est.data() + static_cast<std::size_t>(h) * n;
      for (std::size_t i = 0; i < n; ++i) {
        const std::int64_t p = q.first_candidate + static_cast<std::int64_t>(i);
        eh[i] = bound(qh, s.lo.row(p), s.hi.row(p), d);
      }
    }
    gqa_scores(est.data(), q.group, n, score.data());
    top_pages(score, q.first_candidate, q.budget_pages, out);
  }

 private:
  static float bound(const float* q, const float* lo, const float* hi, int d) {
#if KVD_CPU_AVX2
    if (d % 8 == 0) {
      __m256 acc = _mm256_setzero_ps();
      for (int i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        acc = _mm256_add_ps(acc, _mm256_max_ps(_mm256_mul_ps(qv, _mm256_loadu_ps(lo + i)),
                                               _mm256_mul_ps(qv, _mm256_loadu_ps(hi + i))));
      }
      alignas(32) float part[8];
      _mm256_store_ps(part, acc);
      return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    }
#endif
    return quest_page_score(q, lo, hi, d);
  }
};
static_assert(IndexPolicy<Quest>);

}  // namespace kvdrive::index
