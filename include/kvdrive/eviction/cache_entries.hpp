// CacheEntries: the per-stream record every built-in eviction policy keeps, one entry per cached
// page (sorted by page id): when the page was last selected, its attention mass then, and how
// often it was selected since it entered. Policies differ only in which entries they drop, so
// they share this record and its two operations: touch() (admit or refresh the step's pages)
// and drop_least() (shrink to a capacity, the entries with the smallest keep-key first).
// Nothing here allocates once the scratch buffers have grown to the cache's size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvdrive/eviction/concept.hpp"

namespace kvdrive::eviction {

struct CacheEntry {
  std::uint32_t page = 0;
  std::uint64_t last_step = 0;  ///< the step that last selected it (0: warm-up)
  float score = 0;              ///< its attention mass at that step
  std::uint32_t uses = 0;       ///< steps that selected it since it entered the cache
};

class CacheEntries {
 public:
  std::size_t size() const { return entries_.size(); }
  std::span<const CacheEntry> entries() const { return entries_; }

  bool contains(std::uint32_t page) const {
    auto it = std::lower_bound(entries_.begin(), entries_.end(), page, by_page);
    return it != entries_.end() && it->page == page;
  }

  /// Admits the update's pages (ascending) or refreshes them: last_step, one more use, and the
  /// score: this step's mass, plus the page's previous score decayed by `decay` per step since
  /// (decay 0: the last mass only; 1: all its mass while cached).
  void touch(const CacheUpdate& u, float decay = 0.0f) {
    merged_.clear();
    merged_.reserve(entries_.size() + u.pages.size());
    std::size_t i = 0;
    for (std::size_t j = 0; j < u.pages.size(); ++j) {
      const std::uint32_t page = u.pages[j];
      while (i < entries_.size() && entries_[i].page < page) merged_.push_back(entries_[i++]);
      const float mass = j < u.scores.size() ? u.scores[j] : 0.0f;
      CacheEntry e{page, u.step, std::isfinite(mass) ? mass : 0.0f, 1};  // a NaN would break the keep order
      if (i < entries_.size() && entries_[i].page == page) {
        const CacheEntry& old = entries_[i++];
        e.uses = old.uses + 1;
        if (decay > 0.0f) e.score += old.score * decayed(decay, u.step - old.last_step);
      }
      merged_.push_back(e);
    }
    merged_.insert(merged_.end(), entries_.begin() + static_cast<std::ptrdiff_t>(i), entries_.end());
    entries_.swap(merged_);
  }

  /// Drops every entry for which drop(entry) holds; appends their pages to `evicted`.
  template <class Pred>
  void drop_if(Pred drop, std::vector<std::uint32_t>& evicted) {
    std::erase_if(entries_, [&](const CacheEntry& e) {
      if (!drop(e)) return false;
      evicted.push_back(e.page);
      return true;
    });
  }

  /// Drops entries until at most `capacity` remain, the least worth keeping first: those with
  /// the smallest `keep_key(entry)` (any totally ordered value, computed once per entry; end it
  /// with the page id so that ties are broken). Appends their pages, ascending, to `evicted`.
  template <class KeepKey>
  void drop_least(std::size_t capacity, KeepKey keep_key, std::vector<std::uint32_t>& evicted) {
    if (entries_.size() <= capacity) return;
    const std::size_t drop = entries_.size() - capacity;
    using Key = decltype(keep_key(entries_.front()));
    std::vector<std::pair<Key, std::uint32_t>>& order = scratch<Key>();  // (key, position)
    order.clear();
    for (std::size_t i = 0; i < entries_.size(); ++i) order.emplace_back(keep_key(entries_[i]), static_cast<std::uint32_t>(i));
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(drop - 1), order.end());
    drop_.assign(entries_.size(), 0);
    for (std::size_t k = 0; k < drop; ++k) drop_[order[k].second] = 1;
    gone_.clear();
    std::size_t kept = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (drop_[i]) gone_.push_back(entries_[i].page);  // ascending, as entries_ is
      else entries_[kept++] = entries_[i];
    }
    entries_.resize(kept);
    evicted.insert(evicted.end(), gone_.begin(), gone_.end());
  }

  /// decay^steps, exactly 1 for steps = 0 and 0 for decay = 0.
  static float decayed(float decay, std::uint64_t steps) { return steps == 0 ? 1.0f : std::pow(decay, static_cast<float>(steps)); }

 private:
  static bool by_page(const CacheEntry& e, std::uint32_t p) { return e.page < p; }

  template <class Key>
  static std::vector<std::pair<Key, std::uint32_t>>& scratch() {
    thread_local std::vector<std::pair<Key, std::uint32_t>> v;
    return v;
  }

  std::vector<CacheEntry> entries_, merged_;
  std::vector<std::uint32_t> gone_;
  std::vector<std::uint8_t> drop_;
};

}  // namespace kvdrive::eviction
