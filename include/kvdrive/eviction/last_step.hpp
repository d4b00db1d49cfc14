// eviction::LastStep: the cache holds exactly the previous step's critical pages (W = 1): a hit
// is a page selected two steps in a row. Warm-up pages count as step 0's selection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

struct LastStep {
  static constexpr int kFixedWindow = 1;

  using State = CacheEntries;

  static constexpr std::string_view name() { return "last-step"; }
  int default_window() const { return kFixedWindow; }
  bool contains(const State& s, std::uint32_t page) const { return s.contains(page); }
  std::size_t size(const State& s) const { return s.size(); }

  void update(State& s, const CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    s.touch(u);
    s.drop_if([&](const CacheEntry& e) { return e.last_step < u.step; }, evicted);
    // Only when a step selects more than the capacity: the most attended stay.
    s.drop_least(
        u.capacity, [](const CacheEntry& e) { return std::pair(e.score, ~e.page); }, evicted);
  }
};
static_assert(EvictionPolicy<LastStep>);

}  // namespace kvdrive::eviction
