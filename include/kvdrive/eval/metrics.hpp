// Quality metrics of a sparse selection, computed against full attention:
//   topk_recall     |selected ∩ true top-k| / k
//   MassRecall      per query head, the attention mass (softmax over every token) that falls on
//                   the attended pages; mean and minimum over the group. 1 - mass recall is the
//                   total variation distance between the full and the truncated distributions.
//   relative_error  ||sparse output - dense output|| / ||dense output||
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive::eval {

inline double topk_recall(std::span<const std::uint32_t> selected, std::span<const std::uint32_t> truth) {
  if (truth.empty()) return 1.0;
  std::vector<std::uint32_t> a(selected.begin(), selected.end()), b(truth.begin(), truth.end());
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<std::uint32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(b.size());
}

struct MassRecall {
  double mean = 0, min = 0;
};

/// page_lse: [pages][group], each page's log-sum-exp per query head over ALL pages of the
/// stream (dense attention's per-page output); lse: [group], the total. attended: page ids.
inline MassRecall mass_recall(std::span<const float> page_lse, std::span<const float> lse, int group, std::span<const std::uint32_t> attended) {
  KVD_EXPECT(group > 0 && page_lse.size() % static_cast<std::size_t>(group) == 0 && lse.size() == static_cast<std::size_t>(group),
             "mass_recall: page_lse has {} values, lse {}, for a group of {}", page_lse.size(), lse.size(), group);
  const std::size_t pages = page_lse.size() / static_cast<std::size_t>(group);
  MassRecall r{0, 1};
  for (int h = 0; h < group; ++h) {
    double mass = 0;
    for (std::uint32_t p : attended) {
      KVD_EXPECT(p < pages, "mass_recall: page {} out of range [0, {})", p, pages);
      mass += std::exp(static_cast<double>(page_lse[p * static_cast<std::size_t>(group) + static_cast<std::size_t>(h)]) -
                       static_cast<double>(lse[static_cast<std::size_t>(h)]));
    }
    r.mean += mass / group;
    r.min = std::min(r.min, mass);
  }
  return r;
}

inline double relative_error(std::span<const float> out, std::span<const float> reference) {
  KVD_EXPECT(out.size() == reference.size(), "relative_error: {} values vs {}", out.size(), reference.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double d = static_cast<double>(out[i]) - reference[i];
    num += d * d;
    den += static_cast<double>(reference[i]) * reference[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace kvdrive::eval
