// Belady's clairvoyant cache: the upper bound on hit rate at a given capacity. It knows every
// future selection; after each step it keeps, among the cached pages and the step's pages,
// those needed again soonest, up to the capacity, and drops pages never needed again (MIN with
// optional admission, optimal for equal-size pages). With warm-up it starts from the pages
// first needed soonest: a clairvoyant warm-up, so the figure stays an upper bound.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/eval/cache_replay.hpp"

namespace kvdrive::eval {

inline CacheTally replay_belady(const SelectionLog& log, const ReplaySettings& set) {
  set.validate();
  constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();
  const std::size_t n = log.steps();
  // next[k]: the next step after entry k's step that selects the same page.
  std::vector<std::size_t> next(log.pages.size(), kNever);
  std::unordered_map<std::uint32_t, std::size_t> upcoming;  // page -> next step that selects it
  for (std::size_t s = n; s-- > 0;)
    for (std::size_t k = log.begin[s]; k < log.begin[s + 1]; ++k) {
      auto [it, fresh] = upcoming.try_emplace(log.pages[k], s);
      if (!fresh) {
        next[k] = it->second;
        it->second = s;
      }
    }
  // cache: page -> the step it is needed next (> the current step).
  std::unordered_map<std::uint32_t, std::size_t> cache;
  std::vector<std::pair<std::size_t, std::uint32_t>> pool;  // (next use, page)
  const auto keep_soonest = [&](std::size_t capacity, CacheTally& t, bool count_evictions) {
    std::sort(pool.begin(), pool.end());
    std::unordered_map<std::uint32_t, std::size_t> kept;
    for (const auto& [use, page] : pool)
      if (use != kNever && kept.size() < capacity) kept.emplace(page, use);
    if (count_evictions)
      for (const auto& [page, use] : cache) t.evictions += kept.count(page) ? 0 : 1;
    cache.swap(kept);
  };
  CacheTally t;
  if (set.warm_up && n > 0) {
    pool.clear();
    for (const auto& [page, first] : upcoming) pool.emplace_back(first, page);
    keep_soonest(set.capacity(log.budget[0]), t, false);
    t.warm_pages = cache.size();
  }
  for (std::size_t s = 0; s < n; ++s) {
    pool.clear();
    for (std::size_t k = log.begin[s]; k < log.begin[s + 1]; ++k) {
      const std::uint32_t page = log.pages[k];
      if (cache.count(page)) ++t.hits;
      ++t.selected;
      pool.emplace_back(next[k], page);
    }
    t.misses = t.selected - t.hits;
    for (const auto& [page, use] : cache)
      if (use > s) pool.emplace_back(use, page);  // the step's own pages were added above
    keep_soonest(set.capacity(log.budget[s]), t, true);
    t.max_cached = std::max<std::uint64_t>(t.max_cached, cache.size());
    ++t.steps;
  }
  return t;
}

}  // namespace kvdrive::eval
