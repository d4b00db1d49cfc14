// ssd::Slots: which slots of the data file are free and which a page gets. Each (sequence,
// layer, head) takes slots an extent at a time, so a stream's pages sit together in the order
// they are written; a slot freed by an overwrite or an erase is reused only once the record that
// frees it is durable (deferred until then), lowest first, and before the file grows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvdrive/tier/page_key.hpp"

namespace kvdrive::tier::ssd {

class Slots {
 public:
  /// capacity_pages 0: no limit.
  void configure(std::size_t capacity_pages, std::size_t extent_pages) {
    capacity_ = capacity_pages ? capacity_pages : std::numeric_limits<std::uint64_t>::max();
    extent_pages_ = extent_pages;
  }

  /// A slot for the page: its stream's extent, a free slot, a fresh extent, or any stream's
  /// extent; nothing when the capacity is reached.
  std::optional<std::uint64_t> take(const PageKey& key) {
    Extent& ex = extents_[StreamKey{key.sequence, key.layer, key.head}];
    if (ex.next < ex.end) return ex.next++;
    if (!free_.empty()) {  // freed slots (durably) first, so the file does not grow forever
      const std::uint64_t s = free_.back();
      free_.pop_back();
      return s;
    }
    if (high_water_ < capacity_) {
      const std::uint64_t n = std::min<std::uint64_t>(extent_pages_, capacity_ - high_water_);
      ex = Extent{high_water_ + 1, high_water_ + n};
      high_water_ += n;
      return ex.next - 1;
    }
    for (auto& [stream, other] : extents_)
      if (other.next < other.end) return other.next++;
    return std::nullopt;
  }

  /// Slots that are free now (durable garbage, or taken by a batch that failed).
  void free(std::span<const std::uint64_t> slots) {
    free_.insert(free_.end(), slots.begin(), slots.end());
    order();
  }
  /// A slot whose page was erased: free once the erase is durable (free_deferred()).
  void defer(std::uint64_t slot) { deferred_.push_back(slot); }
  void free_deferred() {
    free_.insert(free_.end(), deferred_.begin(), deferred_.end());
    deferred_.clear();
    order();
  }

  /// After recovery: every slot below the highest one held that no page holds is free.
  template <class Map>
  void rebuild(const Map& pages) {
    std::uint64_t high = 0;
    for (const auto& [key, e] : pages) high = std::max(high, e.slot + 1);
    std::vector<bool> used(high, false);
    for (const auto& [key, e] : pages) used[e.slot] = true;
    for (std::uint64_t s = 0; s < high; ++s)
      if (!used[s]) free_.push_back(s);
    std::reverse(free_.begin(), free_.end());  // lowest first when popped from the back
    sorted_ = free_.size();
    high_water_ = high;
  }

  /// Free slots are taken lowest first (from the back), so a batch that reuses them gets runs
  /// of adjacent slots where they exist: what packing and merged reads rely on.
  void order() {
    // The list is kept sorted (descending); only the slots appended since are out of place.
    auto tail = free_.begin() + static_cast<std::ptrdiff_t>(std::min(sorted_, free_.size()));
    std::sort(tail, free_.end(), std::greater<>());
    std::inplace_merge(free_.begin(), tail, free_.end(), std::greater<>());
    sorted_ = free_.size();
  }

 private:
  struct StreamKey {
    std::uint64_t sequence;
    std::uint32_t layer, head;
    friend bool operator==(const StreamKey&, const StreamKey&) = default;
  };
  struct StreamKeyHash {
    std::size_t operator()(const StreamKey& k) const noexcept { return PageKeyHash{}(PageKey{k.sequence, k.layer, k.head, 0}); }
  };
  struct Extent {
    std::uint64_t next = 0, end = 0;
  };

  std::uint64_t capacity_ = std::numeric_limits<std::uint64_t>::max();
  std::size_t extent_pages_ = 64;
  std::uint64_t high_water_ = 0;
  std::unordered_map<StreamKey, Extent, StreamKeyHash> extents_;
  std::vector<std::uint64_t> free_, deferred_;
  std::size_t sorted_ = 0;  ///< free_[0, sorted_) is in order (see order())
};

}  // namespace kvdrive::tier::ssd
