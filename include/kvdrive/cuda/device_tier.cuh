// cuda::DeviceTier: the CUDA backend's fast tier. Page-sized slots in device memory, carved from
// blocks of cudaMalloc'ed memory (64 MiB by default) as the pool grows, up to an optional
// capacity. It is a tier::DeviceFastTier: slot_data() is a device address, for backend::Cuda to
// attend, and KvManager moves bytes only through upload(), upload_pages() and download(). Batches
// (a step's misses) go on the tier's copy stream; single pages and rows (a new token, a page
// read back) on the calling thread's own stream (cudaStreamPerThread), so that the select
// threads of a pipeline never wait behind another micro-batch's fetch. pin_host() page-locks the
// manager's staging pool and maps it into the device's address space: a batch whose pages come
// from there is copied by one gather kernel (page_gather.cuh), which the first GPU run measured at
// 31x the rate of one cudaMemcpyAsync per 4 KiB page (47 against 1.5 GB/s on an H200); pages from
// other host memory still go by cudaMemcpyAsync. The keyed store (write/submit) exists for the
// concept; it copies page by page. Thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "kvdrive/core/error.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/page_gather.cuh"
#include "kvdrive/tier/concept.hpp"

namespace kvdrive::cuda {

class DeviceTier {
 public:
  struct Params {
    std::size_t capacity_pages = 0;                   ///< 0: grow until device memory runs out
    std::size_t block_bytes = std::size_t{64} << 20;  ///< device memory per cudaMalloc
    int device = 0;
  };

  static constexpr bool kAddressable = false;
  static constexpr bool kDeviceMemory = true;

  DeviceTier() = default;
  explicit DeviceTier(Params p) : params_(p) {}
  DeviceTier(DeviceTier&& o) noexcept : params_(o.params_) {}  // movable before open() only
  DeviceTier(const DeviceTier&) = delete;
  DeviceTier& operator=(const DeviceTier&) = delete;

  ~DeviceTier() {
    if (!opened_) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(params_.device);
    for (std::byte* p : pinned_) cudaHostUnregister(p);
    for (std::byte* b : blocks_) cudaFree(b);
    if (gather_.device) cudaFree(gather_.device);
    if (gather_.host) cudaFreeHost(gather_.host);
    if (stream_) cudaStreamDestroy(stream_);
    cudaSetDevice(previous);
  }

  std::string_view name() const { return "device"; }

  void open(const tier::TierGeometry& g) {
    KVD_EXPECT(g.page_bytes > 0, "DeviceTier: page_bytes is 0");
    KVD_EXPECT(!opened_, "DeviceTier: already open");
    const DeviceGuard on(params_.device);
    page_bytes_ = g.page_bytes;
    stride_ = (g.page_bytes + 255) / 256 * 256;  // slots 256-byte aligned, as cudaMalloc's
    block_pages_ = std::max<std::size_t>(1, params_.block_bytes / stride_);
    directory_ = std::make_unique<std::byte*[]>(kMaxBlocks);
    KVD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    opened_ = true;
  }

  // ---- fast-tier slots -----------------------------------------------------------------------
  Slot allocate() {
    std::lock_guard lock(mutex_);
    return allocate_locked();
  }
  void release(Slot s) {
    std::lock_guard lock(mutex_);
    free_.push_back(s);
  }
  /// The slot's device address. Lock-free: the block directory never moves.
  std::byte* slot_data(Slot s) {
    const auto i = static_cast<std::size_t>(s);
    return directory_[i / block_pages_] + (i % block_pages_) * stride_;
  }

