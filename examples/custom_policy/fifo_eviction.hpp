// custom::Fifo: an eviction policy written outside the library, as docs/policies.md walks
// through. The cache keeps the pages it admitted last: a hit changes nothing, a miss is
// admitted at the back, and once the cache is over capacity the oldest admissions leave first,
// whatever their attention. The baseline that shows what Lookahead's scores buy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <kvdrive/eviction/concept.hpp>

namespace custom {

struct Fifo {
  int window = 3;  ///< W without a window plan: the capacity is W x the step's budget pages

  /// Per stream: the cached pages in admission order, and the same set sorted for lookups.
  /// (std::vector, not std::deque: KvManager needs states it can move without throwing.)
  struct State {
    std::vector<std::uint32_t> order;
    std::vector<std::uint32_t> sorted;
  };

  static constexpr std::string_view name() { return "fifo"; }
  int default_window() const { return window; }
  bool contains(const State& s, std::uint32_t page) const { return std::binary_search(s.sorted.begin(), s.sorted.end(), page); }
  std::size_t size(const State& s) const { return s.order.size(); }

  /// After compute: u.pages (ascending) went through the cache this step. Runs after the step's
  /// point of no return, so it must not throw (allocation failure aside).
  void update(State& s, const kvdrive::eviction::CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    for (std::uint32_t page : u.pages)
      if (!contains(s, page)) {
        s.order.push_back(page);
        s.sorted.insert(std::upper_bound(s.sorted.begin(), s.sorted.end(), page), page);
      }
    if (s.order.size() <= u.capacity) return;
    const auto leave = static_cast<std::ptrdiff_t>(s.order.size() - u.capacity);  // the oldest admissions
    for (auto it = s.order.begin(); it != s.order.begin() + leave; ++it) {
      s.sorted.erase(std::lower_bound(s.sorted.begin(), s.sorted.end(), *it));
      evicted.push_back(*it);
    }
    s.order.erase(s.order.begin(), s.order.begin() + leave);
  }
};
static_assert(kvdrive::eviction::EvictionPolicy<Fifo>);

}  // namespace custom
