// tier::FaultTier<Inner>: wraps a tier and injects read and write errors and read delays, for
// tests of failure handling (commit or nothing, Decision 8). It presents itself as a slow,
// non-addressable tier, so pages stored in it always go through the cache and fetch path.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
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

  /// After `n` more successful page reads, every read fails until heal().
  void fail_reads_after(std::uint64_t n) {
    std::lock_guard lock(mutex_);
    reads_left_ = n;
  }
  /// After `n` more successful page writes, every write fails until heal().
  void fail_writes_after(std::uint64_t n) {
    std::lock_guard lock(mutex_);
    writes_left_ = n;
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
  std::uint64_t reads() const { std::lock_guard lock(mutex_); return reads_; }
  std::uint64_t writes() const { std::lock_guard lock(mutex_); return writes_; }
  std::uint64_t injected_errors() const { std::lock_guard lock(mutex_); return errors_; }

  void open(const TierGeometry& g) { inner_.open(g); }

  void write(const PageKey& key, const std::byte* src) {
    {
      std::lock_guard lock(mutex_);
      if (writes_left_ == 0) {
        ++errors_;
        fail("FaultTier: injected write error on page {}", key);
      }
      if (writes_left_ != kNever) --writes_left_;
      ++writes_;
    }
    inner_.write(key, src);
  }

  ReadTicket submit(std::span<const ReadRequest> reads) {
    bool failed = false;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < reads.size(); ++i) {
        if (reads_left_ == 0) failed = true;
        else if (reads_left_ != kNever) --reads_left_;
      }
      reads_ += reads.size();
    }
    const ReadTicket inner_ticket = inner_.submit(reads);
    inner_.wait(inner_ticket);
    std::lock_guard lock(mutex_);
    const ReadTicket t = ++tickets_;
    if (failed) {
      ++errors_;
      failed_.insert(t);
    }
    return t;
  }

  void wait(ReadTicket t) {
    std::chrono::microseconds d;
    bool failed;
    {
      std::lock_guard lock(mutex_);
      d = delay_;
      failed = failed_.erase(t) != 0;
    }
    if (d.count() > 0) std::this_thread::sleep_for(d);
    if (failed) fail("FaultTier: injected read error (batch {})", t);
  }

  void erase(const PageKey& key) { inner_.erase(key); }
  bool contains(const PageKey& key) const { return inner_.contains(key); }
  std::size_t free_pages() const { return inner_.free_pages(); }

 private:
  Inner inner_;
  mutable std::mutex mutex_;
  std::uint64_t reads_left_ = kNever, writes_left_ = kNever;
  std::uint64_t reads_ = 0, writes_ = 0, errors_ = 0;
  std::chrono::microseconds delay_{};
  std::set<ReadTicket> failed_;
  ReadTicket tickets_ = 0;
};

}  // namespace kvdrive::tier
