// RankedCache<Rank>: the eviction policy that fills its whole capacity and, once over it, drops
// the cached pages least worth keeping, ignoring attention scores. Rank says what "worth
// keeping" is: Rank::keep_key(entry) is any totally ordered value (the smallest leaves first;
// end it with the page id so that ties are broken), and Rank::kName is the policy's name. Lru
// (lru.hpp) and Lfu (lfu.hpp) are the two built-in ranks; both keep their state as CacheEntries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

template <class Rank>
struct RankedCache {
  int window = 3;  ///< W without a window plan: capacity is W x budget pages

  using State = CacheEntries;

  static constexpr std::string_view name() { return Rank::kName; }
  int default_window() const { return window; }
  bool contains(const State& s, std::uint32_t page) const { return s.contains(page); }
  std::size_t size(const State& s) const { return s.size(); }

  void update(State& s, const CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    s.touch(u);
    s.drop_least(
        u.capacity, [](const CacheEntry& e) { return Rank::keep_key(e); }, evicted);
  }
};

}  // namespace kvdrive::eviction
