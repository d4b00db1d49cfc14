// tier::HostTier: pages in host DRAM, in an aligned slot pool (PagePool) with an optional
// capacity. It is addressable: the manager attends its pages in place (Decision 7). Used as the
// fast tier of the CPU backend and as a DRAM store behind it. Reads complete at submit().
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/page_pool.hpp"

namespace kvdrive::tier {

class HostTier {
 public:
  struct Params {
    std::size_t capacity_pages = 0;  ///< 0: unbounded
    /// Slot alignment for pages of whole multiples of it (direct I/O wants 4096, and reads such
    /// pages in place); smaller or odd-sized pages, which no tier reads in place (an SSD tier
    /// packs them and reads them through its bounce buffer), are packed at 64-byte alignment
    /// rather than each taking a whole multiple (a 2 KiB page would take 4 KiB).
    std::size_t alignment = 4096;
    PagePool::BlockHook on_new_block{};  ///< each new block of memory: pin it (CUDA) or register it
  };

  static constexpr bool kAddressable = true;

  HostTier() = default;
  explicit HostTier(Params p) : params_(p) {}
  HostTier(HostTier&& o) noexcept : params_(std::move(o.params_)) {}  // movable before open() only

  std::string_view name() const { return "host"; }

  /// Adds a hook for each new block of memory, after the one in Params (before open() only):
  /// KvManager uses it to register the pool with the tiers that read into it.
  void add_block_hook(PagePool::BlockHook hook) {
    if (!params_.on_new_block) {
      params_.on_new_block = std::move(hook);
      return;
    }
    params_.on_new_block = [first = std::move(params_.on_new_block), then = std::move(hook)](std::byte* p, std::size_t n) {
      first(p, n);
      then(p, n);
    };
  }

  void open(const TierGeometry& g) {
    page_bytes_ = g.page_bytes;
    pool_.open(g.page_bytes, slot_alignment(g.page_bytes, params_.alignment), params_.capacity_pages, params_.on_new_block);
  }

  /// The alignment of the slots for pages of page_bytes (see Params::alignment).
  static std::size_t slot_alignment(std::size_t page_bytes, std::size_t alignment) {
    return alignment != 0 && page_bytes % alignment != 0 ? std::min<std::size_t>(alignment, 64) : alignment;
  }
  std::size_t slot_stride() const { return pool_.stride(); }

  // ---- keyed store ---------------------------------------------------------------------------
  void write(const PageKey& key, const std::byte* src) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) it = map_.emplace(key, pool_.allocate()).first;
    std::memcpy(pool_.data(it->second), src, page_bytes_);
  }

  ReadTicket submit(std::span<const ReadRequest> reads) {
    for (const ReadRequest& r : reads) std::memcpy(r.dst, address(r.key), page_bytes_);
    return ++tickets_;
  }
  void wait(ReadTicket) {}

  void erase(const PageKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return;
    pool_.release(it->second);
    map_.erase(it);
  }

  bool contains(const PageKey& key) const {
    std::lock_guard lock(mutex_);
    return map_.count(key) != 0;
  }

  const std::byte* address(const PageKey& key) const {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    KVD_EXPECT(it != map_.end(), "HostTier: no page {}", key);
    return pool_.data(it->second);
  }

  std::size_t free_pages() const { return pool_.free_pages(); }
  std::size_t used_pages() const { return pool_.used(); }
  std::size_t stored_pages() const {
    std::lock_guard lock(mutex_);
    return map_.size();
  }

  // ---- fast-tier slots -----------------------------------------------------------------------
  Slot allocate() { return pool_.allocate(); }
  void release(Slot s) { pool_.release(s); }
  std::byte* slot_data(Slot s) { return pool_.data(s); }

 private:
  Params params_;
  std::size_t page_bytes_ = 0;
  PagePool pool_;
  mutable std::mutex mutex_;
  std::unordered_map<PageKey, Slot, PageKeyHash> map_;
  std::atomic<std::uint64_t> tickets_{0};
};
static_assert(AddressableTier<HostTier> && FastTier<HostTier>);

}  // namespace kvdrive::tier
