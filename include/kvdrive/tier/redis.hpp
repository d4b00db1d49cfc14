// tier::RedisTier: a remote tier on a Redis (or Valkey) server, through hiredis. Engines that
// serve the same prompt prefix share its KV pages through it instead of recomputing them
// (KvManager::share_prefixes, load_prefix; docs/remote.md).
//
// - Keys: "<key_prefix>:<model digest>:<page digest>:<layer>:<head>:<page>" for shared pages
//   (publish, lookup, submit with a page chain: the page digest is chain[page]). As a plain StorageTier (PageKey only) the middle
//   part is "<tier instance>.seq<N>", private to this object.
// - Values: the page behind a 16-byte header whose checksum is bound to the key (RemoteValue);
//   a value that fails it is a miss ("corrupt"), never data. With Params::secret, a 40-byte
//   header with an HMAC-SHA-256 of key and page under the deployment's secret instead
//   (redis/value_mac.hpp), and keys in the deployment's namespace: values from a client without
//   the secret fail it.
// - One I/O thread owns the connection. Reads (submit/wait, so the caller overlaps them),
//   lookups and other calls that wait run first, in order; best-effort writes (publish) run
//   when none is waiting. Commands are pipelined, max_in_flight at a time.
// - Retention: a TTL on every stored page, and a byte budget on what this tier keeps stored.
// - Failure: a down server, a timeout or an error reply counts as an error and a miss. A job
//   whose connection fails before any reply retries once on a new connection (a restarted
//   server); after any other failure the tier fails fast for retry_after_ms, then tries again.
//   The server never holds the only copy of a page (KvManager keeps every page on its own
//   tiers). The checksums catch damage, not malice: the server must be trusted.
//
// Parts: redis/params.hpp (Params), redis/job.hpp (a call's unit of work), redis/state.hpp
// (what callers share with the I/O thread), redis/io_thread.hpp (the thread and its commands),
// redis/connection.hpp (hiredis: connecting, pipelining), redis/budget.hpp (the byte budget).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/redis/io_thread.hpp"
#include "kvdrive/tier/redis/job.hpp"
#include "kvdrive/tier/redis/params.hpp"
#include "kvdrive/tier/redis/state.hpp"
#include "kvdrive/tier/redis_url.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier {

class RedisTier {
 public:
  using Params = RedisParams;

  static constexpr bool kAddressable = false;

  RedisTier() : RedisTier(Params{}) {}
  /// Parses and checks the parameters (throws kvdrive::Error on a bad URL or value); connects
  /// lazily, on the first command.
  explicit RedisTier(Params p) : s_(std::make_unique<redis::State>()) {
    s_->url = RedisUrl::parse(p.url);
    KVD_EXPECT(p.ttl_ms >= 0 && p.ttl_ms <= (std::int64_t{1} << 40), "RedisTier: ttl_ms is {}, expected 0..2^40 (0: no expiry)", p.ttl_ms);
    KVD_EXPECT(p.timeout_ms > 0, "RedisTier: timeout_ms is {}, expected > 0", p.timeout_ms);
    KVD_EXPECT(p.retry_after_ms >= 0, "RedisTier: retry_after_ms is {}, expected >= 0", p.retry_after_ms);
    KVD_EXPECT(p.max_in_flight >= 1 && p.max_in_flight <= 65536, "RedisTier: max_in_flight is {}, expected 1..65536", p.max_in_flight);
    KVD_EXPECT(!p.key_prefix.empty(), "RedisTier: empty key_prefix");
    s_->budget.configure(p.byte_budget, p.ttl_ms);
    if (!p.secret.empty()) s_->mac = std::make_unique<redis::ValueMac>(p.secret);
    s_->p = std::move(p);
    s_->instance = fmt::format("{:016x}", std::random_device{}() * 0x100000001ull ^ std::random_device{}());
  }
  RedisTier(RedisTier&&) noexcept = default;
  RedisTier& operator=(RedisTier&&) noexcept = default;
  /// Finishes the queued work (publishes included), then disconnects.
  ~RedisTier() = default;

  std::string_view name() const { return "redis"; }
  const RedisUrl& url() const { return s_->url; }
  const Params& params() const { return s_->p; }

