// Helpers shared by the index tests: a stream of page keys with its group's queries, the
// selection request for a candidate range, and the double-precision references (dot products,
// brute-force top pages, attention-mass recall) that selections are checked against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kvdrive/index/concept.hpp"

namespace kvdrive::test {

struct Stream {
  int pages, page_tokens, d, group;
  std::vector<float> keys;  // [pages][page_tokens][d]
  std::vector<float> q;     // [group][d]
  DType dtype = DType::f32;

  index::PageKeys range(int first, int n) const {
    return {keys.data() + static_cast<std::size_t>(first) * page_tokens * d, first, n, page_tokens, d, dtype};
  }
  index::PageKeys all() const { return range(0, pages); }
  index::PageKeys page_keys() const { return all(); }
};

inline double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int j = 0; j < d; ++j) s += static_cast<double>(a[j]) * b[j];
  return s;
}

/// Brute-force ranking: the k best scores (ties to the lower id), as ascending ids first + i.
inline std::vector<std::uint32_t> brute_top(const std::vector<double>& score, int first, int k) {
  std::vector<int> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
  std::vector<std::uint32_t> out;
  for (int i = 0; i < k; ++i) out.push_back(static_cast<std::uint32_t>(first + order[i]));
  std::sort(out.begin(), out.end());
  return out;
}

inline index::IndexQuery query_for(const Stream& s, std::int64_t first, std::int64_t end, std::int64_t budget) {
  index::IndexQuery q;
  q.q = s.q.data();
  q.group = s.group;
  q.head_dim = s.d;
  q.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  q.first_candidate = first;
  q.end_candidate = end;
  q.budget_pages = budget;
  return q;
}

/// Mean over heads of the attention mass (softmax over all pages' tokens) on `selected`.
inline double mean_mass_recall(const Stream& s, const std::vector<std::uint32_t>& selected) {
  double total = 0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  for (int h = 0; h < s.group; ++h) {
    const float* q = s.q.data() + static_cast<std::size_t>(h) * s.d;
    std::vector<double> w(static_cast<std::size_t>(s.pages) * s.page_tokens);
    double m = -INFINITY;
    for (std::size_t t = 0; t < w.size(); ++t) m = std::max(m, w[t] = dot(q, s.keys.data() + t * s.d, s.d) * scale);
    double z = 0;
    for (auto& x : w) z += (x = std::exp(x - m));
    double in = 0;
    for (std::uint32_t p : selected)
      for (int t = 0; t < s.page_tokens; ++t) in += w[static_cast<std::size_t>(p) * s.page_tokens + t];
    total += in / z;
  }
  return total / s.group;
}

}  // namespace kvdrive::test
