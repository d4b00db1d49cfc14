// PagePool: page-sized slots in aligned host memory, handed out from a free list. Memory grows
// in 4 MiB blocks (pointers stay valid for the pool's life) up to an optional capacity. Blocks
// are 2 MiB-aligned and offered to the kernel as transparent huge pages, so that scattered
// page reads do not miss the TLB on every page. Thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include <sys/mman.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::tier {

class PagePool {
 public:
  using Slot = std::int32_t;

  PagePool() = default;
  /// Called with each new block of memory (address, bytes), e.g. to pin it for GPU copies
  /// (cudaHostRegister) or register it with io_uring; it may throw, and the block is then freed.
  using BlockHook = std::function<void(std::byte*, std::size_t)>;

  /// page_bytes per slot, each slot starting at a multiple of `alignment` (a power of two);
  /// capacity 0 means unbounded.
  void open(std::size_t page_bytes, std::size_t alignment, std::size_t capacity, BlockHook on_new_block = {}) {
    KVD_EXPECT(page_bytes > 0, "PagePool: page_bytes is 0");
    KVD_EXPECT(alignment >= 16 && (alignment & (alignment - 1)) == 0, "PagePool: alignment {} is not a power of two >= 16", alignment);
    std::lock_guard lock(mutex_);
    KVD_EXPECT(blocks_.empty(), "PagePool: already open");
    alignment_ = alignment;
    stride_ = (page_bytes + alignment - 1) / alignment * alignment;
    capacity_ = capacity;
    block_pages_ = std::max<std::size_t>(1, (std::size_t{4} << 20) / stride_);  // ~4 MiB blocks
    directory_ = std::make_unique<std::byte*[]>(kMaxBlocks);
    on_new_block_ = std::move(on_new_block);
  }

  Slot allocate() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) grow();
    const Slot s = free_.back();
    free_.pop_back();
    return s;
  }

  void release(Slot s) {
    std::lock_guard lock(mutex_);
    free_.push_back(s);
  }

  /// The slot's bytes. Lock-free: the block directory never moves, so another thread may
  /// allocate (and grow the pool) meanwhile.
  std::byte* data(Slot s) const {
    const auto i = static_cast<std::size_t>(s);
    return directory_[i / block_pages_] + (i % block_pages_) * stride_;
  }

  std::size_t stride() const { return stride_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t used() const {
    std::lock_guard lock(mutex_);
    return total_ - free_.size();
  }
  std::size_t free_pages() const {
    std::lock_guard lock(mutex_);
    if (capacity_ == 0) return std::numeric_limits<std::size_t>::max();
    return capacity_ - (total_ - free_.size());
  }

 private:
  struct AlignedDelete {
    std::size_t alignment;
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{alignment}); }
  };

  void grow() {
    KVD_EXPECT(capacity_ == 0 || total_ < capacity_, "host page pool is full: all {} pages in use (raise the tier's capacity_pages)", capacity_);
    std::size_t n = block_pages_;
    if (capacity_ != 0 && total_ + n > capacity_) n = capacity_ - total_;
    KVD_EXPECT(blocks_.size() < kMaxBlocks && total_ + n <= static_cast<std::size_t>(std::numeric_limits<Slot>::max()),
               "host page pool: cannot grow past {} pages of {} bytes", total_, stride_);
    // Every block holds block_pages_ slots of address space so slot -> address is one division.
    const std::size_t bytes = block_pages_ * stride_;
    const std::size_t align = std::max(alignment_, kHugePage);
    auto* raw = static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{align}));
    std::unique_ptr<std::byte[], AlignedDelete> block(raw, AlignedDelete{align});
    // Nothing may throw after the hook: a block it registered (pinned, mapped for the GPU) and
    // then freed would leave a stale registration behind.
    blocks_.reserve(blocks_.size() + 1);
    free_.reserve(free_.size() + n);
    if (on_new_block_) on_new_block_(raw, bytes);
    blocks_.push_back(std::move(block));
    directory_[blocks_.size() - 1] = raw;
#ifdef MADV_HUGEPAGE
    if (bytes >= kHugePage) ::madvise(raw, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // a hint
#endif
    for (std::size_t i = n; i-- > 0;) free_.push_back(static_cast<Slot>(total_ + i));
    total_ += n;  // a block cut short by the capacity is the last one, so numbering stays aligned
  }

  static constexpr std::size_t kHugePage = std::size_t{2} << 20;
  static constexpr std::size_t kMaxBlocks = 1u << 16;  // x ~4 MiB: 256 GiB per pool

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<std::byte[], AlignedDelete>> blocks_;
  std::unique_ptr<std::byte*[]> directory_;  ///< block addresses; fixed size, never reallocated
  std::vector<Slot> free_;
  std::size_t alignment_ = 64, stride_ = 0, capacity_ = 0, block_pages_ = 1, total_ = 0;
  BlockHook on_new_block_;
};

}  // namespace kvdrive::tier
