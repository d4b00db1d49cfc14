// redis::State: everything RedisTier's callers share with its I/O thread, behind one pointer so
// the tier moves: the parameters, the job queues (jobs a caller waits for first, then the
// background's publishes and flushes), the read tickets, the byte budget, the statistics, and
// the thread itself. mu guards what both sides touch; the thread is joined when State goes,
// after it has run every queued job.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/redis/budget.hpp"
#include "kvdrive/tier/redis/job.hpp"
#include "kvdrive/tier/redis/params.hpp"
#include "kvdrive/tier/redis/value_mac.hpp"
#include "kvdrive/tier/redis_url.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier::redis {

struct State {
  RedisParams p;
  RedisUrl url;
  std::atomic<std::size_t> page_bytes = 0;  // set once, by open()
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<std::shared_ptr<Job>> queue;       // jobs a caller waits for
  std::deque<std::shared_ptr<Job>> background;  // publish() and flush()
  std::unordered_map<ReadTicket, std::shared_ptr<Job>> tickets;
  ReadTicket next_ticket = 0;
  std::string instance;          // this object's part of the plain StorageTier keys
  std::size_t queued_bytes = 0;  // publish() values not yet sent
  RemoteStats stats;
  ByteBudget budget;
  bool stopping = false;
  std::thread worker;

  ~State() { stop(); }

  std::unique_ptr<ValueMac> mac;  // Params::secret: values carry an HMAC, keys a namespace

  std::size_t header_bytes() const { return mac ? ValueMac::kHeaderBytes : RemoteValue::kHeaderBytes; }
  std::size_t value_bytes() const { return header_bytes() + page_bytes; }
  /// A page as stored under `key` (value_bytes() bytes into out): keyed with the secret, if any.
  void encode(std::string_view key, const std::byte* page, std::byte* out) const {
    if (mac) mac->encode(key, page, page_bytes, out);
    else RemoteValue::encode(key, page, page_bytes, out);
  }
  /// Checks a value read for `key` and copies its page into dst, only if it passes.
  bool decode(std::string_view key, const std::byte* value, std::size_t n, std::byte* dst) const {
    return mac ? mac->decode(key, value, n, dst, page_bytes) : RemoteValue::decode(key, value, n, dst, page_bytes);
  }
  void check_open() const { KVD_EXPECT(page_bytes > 0, "RedisTier: used before open()"); }

  std::string key_of(const PrefixDigest* prefix, const PageKey& k) const {
    const std::string who = prefix ? prefix->hex() : fmt::format("{}.seq{}", instance, k.sequence);
    if (mac) return fmt::format("{}:{}:{}:{}:{}:{}:{}", p.key_prefix, mac->key_namespace(), p.model.hex(), who, k.layer, k.head, k.page);
    return fmt::format("{}:{}:{}:{}:{}:{}", p.key_prefix, p.model.hex(), who, k.layer, k.head, k.page);
  }

  void push(std::shared_ptr<Job> job) {  // under mu
    const bool later = job->kind == Job::Kind::publish || job->kind == Job::Kind::barrier;
    (later ? background : queue).push_back(std::move(job));
    work_cv.notify_one();
  }

  /// The next job for the I/O thread, callers' first; waits. Null once stopping and drained.
  std::shared_ptr<Job> next() {
    std::unique_lock lock(mu);
    work_cv.wait(lock, [&] { return stopping || !queue.empty() || !background.empty(); });
    if (queue.empty() && background.empty()) return nullptr;  // stopping, and every queued job is done
    auto& from = queue.empty() ? background : queue;
    std::shared_ptr<Job> job = std::move(from.front());
    from.pop_front();
    return job;
  }

  /// The I/O thread is done with the job: its caller may go on.
  void finish(Job& job) {
    std::lock_guard lock(mu);
    if (job.kind == Job::Kind::publish) queued_bytes -= job.keys.size() * value_bytes();
    job.done = true;
    done_cv.notify_all();
  }

  void stop() {
    {
      std::lock_guard lock(mu);
      stopping = true;
      work_cv.notify_all();
    }
    if (worker.joinable()) worker.join();
  }
};

}  // namespace kvdrive::tier::redis
