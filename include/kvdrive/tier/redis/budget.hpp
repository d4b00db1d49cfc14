// RedisTier's byte budget: the values this tier stored on the server and has not seen expire or
// deleted, so that it keeps at most Params::byte_budget value bytes there (0: unbounded). All
// pages share one TTL, so they expire in write order (a queue); a rewrite or an erase bumps a
// key's generation, which retires its older place in the queue. Not thread-safe: RedisTier's
// mutex guards it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kvdrive/tier/redis/job.hpp"

namespace kvdrive::tier::redis {

class ByteBudget {
 public:
  enum class Take { refused, fresh, rewrite };

  void configure(std::uint64_t limit, std::int64_t ttl_ms) {
    limit_ = limit;
    ttl_ms_ = ttl_ms;
  }
  /// The bytes of one value (header and page); fixed when the tier opens.
  void set_value_bytes(std::size_t bytes) { value_bytes_ = bytes; }
  bool bounded() const { return limit_ != 0; }

  /// Pages that still fit (after forgetting what has expired).
  std::size_t room_pages(Clock::time_point now) {
    forget_expired(now);
    return used_ >= limit_ ? 0 : static_cast<std::size_t>((limit_ - used_) / value_bytes_);
  }

  /// Takes room for a value (a key it already holds takes none).
  Take take(const std::string& key, Clock::time_point now) {
    if (limit_ == 0) return Take::rewrite;
    forget_expired(now);
    if (stored_.contains(key)) return Take::rewrite;
    if (used_ + value_bytes_ > limit_) return Take::refused;
    used_ += value_bytes_;
    stored_[key] = Stored{++generation_};
    return Take::fresh;
  }

  /// A value the server took: it expires ttl_ms from now (the reply came after the SET arrived).
  void stored_at(const std::string& key, Clock::time_point now) {
    if (limit_ == 0 || ttl_ms_ == 0) return;
    auto it = stored_.find(key);
    if (it == stored_.end()) it = stored_.emplace(key, Stored{}).first;  // rewritten after its expiry was forgotten
    it->second.generation = ++generation_;
    expiry_.emplace_back(now + std::chrono::milliseconds(ttl_ms_), key, generation_);
  }

  /// A value that is gone (deleted, or a fresh one the server did not take).
  void give_back(const std::string& key) {
    if (limit_ == 0) return;
    if (stored_.erase(key)) used_ -= value_bytes_;
  }

 private:
  struct Stored {
    std::uint64_t generation = 0;
  };

  void forget_expired(Clock::time_point now) {
    while (!expiry_.empty() && std::get<0>(expiry_.front()) <= now) {
      const auto& [when, k, gen] = expiry_.front();
      if (auto it = stored_.find(k); it != stored_.end() && it->second.generation == gen) {
        stored_.erase(it);
        used_ -= value_bytes_;
      }
      expiry_.pop_front();
    }
  }

  std::uint64_t limit_ = 0;
  std::int64_t ttl_ms_ = 0;
  std::size_t value_bytes_ = std::numeric_limits<std::size_t>::max();
  std::unordered_map<std::string, Stored> stored_;
  std::deque<std::tuple<Clock::time_point, std::string, std::uint64_t>> expiry_;
  std::uint64_t used_ = 0, generation_ = 0;
};

}  // namespace kvdrive::tier::redis