  // ---- moving bytes --------------------------------------------------------------------------
  /// Host bytes into [offset, offset + n) of a slot, on the calling thread's stream.
  void upload(Slot s, std::size_t offset, const std::byte* src, std::size_t n) {
    KVD_EXPECT(offset + n <= page_bytes_, "DeviceTier::upload: bytes [{}, {}) outside a page of {}", offset, offset + n, page_bytes_);
    const DeviceGuard on(params_.device);
    KVD_CUDA_CHECK(cudaMemcpyAsync(slot_data(s) + offset, src, n, cudaMemcpyHostToDevice, cudaStreamPerThread));
    KVD_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  }
  /// Whole pages on the copy stream, then one synchronisation: the pages whose source lies in
  /// memory pin_host() mapped by one gather kernel, the others by one cudaMemcpyAsync each. On an
  /// error it still waits for the copies already queued, so the sources may be freed after.
  void upload_pages(std::span<const tier::SlotUpload> pages) {
    if (pages.empty()) return;
    const DeviceGuard on(params_.device);
    std::lock_guard serial(upload_mutex_);  // one batch at a time owns the gather's pointer arrays
    std::vector<const std::byte*>& src = gather_.src;
    std::vector<std::byte*>& dst = gather_.dst;
    std::vector<char>& mapped = gather_.mapped;  // per page: in mapped memory
    src.clear(), dst.clear(), mapped.assign(pages.size(), 0);
    gather_.last = 0;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < pages.size(); ++i)
        if (const std::byte* d = mapped_address(pages[i].src)) src.push_back(d), dst.push_back(slot_data(pages[i].slot)), mapped[i] = 1;
    }
    const bool gather = !src.empty() && reserve_gather(src.size());
    cudaError_t e = cudaSuccess;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      if (gather && mapped[i]) continue;
      if ((e = cudaMemcpyAsync(slot_data(pages[i].slot), pages[i].src, page_bytes_, cudaMemcpyHostToDevice, stream_)) != cudaSuccess) break;
    }
    if (e == cudaSuccess && gather) e = launch_gather();
    const cudaError_t done = cudaStreamSynchronize(stream_);
    KVD_CUDA_CHECK(e);
    KVD_CUDA_CHECK(done);
  }
  /// How many pages the last upload_pages() copied by the gather kernel (for tests).
  std::size_t last_gathered() const { return gather_.last; }
  /// A whole slot into host memory, on the calling thread's stream.
  void download(Slot s, std::byte* dst) {
    const DeviceGuard on(params_.device);
    KVD_CUDA_CHECK(cudaMemcpyAsync(dst, slot_data(s), page_bytes_, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    KVD_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  }
  /// Page-locks host memory the manager uploads from, until the tier closes (the memory must
  /// outlive it). Pinning only speeds copies up, so a refusal (a sandbox's memlock limit, say)
  /// leaves the memory pageable and is not an error.
  void pin_host(std::byte* p, std::size_t n) {
    std::lock_guard lock(mutex_);
    pinned_.reserve(pinned_.size() + 1);  // recording a pinned block must not fail
    mapped_.reserve(mapped_.size() + 1);
    const DeviceGuard on(params_.device);
    if (cudaHostRegister(p, n, cudaHostRegisterMapped) == cudaSuccess) {
      pinned_.push_back(p);
      void* device = nullptr;
      if (cudaHostGetDevicePointer(&device, p, 0) == cudaSuccess) {
        const Mapping m{p, n, static_cast<std::byte*>(device)};
        mapped_.insert(std::upper_bound(mapped_.begin(), mapped_.end(), m, [](const Mapping& a, const Mapping& b) { return a.host < b.host; }), m);
      } else {
        cudaGetLastError();  // pinned but not mapped: its pages go by cudaMemcpyAsync
      }
    } else if (cudaGetLastError(), cudaHostRegister(p, n, cudaHostRegisterDefault) == cudaSuccess) {
      pinned_.push_back(p);
    } else {
      cudaGetLastError();  // clear it: the copies still work from pageable memory
    }
  }

  // ---- keyed store ---------------------------------------------------------------------------
  void write(const tier::PageKey& key, const std::byte* src) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    const bool fresh = it == map_.end();
    const Slot s = fresh ? allocate_locked() : it->second;
    try {
      upload(s, 0, src, page_bytes_);
      if (fresh) map_.emplace(key, s);
    } catch (...) {
      if (fresh) free_.push_back(s);
      throw;
    }
  }
  tier::ReadTicket submit(std::span<const tier::ReadRequest> reads) {
    for (const tier::ReadRequest& r : reads) {
      Slot s = -1;
      {
        std::lock_guard lock(mutex_);
        auto it = map_.find(r.key);
        KVD_EXPECT(it != map_.end(), "DeviceTier: no page {}", r.key);
        s = it->second;
      }
      download(s, r.dst);
    }
    std::lock_guard lock(mutex_);
    return ++tickets_;
  }
  void wait(tier::ReadTicket) {}
  void erase(const tier::PageKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return;
    free_.push_back(it->second);
    map_.erase(it);
  }
  bool contains(const tier::PageKey& key) const {
    std::lock_guard lock(mutex_);
    return map_.count(key) != 0;
  }

  std::size_t free_pages() const {
    std::lock_guard lock(mutex_);
    if (params_.capacity_pages == 0) return std::numeric_limits<std::size_t>::max();
    return params_.capacity_pages - (total_ - free_.size());
  }
  std::size_t used_pages() const {
    std::lock_guard lock(mutex_);
    return total_ - free_.size();
  }
  int device() const { return params_.device; }
  cudaStream_t copy_stream() const { return stream_; }

 private:
  Slot allocate_locked() {
    if (free_.empty()) grow();
    const Slot s = free_.back();
    free_.pop_back();
    return s;
  }

  void grow() {
    KVD_EXPECT(opened_, "DeviceTier: allocate() before open()");
    const std::size_t cap = params_.capacity_pages;
    KVD_EXPECT(cap == 0 || total_ < cap, "device page pool is full: all {} pages in use (raise DeviceTier's capacity_pages)", cap);
    KVD_EXPECT(blocks_.size() < kMaxBlocks && total_ + block_pages_ <= static_cast<std::size_t>(std::numeric_limits<Slot>::max()),
               "device page pool: cannot grow past {} pages", total_);
    std::size_t n = block_pages_;
    if (cap != 0 && total_ + n > cap) n = cap - total_;
    void* raw = nullptr;
    const DeviceGuard on(params_.device);
    if (const cudaError_t e = cudaMalloc(&raw, block_pages_ * stride_); e != cudaSuccess) {
      cudaGetLastError();
      fail("device page pool: cudaMalloc of {} bytes failed after {} pages ({}): lower the batch or the cache windows", block_pages_ * stride_,
           total_, cudaGetErrorString(e));
    }
    blocks_.push_back(static_cast<std::byte*>(raw));
    directory_[blocks_.size() - 1] = static_cast<std::byte*>(raw);
    free_.reserve(free_.size() + n);
    for (std::size_t i = n; i-- > 0;) free_.push_back(static_cast<Slot>(total_ + i));
    total_ += n;
  }

  /// Host memory pin_host() mapped: [host, host + bytes) is [device, device + bytes) to kernels.
  struct Mapping {
    std::byte* host = nullptr;
    std::size_t bytes = 0;
    std::byte* device = nullptr;
  };
  /// The device address of a whole page at host address p, if it lies in mapped memory; else null.
  const std::byte* mapped_address(const std::byte* p) const {
    auto it = std::upper_bound(mapped_.begin(), mapped_.end(), p, [](const std::byte* x, const Mapping& m) { return x < m.host; });
    if (it == mapped_.begin()) return nullptr;
    --it;
    const auto offset = static_cast<std::size_t>(p - it->host);
    return offset + page_bytes_ <= it->bytes ? it->device + offset : nullptr;
  }

  /// The gather kernel's pointer arrays (sources, then slots): built on the host, staged in
  /// pinned memory and copied to the device before the launch. False: no memory for them (the
  /// batch then goes by cudaMemcpyAsync).
  bool reserve_gather(std::size_t pages) {
    if (pages <= gather_.capacity) return true;
    const std::size_t n = std::max<std::size_t>(2 * pages, 1024), bytes = 2 * n * sizeof(void*);
    void *host = nullptr, *device = nullptr;
    if (cudaMallocHost(&host, bytes) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess) {
      cudaGetLastError();
      if (host) cudaFreeHost(host);
      return false;
    }
    if (gather_.device) cudaFree(gather_.device);  // the last batch has finished: upload_pages synchronises
    if (gather_.host) cudaFreeHost(gather_.host);
    gather_.host = static_cast<std::byte**>(host), gather_.device = static_cast<std::byte**>(device), gather_.capacity = n;
    return true;
  }
  cudaError_t launch_gather() {
    const std::size_t n = gather_.src.size();
    std::copy(gather_.src.begin(), gather_.src.end(), const_cast<const std::byte**>(gather_.host));
    std::copy(gather_.dst.begin(), gather_.dst.end(), gather_.host + n);
    gather_.last = n;
    if (const cudaError_t e = cudaMemcpyAsync(gather_.device, gather_.host, 2 * n * sizeof(void*), cudaMemcpyHostToDevice, stream_); e != cudaSuccess)
      return e;
    PageGatherParams p;
    p.src = const_cast<const std::byte* const*>(gather_.device);
    p.dst = gather_.device + n;
    p.page_bytes = page_bytes_;
    p.pages = static_cast<int>(n);
    return gather_pages(p, stream_);
  }

  static constexpr std::size_t kMaxBlocks = 1u << 14;  // x 64 MiB: 1 TiB

  Params params_;
  bool opened_ = false;
  std::size_t page_bytes_ = 0, stride_ = 0, block_pages_ = 1, total_ = 0;
  std::unique_ptr<std::byte*[]> directory_;
  std::vector<std::byte*> blocks_, pinned_;
  std::vector<Mapping> mapped_;  ///< sorted by host address
  struct Gather {
    std::vector<const std::byte*> src;
    std::vector<std::byte*> dst;
    std::vector<char> mapped;
    std::byte** host = nullptr;    ///< pinned: [capacity] sources, then [capacity] slots
    std::byte** device = nullptr;  ///< the same arrays in device memory
    std::size_t capacity = 0, last = 0;
  } gather_;
  std::mutex upload_mutex_;
  std::vector<Slot> free_;
  std::unordered_map<tier::PageKey, Slot, tier::PageKeyHash> map_;
  tier::ReadTicket tickets_ = 0;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mutex_;
};
static_assert(tier::DeviceFastTier<DeviceTier>);

}  // namespace kvdrive::cuda
