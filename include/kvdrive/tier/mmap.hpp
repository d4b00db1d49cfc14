// tier::MmapTier: the FlexGen-style strawman the SSD tier is measured against. Pages live in a
// memory-mapped file; a read loads the whole layer of each page it asks for (every page of that
// sequence and layer, through page faults, as an offloading system that moves a layer's KV at a
// time does), then copies out the pages asked for. drop_cache() evicts the file from the page
// cache (posix_fadvise DONTNEED) so that a measured run starts cold. No checksums, no
// durability: it is a baseline, not a store.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"

namespace kvdrive::tier {

class MmapTier {
 public:
  struct Params {
    std::string path;                ///< the file (recreated)
    std::size_t capacity_pages = 0;  ///< required: the mapping's size in pages
  };

  static constexpr bool kAddressable = false;

  explicit MmapTier(Params p) : params_(std::move(p)) {}
  MmapTier(MmapTier&& o) noexcept : params_(std::move(o.params_)) {}  // movable before open() only
  MmapTier(const MmapTier&) = delete;
  MmapTier& operator=(const MmapTier&) = delete;
  ~MmapTier() {
    if (base_) ::munmap(base_, bytes_);
    if (fd_ >= 0) ::close(fd_);
  }

  std::string_view name() const { return "mmap"; }

  void open(const TierGeometry& g) {
    KVD_EXPECT(fd_ < 0, "MmapTier {}: already open", params_.path);
    KVD_EXPECT(params_.capacity_pages > 0 && g.page_bytes > 0, "MmapTier {}: capacity_pages and the page size must be > 0", params_.path);
    page_bytes_ = g.page_bytes;
    bytes_ = params_.capacity_pages * page_bytes_;
    fd_ = ::open(params_.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    KVD_EXPECT(fd_ >= 0, "MmapTier: cannot open {}: {}", params_.path, std::strerror(errno));
    KVD_EXPECT(::ftruncate(fd_, static_cast<off_t>(bytes_)) == 0, "MmapTier {}: cannot size it to {} bytes: {}", params_.path, bytes_,
               std::strerror(errno));
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    KVD_EXPECT(p != MAP_FAILED, "MmapTier {}: mmap failed: {}", params_.path, std::strerror(errno));
    base_ = static_cast<std::byte*>(p);
    ::madvise(base_, bytes_, MADV_SEQUENTIAL);  // whole layers are read front to back
  }

  void write(const PageKey& key, const std::byte* src) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      KVD_EXPECT(next_ < params_.capacity_pages, "MmapTier {}: full ({} pages)", params_.path, params_.capacity_pages);
      it = map_.emplace(key, next_++).first;
      layers_[{key.sequence, key.layer}].push_back(it->second);
    }
    std::memcpy(base_ + it->second * page_bytes_, src, page_bytes_);
  }

  /// Loads every page of each (sequence, layer) the batch touches, then copies out the pages.
  ReadTicket submit(std::span<const ReadRequest> reads) {
    std::lock_guard lock(mutex_);
    std::map<std::pair<std::uint64_t, std::uint32_t>, bool> loaded;
    for (const ReadRequest& r : reads) {
      auto it = map_.find(r.key);
      KVD_EXPECT(it != map_.end(), "MmapTier {}: no page {}", params_.path, r.key);
      const std::pair<std::uint64_t, std::uint32_t> layer{r.key.sequence, r.key.layer};
      if (!loaded[layer]) {
        const std::vector<std::uint64_t>& slots = layers_[layer];
        staging_.resize(slots.size() * page_bytes_);
        for (std::size_t i = 0; i < slots.size(); ++i) std::memcpy(staging_.data() + i * page_bytes_, base_ + slots[i] * page_bytes_, page_bytes_);
        loaded[layer] = true;
        layer_loads_ += 1;
        bytes_loaded_ += staging_.size();
      }
      std::memcpy(r.dst, base_ + it->second * page_bytes_, page_bytes_);
    }
    return ++tickets_;
  }
  void wait(ReadTicket) {}

  void erase(const PageKey& key) {
    std::lock_guard lock(mutex_);
    map_.erase(key);  // the slot is not reused: a strawman
  }
  bool contains(const PageKey& key) const {
    std::lock_guard lock(mutex_);
    return map_.count(key) != 0;
  }
  std::size_t free_pages() const {
    std::lock_guard lock(mutex_);
    return params_.capacity_pages - next_;
  }

  /// Writes dirty pages back and drops the file from the page cache: the next reads are cold.
  void drop_cache() {
    std::lock_guard lock(mutex_);
    ::msync(base_, bytes_, MS_SYNC);
    ::madvise(base_, bytes_, MADV_DONTNEED);
    ::posix_fadvise(fd_, 0, static_cast<off_t>(bytes_), POSIX_FADV_DONTNEED);
  }
  std::uint64_t layer_loads() const { return layer_loads_; }
  std::uint64_t bytes_loaded() const { return bytes_loaded_; }

 private:
  Params params_;
  mutable std::mutex mutex_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::size_t page_bytes_ = 0, bytes_ = 0;
  std::uint64_t next_ = 0;
  std::unordered_map<PageKey, std::uint64_t, PageKeyHash> map_;
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::vector<std::uint64_t>> layers_;
  std::vector<std::byte> staging_;
  ReadTicket tickets_ = 0;
  std::uint64_t layer_loads_ = 0, bytes_loaded_ = 0;
};
static_assert(StorageTier<MmapTier>);

}  // namespace kvdrive::tier
