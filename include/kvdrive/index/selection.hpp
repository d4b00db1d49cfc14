// Shared selection rules every index uses (Decisions 3 and 4): the GQA page score, and a
// deterministic top-k over pages (ties go to the lower page id) returned in ascending order.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/host_device.hpp"
#include "kvdrive/index/concept.hpp"

namespace kvdrive::index {

/// GQA rule (Decision 4) for one page: max over the group's heads h of est[h] - head_max[h].
/// est and head_max are strided by `stride` between heads.
KVD_HOST_DEVICE float gqa_page_score(const float* est, const float* head_max, int group, std::size_t stride) {
  float best = -INFINITY;
  for (int h = 0; h < group; ++h) {
    const float e = est[static_cast<std::size_t>(h) * stride];
    const float v = e == head_max[h] ? 0.0f : e - head_max[h];  // +inf at the max scores 0, not NaN
    best = v > best ? v : best;
  }
  return best;
}

/// est: [group][n] per-head estimates of n pages; writes the GQA score of each page to out[n].
inline void gqa_scores(const float* est, int group, std::size_t n, float* out) {
  // The same arithmetic as gqa_page_score, head by head so each loop runs over contiguous pages:
  // NaN estimates are skipped, as there (AVX2's max keeps its second operand on NaN, which is
  // what `a > b ? a : b` does).
  for (std::size_t p = 0; p < n; ++p) out[p] = -INFINITY;
  for (int h = 0; h < group; ++h) {
    const float* e = est + static_cast<std::size_t>(h) * n;
    float m = -INFINITY;
    std::size_t p = 0;
#if KVD_CPU_AVX2
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; p + 8 <= n; p += 8) vm = _mm256_max_ps(_mm256_loadu_ps(e + p), vm);
    m = _mm256_cvtss_f32(attention::broadcast_max(vm));
#endif
    for (; p < n; ++p) m = e[p] > m ? e[p] : m;
    p = 0;
#if KVD_CPU_AVX2
    const __m256 vmax = _mm256_set1_ps(m), zero = _mm256_setzero_ps();
    for (; p + 8 <= n; p += 8) {
      const __m256 x = _mm256_loadu_ps(e + p);
      const __m256 v = _mm256_blendv_ps(_mm256_sub_ps(x, vmax), zero, _mm256_cmp_ps(x, vmax, _CMP_EQ_OQ));
      _mm256_storeu_ps(out + p, _mm256_max_ps(v, _mm256_loadu_ps(out + p)));
    }
#endif
    for (; p < n; ++p) {
      const float v = e[p] == m ? 0.0f : e[p] - m;
      out[p] = v > out[p] ? v : out[p];
    }
  }
}

/// A score as an unsigned integer in the same order (NaN as -inf, -0 as +0): a larger score, a
/// larger integer; equal scores, equal integers.
KVD_HOST_DEVICE std::uint32_t score_order(float s) {
  if (s != s) s = -INFINITY;
  if (s == 0.0f) s = 0.0f;
  std::uint32_t u;
  std::memcpy(&u, &s, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// The score whose score_order is u.
inline float score_of_order(std::uint32_t u) {
  u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
  float s;
  std::memcpy(&s, &u, sizeof s);
  return s;
}

/// The rank key of candidate i (within its stream) with GQA score s, for a top-k by sorting or
/// radix selection on any device: a larger key ranks higher; NaN ranks as -inf (lowest), -0 as
/// +0, and of equal scores the lower candidate ranks higher. Keys are unique per stream, and the
/// k largest are exactly the pages top_pages() keeps.
KVD_HOST_DEVICE std::uint64_t selection_key(float s, std::uint32_t i) {
  return (static_cast<std::uint64_t>(score_order(s)) << 32) | (0xFFFFFFFFu - i);
}

namespace detail {
/// NaN ranks lowest.
inline float rank_key(float s) { return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s; }

/// The k-th largest rank key of score (1 <= k <= n): the threshold a top-k keeps. A radix
/// selection on score_order: each pass takes the 8 bits from the highest bit in which the
/// remaining scores differ, counts their digits, keeps those with the k-th's digit, until they
/// are equal. No loop branches on the scores, where std::nth_element mispredicts about every
/// other comparison on fresh scores: the median of SmolLM2-shaped first-look scores (1,007 pages)
/// took it 11.6 us inside a select, this 3.7 us.
inline float kth_largest(std::span<const float> score, std::size_t k) {
  thread_local std::vector<std::uint32_t> keys_a, keys_b;
  std::vector<std::uint32_t>& a = keys_a;
  std::vector<std::uint32_t>& b = keys_b;
  std::size_t n = score.size();
  a.resize(n);
  b.resize(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = score_order(score[i]);
  std::uint32_t* cur = a.data();
  std::uint32_t* next = b.data();
  for (;;) {
    std::uint32_t lo = 0xFFFFFFFFu, hi = 0;
    for (std::size_t i = 0; i < n; ++i) lo = std::min(lo, cur[i]), hi = std::max(hi, cur[i]);
    if (lo == hi) return score_of_order(lo);
    // Every remaining key shares the bits above the highest in which lo and hi differ.
    const int shift = std::max(0, static_cast<int>(std::bit_width(lo ^ hi)) - 8);
    std::uint32_t counts[4][256] = {};  // four, so that equal digits in a row do not wait on each other's increment
    std::size_t at = 0;
    for (; at + 4 <= n; at += 4)
      for (std::size_t j = 0; j < 4; ++j) ++counts[j][(cur[at + j] >> shift) & 0xFFu];
    for (; at < n; ++at) ++counts[0][(cur[at] >> shift) & 0xFFu];
    std::uint32_t hist[256];
    for (std::size_t d = 0; d < 256; ++d) hist[d] = counts[0][d] + counts[1][d] + counts[2][d] + counts[3][d];
    std::uint32_t digit = 255;
    for (; hist[digit] < k; --digit) k -= hist[digit];
    std::size_t kept = 0;  // lo's and hi's digits differ, so some key always goes
    for (std::size_t i = 0; i < n; ++i) {
      next[kept] = cur[i];
      kept += ((cur[i] >> shift) & 0xFFu) == digit;
    }
    std::swap(cur, next);
    n = kept;
  }
}
}  // namespace detail

/// The k pages with the highest score (NaN counts as lowest; ties to the lower page id), as
/// ascending page ids first_page + i appended to out. A selection by threshold: the k-th
/// largest score, then one pass in page order, so no sort of the result is needed.
inline void top_pages(std::span<const float> score, std::int64_t first_page, std::int64_t k, std::vector<std::uint32_t>& out) {
  const std::size_t n = score.size();
  const std::size_t take = static_cast<std::size_t>(std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(n)));
  if (take == n) {
    for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::uint32_t>(first_page + static_cast<std::int64_t>(i)));
    return;
  }
  if (take == 0) return;
  const float thr = detail::kth_largest(score, take);
  std::size_t above = 0;
  for (std::size_t i = 0; i < n; ++i) above += detail::rank_key(score[i]) > thr;
  std::size_t ties = take - above;  // pages at the threshold that fit, lowest ids first
  // Every page is written and the end moves on for those kept: no branch on the scores, which
  // would go either way about as often as a pool keeps half of them.
  const std::size_t at = out.size();
  out.resize(at + n);
  std::uint32_t* dst = out.data() + at;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float key = detail::rank_key(score[i]);
    const std::size_t tie = (key == thr) & (ties > 0);
    ties -= tie;
    dst[kept] = static_cast<std::uint32_t>(first_page + static_cast<std::int64_t>(i));
    kept += static_cast<std::size_t>(key > thr) | tie;
  }
  out.resize(at + kept);
}

