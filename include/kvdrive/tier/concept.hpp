// StorageTier: a place pages live. It stores whole pages by PageKey and reads batches of them
// into caller buffers asynchronously: submit() starts a batch and returns a ticket, wait()
// finishes it and throws kvdrive::Error if any read failed (the caller's buffers are then
// undefined, nothing else changed). Tiers whose pages sit in host memory are "addressable":
// the manager attends their pages in place through address() and never copies them
// (Decision 7). The first tier of a Tiers<...> list is also the fast tier: a slot pool for the
// pages that must be resident (sink, local, tail, cached, staged).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kvdrive/core/page_table.hpp"
#include "kvdrive/tier/page_key.hpp"

namespace kvdrive::tier {

/// What the manager tells a tier when it opens it.
struct TierGeometry {
  std::size_t page_bytes = 0;
  std::uint32_t layers = 0, kv_heads = 0;  ///< remote tiers: the streams one chain key names (0: not told)
};

struct ReadRequest {
  PageKey key;
  std::byte* dst = nullptr;  ///< page_bytes writable bytes
};

/// One page to store, for tiers that also take batches (write_batch(span<const WriteRequest>),
/// optional: KvManager uses it where present, so a tier can sync once per batch).
struct WriteRequest {
  PageKey key;
  const std::byte* src = nullptr;  ///< page_bytes bytes
};

/// Identifies a submitted batch of reads; 0 is never a valid ticket.
using ReadTicket = std::uint64_t;

template <class T>
concept StorageTier = requires(T& t, const T& ct, const PageKey& key, const std::byte* src, std::span<const ReadRequest> reads, ReadTicket ticket,
                               const TierGeometry& g) {
  { T::kAddressable } -> std::convertible_to<bool>;
  { ct.name() } -> std::convertible_to<std::string_view>;
  { t.open(g) } -> std::same_as<void>;
  { t.write(key, src) } -> std::same_as<void>;  // store or overwrite one page
  { t.submit(reads) } -> std::same_as<ReadTicket>;
  { t.wait(ticket) } -> std::same_as<void>;
  { t.erase(key) } -> std::same_as<void>;
  { ct.contains(key) } -> std::same_as<bool>;
  { ct.free_pages() } -> std::convertible_to<std::size_t>;  // SIZE_MAX if unbounded
};

/// A tier whose pages can be attended where they are.
template <class T>
concept AddressableTier = StorageTier<T> && T::kAddressable && requires(const T& t, const PageKey& key) {
  { t.address(key) } -> std::same_as<const std::byte*>;
};

/// A tier that can serve as the fast tier: a pool of page-sized slots.
using Slot = kvdrive::Slot;
template <class T>
concept FastTier = StorageTier<T> && requires(T& t, Slot s) {
  { t.allocate() } -> std::same_as<Slot>;  // throws kvdrive::Error when full
  { t.release(s) } -> std::same_as<void>;
  { t.slot_data(s) } -> std::same_as<std::byte*>;
};

/// One whole page from host memory into a fast-tier slot.
struct SlotUpload {
  Slot slot = -1;
  const std::byte* src = nullptr;  ///< page_bytes bytes in host memory
};

/// A fast tier in memory the host cannot dereference (device memory: cuda::DeviceTier). Its
/// slot_data() is the slot's address in that memory, for the backend to attend; the manager
/// moves bytes in and out only through these calls, which return once the copy is done. A
/// KvManager over such a tier needs a backend::DeviceBackend to attend it, keeps each stream's
/// tail page in host memory too (new tokens are written there, then uploaded), and reads missed
/// pages into pinned host buffers (pin_host) before it uploads them.
template <class T>
concept DeviceFastTier = FastTier<T> && T::kDeviceMemory &&
    requires(T& t, Slot s, std::size_t offset, const std::byte* src, std::byte* dst, std::size_t n, std::span<const SlotUpload> pages) {
  t.upload(s, offset, src, n);  // host bytes into [offset, offset + n) of the slot
  t.upload_pages(pages);        // whole pages, in one batch
  t.download(s, dst);           // the whole slot into host memory
  t.pin_host(dst, n);           // host memory the manager will upload from (staging)
};

}  // namespace kvdrive::tier
