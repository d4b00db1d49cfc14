// eviction::Lru: the least recently selected pages leave first (ties: the higher page id leaves
// first). It fills its whole capacity and ignores attention scores: Lookahead's baseline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

struct Lru {
  int window = 3;  ///< W without a window plan: capacity is W x budget pages

  using State = CacheEntries;

  static constexpr std::string_view name() { return "lru"; }
  int default_window() const { return window; }
  bool contains(const State& s, std::uint32_t page) const { return s.contains(page); }
  std::size_t size(const State& s) const { return s.size(); }

  void update(State& s, const CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    s.touch(u);
    s.drop_least(u.capacity, [](const CacheEntry& e) { return std::pair(e.last_step, ~e.page); }, evicted);
  }
};
static_assert(EvictionPolicy<Lru>);

}  // namespace kvdrive::eviction