  /// Fixes the page size (one per tier; several managers with that page size may share it) and
  /// starts the I/O thread.
  void open(const TierGeometry& g) {
    KVD_EXPECT(g.page_bytes > 0 && g.page_bytes <= (std::size_t{256} << 20),
               "RedisTier: page_bytes {} out of range 1..256 MiB (Redis takes values up to 512 MB)", g.page_bytes);
    std::lock_guard lock(s_->mu);
    KVD_EXPECT(s_->page_bytes == 0 || s_->page_bytes == g.page_bytes,
               "RedisTier: opened for {}-byte pages, now asked for {} (one tier serves one page size)", s_->page_bytes.load(), g.page_bytes);
    if (s_->worker.joinable()) return;
    s_->budget.set_value_bytes(s_->header_bytes() + g.page_bytes);
    s_->worker = std::thread([s = s_.get()] { redis::IoThread(*s).run(); });
    s_->page_bytes = g.page_bytes;  // read by the I/O thread only after a job is queued under mu
  }

  // ---- sharing (RemoteTier): pages addressed by content --------------------------------------

  /// The Redis key of a shared page: its page digest (its chain's entry), and the key's layer,
  /// head and page (its sequence is not part of it).
  std::string key(const PrefixDigest& page_digest, const PageKey& k) const { return s_->key_of(&page_digest, k); }
  /// The Redis key of a page stored through the plain StorageTier calls.
  std::string key(const PageKey& k) const { return s_->key_of(nullptr, k); }

  /// Stores shared pages in the background, best effort: copies them and returns at once; never
  /// throws. Pages past the byte budget or the queue's limit are not stored (remote_stats()).
  void publish(PageChain chain, std::span<const WriteRequest> pages) noexcept {
    if (pages.empty() || s_->page_bytes == 0) return;
    if (std::ranges::any_of(pages, [&](const WriteRequest& w) { return w.key.page >= chain.size(); })) return;  // not shared: no key
    try {
      auto job = std::make_shared<Job>();
      job->kind = Job::Kind::publish;
      const std::size_t vb = s_->value_bytes();
      job->keys.reserve(pages.size());
      job->values.resize(pages.size() * vb);
      for (std::size_t i = 0; i < pages.size(); ++i) {
        job->keys.push_back(s_->key_of(&chain[pages[i].key.page], pages[i].key));
        s_->encode(job->keys.back(), pages[i].src, job->values.data() + i * vb);
      }
      std::lock_guard lock(s_->mu);
      // Over the backlog limit: keep the first pages that fit, drop the rest.
      const std::size_t room = s_->p.max_queued_bytes > s_->queued_bytes ? (s_->p.max_queued_bytes - s_->queued_bytes) / vb : 0;
      const std::size_t n = std::min(room, job->keys.size());
      s_->stats.dropped += pages.size() - n;
      if (n == 0) return;
      job->keys.resize(n);
      job->values.resize(n * vb);
      try {
        s_->push(job);
      } catch (...) {
        s_->stats.dropped += n;
        return;
      }
      s_->queued_bytes += n * vb;
    } catch (...) {  // out of memory before the lock: these pages are not shared, which is allowed
      try {
        std::lock_guard lock(s_->mu);
        s_->stats.dropped += pages.size();
      } catch (...) {
      }
    }
  }

  /// Starts reading shared pages into the callers' buffers; returns at once.
  ReadTicket submit(PageChain chain, std::span<const ReadRequest> reads) {
    for (const ReadRequest& r : reads) KVD_EXPECT(r.key.page < chain.size(), "RedisTier: page {} is past its chain of {} pages", r.key, chain.size());
    return submit_reads(chain, reads);
  }

  /// Blocks until every page queued by publish() so far is stored or given up.
  void flush() {
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::barrier;
    run_sync(job);
  }

  /// How many leading pages (0, 1, ...) of the chain are present for every layer < layers and
  /// head < heads. A server that fails counts as holding nothing more.
  std::uint32_t lookup(PageChain chain, std::uint32_t layers, std::uint32_t heads) {
    if (layers == 0 || heads == 0 || chain.empty()) return 0;
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::lookup;
    job->lookup = {std::vector<PrefixDigest>(chain.begin(), chain.end()), layers, heads};
    run_sync(job);
    return job->found;
  }

  // ---- StorageTier -----------------------------------------------------------------------------

  /// Stores one page and waits for it; throws kvdrive::Error if it was not stored.
  void write(const PageKey& key, const std::byte* src) {
    const WriteRequest one{key, src};
    write_batch(std::span<const WriteRequest>(&one, 1));
  }

  void write_batch(std::span<const WriteRequest> pages) {
    if (pages.empty()) return;
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::write;
    s_->check_open();
    const std::size_t vb = s_->value_bytes();
    job->values.resize(pages.size() * vb);
    for (std::size_t i = 0; i < pages.size(); ++i) {
      job->keys.push_back(s_->key_of(nullptr, pages[i].key));
      s_->encode(job->keys.back(), pages[i].src, job->values.data() + i * vb);
    }
    run_sync(job);
    KVD_EXPECT(job->stored == pages.size(), "RedisTier: stored {} of {} pages on {} ({})", job->stored, pages.size(), s_->url.describe(),
               job->why.empty() ? "byte budget full" : job->why);
  }

