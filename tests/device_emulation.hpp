// An emulated device, so that the CPU tests cover KvManager's device path (a fast tier the host
// cannot read, attended by the backend) without a GPU:
//   EmulatedDeviceTier     a tier::DeviceFastTier whose slot addresses are host addresses with
//                          bit 55 flipped: non-canonical on x86-64 and AArch64 (outside the top
//                          byte AArch64 may ignore), so any host access through one faults (the
//                          test crashes) instead of quietly working as it would on a CPU;
//   EmulatedDeviceBackend  a backend::DeviceBackend that attends a PagedDecode after turning the
//                          addresses back, with the CPU's split-KV math (the same calls as the
//                          host path, so the outputs must be the same bits).
// Counters say how many bytes went each way, and how much host memory was pinned.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "kvdrive/kvdrive.hpp"

namespace kvdrive::test {

inline constexpr std::uintptr_t kDeviceTag = std::uintptr_t{1} << 55;

inline std::byte* to_device(std::byte* host) { return reinterpret_cast<std::byte*>(reinterpret_cast<std::uintptr_t>(host) ^ kDeviceTag); }
inline const std::byte* to_host(const std::byte* device) {
  return reinterpret_cast<const std::byte*>(reinterpret_cast<std::uintptr_t>(device) ^ kDeviceTag);
}

class EmulatedDeviceTier {
 public:
  static constexpr bool kAddressable = false;
  static constexpr bool kDeviceMemory = true;

  struct Counters {
    std::atomic<std::uint64_t> uploaded{0}, downloaded{0}, pinned{0}, upload_batches{0};
  };

  explicit EmulatedDeviceTier(std::size_t capacity_pages = 0) : host_(tier::HostTier::Params{capacity_pages}) {}
  EmulatedDeviceTier(EmulatedDeviceTier&& o) noexcept : host_(std::move(o.host_)) {}

  std::string_view name() const { return "emulated-device"; }
  void open(const tier::TierGeometry& g) {
    page_bytes_ = g.page_bytes;
    host_.open(g);
  }

  // Keyed store (unused by KvManager as a fast tier; kept for the concept).
  void write(const tier::PageKey& key, const std::byte* src) { host_.write(key, src); }
  tier::ReadTicket submit(std::span<const tier::ReadRequest> reads) { return host_.submit(reads); }
  void wait(tier::ReadTicket t) { host_.wait(t); }
  void erase(const tier::PageKey& key) { host_.erase(key); }
  bool contains(const tier::PageKey& key) const { return host_.contains(key); }
  std::size_t free_pages() const { return host_.free_pages(); }
  std::size_t used_pages() const { return host_.used_pages(); }

  Slot allocate() { return host_.allocate(); }
  void release(Slot s) { host_.release(s); }
  std::byte* slot_data(Slot s) { return to_device(host_.slot_data(s)); }

  void upload(Slot s, std::size_t offset, const std::byte* src, std::size_t n) {
    KVD_EXPECT(offset + n <= page_bytes_, "EmulatedDeviceTier::upload: [{}, {}) outside a page of {} bytes", offset, offset + n, page_bytes_);
    std::memcpy(host_.slot_data(s) + offset, src, n);
    counters.uploaded += n;
  }
  void upload_pages(std::span<const tier::SlotUpload> pages) {
    for (const tier::SlotUpload& u : pages) std::memcpy(host_.slot_data(u.slot), u.src, page_bytes_);
    counters.uploaded += pages.size() * page_bytes_;
    ++counters.upload_batches;
  }
  void download(Slot s, std::byte* dst) {
    std::memcpy(dst, host_.slot_data(s), page_bytes_);
    counters.downloaded += page_bytes_;
  }
  void pin_host(std::byte*, std::size_t n) { counters.pinned += n; }

  Counters counters;

 private:
  tier::HostTier host_;
  std::size_t page_bytes_ = 0;
};
static_assert(tier::DeviceFastTier<EmulatedDeviceTier>);
static_assert(!tier::DeviceFastTier<tier::HostTier>);

class EmulatedDeviceBackend {
 public:
  EmulatedDeviceBackend() : EmulatedDeviceBackend(2) {}
  explicit EmulatedDeviceBackend(unsigned threads) : cpu_({threads}) {}
  EmulatedDeviceBackend(EmulatedDeviceBackend&&) = default;

  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { cpu_.parallel_for(n, fn); }

  void attend(const backend::PagedDecode& d) {
    KVD_EXPECT(d.offsets.size() == d.streams + 1 && d.offsets.back() == d.pages.size() && d.tokens.size() == d.pages.size(),
               "EmulatedDeviceBackend: inconsistent PagedDecode");
    ++calls;
    const std::size_t g = static_cast<std::size_t>(d.group), hd = static_cast<std::size_t>(d.head_dim);
    std::vector<attention::PageRef> refs;
    std::vector<float> split_out, split_lse;
    for (std::size_t s = 0; s < d.streams; ++s) {
      refs.clear();
      for (std::uint32_t i = d.offsets[s]; i < d.offsets[s + 1]; ++i) {
        const std::byte* k = to_host(d.pages[i]);
        refs.push_back({k, k + d.block_bytes, d.tokens[i]});
      }
      const std::size_t splits = attention::split_count(refs.size());
      split_out.assign(splits * g * hd, 0.0f);
      split_lse.assign(splits * g, 0.0f);
      for (std::size_t sp = 0; sp < splits; ++sp) {
        const std::size_t a = sp * attention::kSplitPages, b = std::min(refs.size(), a + attention::kSplitPages);
        attention::DecodeArgs args;
        args.q = d.q + s * g * hd;
        args.group = d.group;
        args.head_dim = d.head_dim;
        args.scale = d.scale;
        args.pages = std::span<const attention::PageRef>(refs).subspan(a, b - a);
        args.out = split_out.data() + sp * g * hd;
        args.lse = split_lse.data() + sp * g;
        args.page_lse = d.page_lse + (d.offsets[s] + a) * g;
        dispatch_dtype(d.dtype, [&](auto tag) { attention::sparse_decode<typename decltype(tag)::type>(args); });
      }
      attention::merge_splits(d.group, d.head_dim, splits, split_out.data(), split_lse.data(), d.out + s * g * hd, d.lse + s * g);
    }
  }

  std::uint64_t calls = 0;

 private:
  backend::Cpu cpu_;
};
static_assert(backend::DeviceBackend<EmulatedDeviceBackend>);
static_assert(!backend::DeviceBackend<backend::Cpu>);

}  // namespace kvdrive::test
