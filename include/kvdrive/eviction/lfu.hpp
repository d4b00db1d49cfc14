// eviction::Lfu: the pages selected least often since they entered the cache leave first
// (ties: the less recently selected, then the higher page id). A page's count starts again
// when it re-enters after an eviction. It fills its whole capacity and ignores scores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <vector>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

struct Lfu {
  int window = 3;  ///< W without a window plan: capacity is W x budget pages

  using State = CacheEntries;

  static constexpr std::string_view name() { return "lfu"; }
  int default_window() const { return window; }
  bool contains(const State& s, std::uint32_t page) const { return s.contains(page); }
  std::size_t size(const State& s) const { return s.size(); }

  void update(State& s, const CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    s.touch(u);
    s.drop_least(u.capacity, [](const CacheEntry& e) { return std::tuple(e.uses, e.last_step, ~e.page); }, evicted);
  }
};
static_assert(EvictionPolicy<Lfu>);

}  // namespace kvdrive::eviction