  /// Starts reading pages (stored through write()) into the callers' buffers; returns at once.
  ReadTicket submit(std::span<const ReadRequest> reads) { return submit_reads({}, reads); }

  /// Finishes a read batch and reports each read's outcome (in submit order); never throws for
  /// a server's trouble. A buffer whose read is not a hit holds undefined bytes.
  void wait_each(ReadTicket ticket, std::span<RemoteRead> outcomes) {
    std::shared_ptr<Job> job = take(ticket);
    KVD_EXPECT(outcomes.size() == job->outcomes.size(), "RedisTier::wait_each: {} outcome slots for {} reads", outcomes.size(), job->outcomes.size());
    std::copy(job->outcomes.begin(), job->outcomes.end(), outcomes.begin());
  }

  /// Finishes a read batch; throws kvdrive::Error if any read was not a hit.
  void wait(ReadTicket ticket) {
    std::shared_ptr<Job> job = take(ticket);
    for (std::size_t i = 0; i < job->outcomes.size(); ++i)
      if (job->outcomes[i] != RemoteRead::hit)
        fail("RedisTier: reading {} from {}: {}", job->keys[i], s_->url.describe(), describe(job->outcomes[i]));
  }

  /// Deletes a page's key (best effort: if the server cannot be asked, the key stays until its
  /// TTL or the server's eviction removes it).
  void erase(const PageKey& key) { run_one(Job::Kind::erase, key); }

  /// Whether the server holds the page's key now (false when it cannot be asked).
  bool contains(const PageKey& key) const { return run_one(Job::Kind::exists, key)->found == 1; }

  /// Room left in the byte budget, in pages (SIZE_MAX when unbounded).
  std::size_t free_pages() const {
    std::lock_guard lock(s_->mu);
    if (s_->p.byte_budget == 0 || s_->page_bytes == 0) return std::numeric_limits<std::size_t>::max();
    return s_->budget.room_pages(Clock::now());
  }

  RemoteStats remote_stats() const {
    std::lock_guard lock(s_->mu);
    return s_->stats;
  }

  static const char* describe(RemoteRead r) {
    switch (r) {
      case RemoteRead::hit: return "hit";
      case RemoteRead::missing: return "not on the server";
      case RemoteRead::corrupt: return "the value failed its checksum or size check";
      case RemoteRead::error: return "no answer (server down, timeout or error reply)";
    }
    return "?";
  }

 private:
  using Job = redis::Job;
  using Clock = redis::Clock;

  /// Reads pages by their chain's keys, or (an empty chain) by the plain StorageTier keys.
  ReadTicket submit_reads(PageChain chain, std::span<const ReadRequest> reads) {
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::read;
    s_->check_open();
    job->keys.reserve(reads.size());
    job->dst.reserve(reads.size());
    for (const ReadRequest& r : reads) {
      job->keys.push_back(s_->key_of(chain.empty() ? nullptr : &chain[r.key.page], r.key));
      job->dst.push_back(r.dst);
    }
    job->outcomes.assign(reads.size(), RemoteRead::error);
    std::lock_guard lock(s_->mu);
    const ReadTicket t = ++s_->next_ticket;
    s_->tickets.emplace(t, job);
    s_->push(job);
    return t;
  }

  /// Runs a one-key job (erase, exists) and waits for it.
  std::shared_ptr<Job> run_one(typename Job::Kind kind, const PageKey& key) const {
    auto job = std::make_shared<Job>();
    job->kind = kind;
    s_->check_open();
    job->keys.push_back(s_->key_of(nullptr, key));
    run_sync(job);
    return job;
  }

  void run_sync(const std::shared_ptr<Job>& job) const {
    std::unique_lock lock(s_->mu);
    s_->check_open();
    s_->push(job);
    s_->done_cv.wait(lock, [&] { return job->done; });
  }

  std::shared_ptr<Job> take(ReadTicket ticket) {
    std::unique_lock lock(s_->mu);
    const auto it = s_->tickets.find(ticket);
    KVD_EXPECT(it != s_->tickets.end(), "RedisTier: unknown read ticket {}", ticket);
    std::shared_ptr<Job> job = it->second;
    s_->tickets.erase(it);
    s_->done_cv.wait(lock, [&] { return job->done; });
    return job;
  }

  std::unique_ptr<redis::State> s_;
};

static_assert(StorageTier<RedisTier>);
static_assert(RemoteTier<RedisTier>);

}  // namespace kvdrive::tier
