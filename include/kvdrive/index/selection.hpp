// Shared selection rules every index uses (Decisions 3 and 4): the GQA page score, and a
// deterministic top-k over pages (ties go to the lower page id) returned in ascending order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive::index {

/// GQA rule (Decision 4) for one page: max over the group's heads h of est[h] - head_max[h].
/// est and head_max are strided by `stride` between heads.
KVD_HOST_DEVICE float gqa_page_score(const float* est, const float* head_max, int group,
                                     std::size_t stride) {
  float best = -INFINITY;
  for (int h = 0; h < group; ++h) {
    const float v = est[static_cast<std::size_t>(h) * stride] - head_max[h];
    best = v > best ? v : best;
  }
  return best;
}

/// est: [group][n] per-head estimates of n pages; writes the GQA score of each page to out[n].
inline void gqa_scores(const float* est, int group, std::size_t n, float* out) {
  std::vector<float> head_max(static_cast<std::size_t>(group), -INFINITY);
  for (int h = 0; h < group; ++h)
    for (std::size_t p = 0; p < n; ++p)
      head_max[h] = std::max(head_max[h], est[static_cast<std::size_t>(h) * n + p]);
  for (std::size_t p = 0; p < n; ++p) out[p] = gqa_page_score(est + p, head_max.data(), group, n);
}

/// The k pages with the highest score (NaN counts as lowest; ties to the lower page id), as
/// ascending page ids first_page + i appended to out.
inline void top_pages(std::span<const float> score, std::int64_t first_page, std::int64_t k,
                      std::vector<std::uint32_t>& out) {
  const std::size_t n = score.size();
  const std::size_t take = static_cast<std::size_t>(std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(n)));
  if (take == n) {
    for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::uint32_t>(first_page + i));
    return;
  }
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  auto key = [&](std::uint32_t i) {
    const float s = score[i];
    return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
  };
  auto better = [&](std::uint32_t a, std::uint32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  };
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take), order.end(), better);
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take));
  for (std::size_t i = 0; i < take; ++i)
    out.push_back(static_cast<std::uint32_t>(first_page + order[i]));
}

/// Like top_pages for scores of arbitrary pages: the k best of (score[i], pages[i]) (NaN lowest,
/// ties to the lower page id), appended to out as ascending page ids.
inline void top_pages_of(std::span<const float> score, std::span<const std::uint32_t> pages, std::int64_t k,
                         std::vector<std::uint32_t>& out) {
  const std::size_t n = score.size();
  const std::size_t take = static_cast<std::size_t>(std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(n)));
  thread_local std::vector<std::uint32_t> order;
  order.resize(n);
  std::iota(order.begin(), order.end(), 0u);
  auto key = [&](std::uint32_t i) {
    const float s = score[i];
    return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
  };
  auto better = [&](std::uint32_t a, std::uint32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && pages[a] < pages[b]);
  };
  if (take < n) std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take), order.end(), better);
  const std::size_t at = out.size();
  for (std::size_t i = 0; i < take; ++i) out.push_back(pages[order[i]]);
  std::sort(out.begin() + static_cast<std::ptrdiff_t>(at), out.end());
}

}  // namespace kvdrive::index
