// ssd::Slots: which data blocks of the file are free and which slot a page gets. A block is
// written once, whole: a write batch only ever takes blocks no committed page lives in.
// - Unpacked (one slot per block): each (sequence, layer, head) takes blocks an extent at a
//   time, so a stream's pages sit together in the order they are written.
// - Packed (several slots per block): a batch fills fresh blocks in its own order (the order
//   the caller gives, e.g. by cluster), several pages to a block; the slots a batch leaves
//   unused in its last block stay unused until the block is free again.
// A block is free when no page lives in it. One freed by an overwrite or an erase is reused only
// once the record that frees it is durable (deferred until then), lowest first, and before the
// file grows.
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
  /// capacity_pages 0: no limit. per_block: slots in a data block (Layout::per_block).
  void configure(std::size_t capacity_pages, std::size_t extent_pages, std::size_t per_block = 1) {
    per_block_ = std::max<std::size_t>(per_block, 1);
    capacity_ = capacity_pages ? (capacity_pages + per_block_ - 1) / per_block_ : std::numeric_limits<std::uint64_t>::max();
    extent_pages_ = extent_pages;
  }

  /// A slot for each page of a batch, in its order; nothing when the capacity is reached (the
  /// slots taken so far are then given back).
  std::optional<std::vector<std::uint64_t>> take(std::span<const PageKey> keys) {
    std::vector<std::uint64_t> slots;
    slots.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::optional<std::uint64_t> s;
      if (per_block_ == 1) {
        s = take_unpacked(keys[i]);
      } else if (i % per_block_ == 0) {
        if (const std::optional<std::uint64_t> b = take_block()) s = *b * per_block_;
      } else {
        s = slots.back() + 1;
      }
      if (!s) {
        free(slots);
        return std::nullopt;
      }
      slots.push_back(*s);
      ++live_[*s / per_block_];
    }
    return slots;
  }

  /// Slots that are free now (durable garbage, or taken by a batch that failed).
  void free(std::span<const std::uint64_t> slots) {
    for (std::uint64_t s : slots)
      if (--live_[s / per_block_] == 0) free_.push_back(s / per_block_);
    order();
  }
  /// A slot whose page was erased: free once the erase is durable (free_deferred()).
  void defer(std::uint64_t slot) {
    if (--live_[slot / per_block_] == 0) deferred_.push_back(slot / per_block_);
  }
  void free_deferred() {
    free_.insert(free_.end(), deferred_.begin(), deferred_.end());
    deferred_.clear();
    order();
  }

  /// Packed: pages that fit in the blocks free now, and in those free once deferred erases are
  /// durable too (without a capacity, the maximum).
  std::size_t free_pages(bool with_deferred) const {
    if (capacity_ == std::numeric_limits<std::uint64_t>::max()) return std::numeric_limits<std::size_t>::max();
    const std::uint64_t fresh = capacity_ > high_water_ ? capacity_ - high_water_ : 0;  // a store reopened with less capacity may hold more
    const std::uint64_t blocks = fresh + free_.size() + (with_deferred ? deferred_.size() : 0);
    return static_cast<std::size_t>(blocks * per_block_);
  }

  /// After recovery: every block below the highest one held that no page lives in is free.
  template <class Map>
  void rebuild(const Map& pages) {
    std::uint64_t high = 0;
    for (const auto& [key, e] : pages) high = std::max(high, e.slot / per_block_ + 1);
    live_.assign(high, 0);
    for (const auto& [key, e] : pages) ++live_[e.slot / per_block_];
    for (std::uint64_t b = 0; b < high; ++b)
      if (live_[b] == 0) free_.push_back(b);
    std::reverse(free_.begin(), free_.end());  // lowest first when popped from the back
    sorted_ = free_.size();
    high_water_ = high;
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

  /// Unpacked: the page's stream's extent, a free block, a fresh extent, or any stream's extent.
  std::optional<std::uint64_t> take_unpacked(const PageKey& key) {
    Extent& ex = extents_[StreamKey{key.sequence, key.layer, key.head}];
    if (ex.next < ex.end) return ex.next++;
    if (const std::optional<std::uint64_t> b = pop_free()) return b;  // freed blocks (durably) first, so the file does not grow forever
    if (high_water_ < capacity_) {
      const std::uint64_t n = std::min<std::uint64_t>(extent_pages_, capacity_ - high_water_);
      ex = Extent{high_water_ + 1, high_water_ + n};
      grow(n);
      return ex.next - 1;
    }
    for (auto& [stream, other] : extents_)
      if (other.next < other.end) return other.next++;
    return std::nullopt;
  }

  /// Packed: the lowest free block, else a fresh one.
  std::optional<std::uint64_t> take_block() {
    if (const std::optional<std::uint64_t> b = pop_free()) return b;
    if (high_water_ >= capacity_) return std::nullopt;
    grow(1);
    return high_water_ - 1;
  }

  /// The lowest free block, if any.
  std::optional<std::uint64_t> pop_free() {
    if (free_.empty()) return std::nullopt;
    const std::uint64_t b = free_.back();
    free_.pop_back();
    sorted_ = std::min(sorted_, free_.size());
    return b;
  }

  void grow(std::uint64_t blocks) {
    high_water_ += blocks;
    live_.resize(high_water_, 0);
  }

  /// Free blocks are taken lowest first (from the back), so a batch that reuses them gets runs
  /// of adjacent blocks where they exist: what packing and merged reads rely on.
  void order() {
    // The list is kept sorted (descending); only the blocks appended since are out of place.
    auto tail = free_.begin() + static_cast<std::ptrdiff_t>(std::min(sorted_, free_.size()));
    std::sort(tail, free_.end(), std::greater<>());
    std::inplace_merge(free_.begin(), tail, free_.end(), std::greater<>());
    sorted_ = free_.size();
  }

  std::size_t per_block_ = 1;
  std::uint64_t capacity_ = std::numeric_limits<std::uint64_t>::max();  ///< in blocks
  std::size_t extent_pages_ = 64;
  std::uint64_t high_water_ = 0;     ///< blocks the file has had
  std::vector<std::uint32_t> live_;  ///< pages living in each block below high_water_
  std::unordered_map<StreamKey, Extent, StreamKeyHash> extents_;
  std::vector<std::uint64_t> free_, deferred_;  ///< blocks
  std::size_t sorted_ = 0;                      ///< free_[0, sorted_) is in order (see order())
};

}  // namespace kvdrive::tier::ssd
