// eviction::None: no cache (W = 0). Every selected page that lives on a slower tier is fetched,
// used and dropped, every step: the baseline each cache is measured against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/eviction/cache_entries.hpp"
#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

struct None {
  static constexpr int kFixedWindow = 0;

  using State = CacheEntries;

  static constexpr std::string_view name() { return "none"; }
  int default_window() const { return kFixedWindow; }
  bool contains(const State& s, std::uint32_t page) const { return s.contains(page); }
  std::size_t size(const State& s) const { return s.size(); }

  void update(State& s, const CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    s.touch(u);
    s.drop_if([](const CacheEntry&) { return true; }, evicted);
  }
};
static_assert(EvictionPolicy<None>);

}  // namespace kvdrive::eviction
