// eviction::Lru: least-recently-selected pages leave first (ties: the lower page id leaves
// first). Capacity is window x budget pages (Decision 6), or a fixed page count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

struct Lru {
  int window = 3;                 ///< W: capacity is W x budget pages
  std::size_t capacity_pages = 0; ///< if non-zero, the capacity in pages regardless of W

  struct Entry {
    std::uint32_t page;
    std::uint64_t last_used;
  };
  struct State {
    std::vector<Entry> entries;  ///< sorted by page id
  };

  static constexpr std::string_view name() { return "lru"; }

  std::size_t capacity(std::int64_t budget_pages) const {
    if (capacity_pages) return capacity_pages;
    return static_cast<std::size_t>(std::max(0, window)) * static_cast<std::size_t>(std::max<std::int64_t>(0, budget_pages));
  }

  bool contains(const State& s, std::uint32_t page) const {
    auto it = std::lower_bound(s.entries.begin(), s.entries.end(), page,
                               [](const Entry& e, std::uint32_t p) { return e.page < p; });
    return it != s.entries.end() && it->page == page;
  }

  std::size_t size(const State& s) const { return s.entries.size(); }

  void update(State& s, const CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    for (std::uint32_t page : u.pages) {
      auto it = std::lower_bound(s.entries.begin(), s.entries.end(), page,
                                 [](const Entry& e, std::uint32_t p) { return e.page < p; });
      if (it != s.entries.end() && it->page == page)
        it->last_used = u.step;
      else
        s.entries.insert(it, Entry{page, u.step});
    }
    if (s.entries.size() <= u.capacity) return;
    std::vector<Entry> by_age = s.entries;
    std::sort(by_age.begin(), by_age.end(), [](const Entry& a, const Entry& b) {
      return a.last_used < b.last_used || (a.last_used == b.last_used && a.page < b.page);
    });
    const std::size_t drop = s.entries.size() - u.capacity;
    std::vector<std::uint32_t> gone;
    for (std::size_t i = 0; i < drop; ++i) gone.push_back(by_age[i].page);
    std::sort(gone.begin(), gone.end());
    std::erase_if(s.entries, [&](const Entry& e) {
      return std::binary_search(gone.begin(), gone.end(), e.page);
    });
    evicted.insert(evicted.end(), gone.begin(), gone.end());
  }
};
static_assert(EvictionPolicy<Lru>);

}  // namespace kvdrive::eviction
