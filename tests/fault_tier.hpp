// tier::FaultTier<Inner>: wraps a tier and injects faults, for tests of failure handling
// (commit or nothing, Decision 8): read errors (EIO or a short read, each naming the page),
// write errors (EIO or ENOSPC) and read latency. It presents itself as a slow, non-addressable
// tier, so pages stored in it always go through the cache and fetch path. Batched writes are
// passed on as batches, all or nothing. Faults below a tier (bit flips on the medium, power
// loss, any failing file operation of SsdTier) are the File seam's: tests/fault_file.hpp.
// A test tool, not a product tier: it lives with the tests, out of kvdrive/kvdrive.hpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <thread>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"

namespace kvdrive::tier {

template <StorageTier Inner>
class FaultTier {
 public:
  static constexpr bool kAddressable = false;
  static constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

  FaultTier() = default;
  explicit FaultTier(Inner inner) : inner_(std::move(inner)) {}
  FaultTier(FaultTier&& o) noexcept : inner_(std::move(o.inner_)) {}

  std::string_view name() const { return "fault"; }
  Inner& inner() { return inner_; }

  enum class ReadFault { eio, short_read };
  enum class WriteFault { eio, no_space };

  /// After `n` more successful page reads, every read fails until heal().
  void fail_reads_after(std::uint64_t n, ReadFault kind = ReadFault::eio) {
    std::lock_guard lock(mutex_);
    reads_left_ = n;
    read_fault_ = kind;
  }
  /// After `n` more successful page writes, every write fails until heal().
  void fail_writes_after(std::uint64_t n, WriteFault kind = WriteFault::eio) {
    std::lock_guard lock(mutex_);
    writes_left_ = n;
    write_fault_ = kind;
  }
  /// Each read batch sleeps this long before completing.
  void delay_reads(std::chrono::microseconds d) {
    std::lock_guard lock(mutex_);
    delay_ = d;
  }
  void heal() {
    std::lock_guard lock(mutex_);
    reads_left_ = writes_left_ = kNever;
    delay_ = {};
  }
  std::uint64_t reads() const {
    std::lock_guard lock(mutex_);
    return reads_;
  }
  std::uint64_t writes() const {
    std::lock_guard lock(mutex_);
    return writes_;
  }
  std::uint64_t injected_errors() const {
    std::lock_guard lock(mutex_);
    return errors_;
  }

  void open(const TierGeometry& g) { inner_.open(g); }

  void write(const PageKey& key, const std::byte* src) {
    count_writes(key, 1);
    inner_.write(key, src);
  }

  /// All or nothing: if any page of the batch would fail, none is written.
  void write_batch(std::span<const WriteRequest> pages) requires requires(Inner& i) { i.write_batch(pages); }
  {
    if (pages.empty()) return;
    count_writes(pages.front().key, pages.size());
    inner_.write_batch(pages);
  }

  ReadTicket submit(std::span<const ReadRequest> reads) {
    std::optional<PageKey> failed;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < reads.size(); ++i) {
        if (reads_left_ == 0 && !failed) failed = reads[i].key;
        else if (reads_left_ != kNever && reads_left_ > 0) --reads_left_;
      }
      reads_ += reads.size();
    }
    const ReadTicket inner_ticket = inner_.submit(reads);
    try {
      std::lock_guard lock(mutex_);
      const ReadTicket t = ++tickets_;
      inner_tickets_.emplace(t, inner_ticket);
      if (failed) {
        ++errors_;
        failed_.emplace(t, *failed);
      }
      return t;
    } catch (...) {  // out of memory: no read may be left in flight without a ticket
      inner_.wait(inner_ticket);
      throw;
    }
  }

  void wait(ReadTicket t) {
    std::chrono::microseconds d;
    std::optional<PageKey> failed;
    ReadFault kind;
    ReadTicket inner_ticket = 0;
    {
      std::lock_guard lock(mutex_);
      d = delay_;
      kind = read_fault_;
      if (auto it = failed_.find(t); it != failed_.end()) {
        failed = it->second;
        failed_.erase(it);
      }
      auto in = inner_tickets_.find(t);
      KVD_EXPECT(in != inner_tickets_.end(), "FaultTier: unknown read ticket {}", t);
      inner_ticket = in->second;
      inner_tickets_.erase(in);
    }
    inner_.wait(inner_ticket);  // the inner reads run (or finish) here; an injected error comes after them
    if (d.count() > 0) std::this_thread::sleep_for(d);
    if (failed && kind == ReadFault::short_read) fail("FaultTier: injected short read of page {} (batch {})", *failed, t);
    if (failed) fail("FaultTier: injected read error (EIO) on page {} (batch {})", *failed, t);
  }

  void erase(const PageKey& key) { inner_.erase(key); }
  /// Makes the inner tier's erases durable, where it defers them.
  void sync() requires requires(Inner& i) { i.sync(); }
  { inner_.sync(); }
  bool contains(const PageKey& key) const { return inner_.contains(key); }
  std::size_t free_pages() const { return inner_.free_pages(); }
  /// Registers memory with the inner tier, where it takes registrations.
  bool register_memory(std::byte* p, std::size_t bytes) requires requires(Inner& i) { i.register_memory(p, bytes); }
  { return inner_.register_memory(p, bytes); }

 private:
  /// Counts `n` page writes, failing them all if the budget of good writes runs out.
  void count_writes(const PageKey& first, std::size_t n) {
    std::lock_guard lock(mutex_);
    if (writes_left_ != kNever && writes_left_ < n) {
      ++errors_;
      if (write_fault_ == WriteFault::no_space) fail("FaultTier: injected no space left on device, writing page {}", first);
      fail("FaultTier: injected write error on page {}", first);
    }
    if (writes_left_ != kNever) writes_left_ -= n;
    writes_ += n;
  }

  Inner inner_;
  mutable std::mutex mutex_;
  ReadFault read_fault_ = ReadFault::eio;
  WriteFault write_fault_ = WriteFault::eio;
  std::uint64_t reads_left_ = kNever, writes_left_ = kNever;
  std::uint64_t reads_ = 0, writes_ = 0, errors_ = 0;
  std::chrono::microseconds delay_{};
  std::map<ReadTicket, PageKey> failed_;            ///< batches that fail, and the first failing page
  std::map<ReadTicket, ReadTicket> inner_tickets_;  ///< each batch's ticket with the inner tier
  ReadTicket tickets_ = 0;
};

}  // namespace kvdrive::tier