/// Like top_pages for scores of arbitrary pages: the k best of (score[i], pages[i]) (NaN lowest,
/// ties to the lower page id), appended to out as ascending page ids.
inline void top_pages_of(std::span<const float> score, std::span<const std::uint32_t> pages, std::int64_t k, std::vector<std::uint32_t>& out) {
  const std::size_t n = score.size();
  const std::size_t take = static_cast<std::size_t>(std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(n)));
  if (take == 0) return;
  const std::size_t at = out.size();
  const float thr = detail::kth_largest(score, take);
  thread_local std::vector<std::uint32_t> tied;
  tied.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const float key = detail::rank_key(score[i]);
    if (key > thr) out.push_back(pages[i]);
    else if (key == thr) tied.push_back(pages[i]);
  }
  const std::size_t need = take - (out.size() - at);
  std::partial_sort(tied.begin(), tied.begin() + static_cast<std::ptrdiff_t>(need), tied.end());
  out.insert(out.end(), tied.begin(), tied.begin() + static_cast<std::ptrdiff_t>(need));
  std::sort(out.begin() + static_cast<std::ptrdiff_t>(at), out.end());
}

/// The start of a select() that does not score every candidate: when the budget covers them
/// all, appends every candidate (ascending) to out and returns true.
inline bool select_all_within_budget(const IndexQuery& q, std::vector<std::uint32_t>& out) {
  if (q.budget_pages < q.candidates()) return false;
  for (std::int64_t p = q.first_candidate; p < q.end_candidate; ++p) out.push_back(static_cast<std::uint32_t>(p));
  return true;
}

/// order = 0 .. score.size() - 1, best score first (NaN lowest; ties to the lower index): the
/// order in which a clustered index visits its clusters. Sorted as selection keys (one integer
/// per entry, the same order).
inline void order_by_score(std::span<const float> score, std::vector<std::uint32_t>& order) {
  thread_local std::vector<std::uint64_t> keys;
  const std::size_t n = score.size();
  keys.resize(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = selection_key(score[i], static_cast<std::uint32_t>(i));
  std::sort(keys.begin(), keys.end(), std::greater<std::uint64_t>());
  order.resize(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = 0xFFFFFFFFu - static_cast<std::uint32_t>(keys[i]);
}

/// The select() of an index that estimates every candidate page: estimate(est) fills
/// est[h * n + i] with head h's estimate for candidate i (n = q.candidates()); the GQA rule and
/// the top-k follow.
template <class Estimate>
void select_by_estimates(const IndexQuery& q, std::vector<std::uint32_t>& out, Estimate&& estimate) {
  const auto n = static_cast<std::size_t>(q.candidates());
  thread_local std::vector<float> est, score;
  est.resize(static_cast<std::size_t>(q.group) * n);
  score.resize(n);
  estimate(est.data());
  gqa_scores(est.data(), q.group, n, score.data());
  top_pages(score, q.first_candidate, q.budget_pages, out);
}

}  // namespace kvdrive::index
