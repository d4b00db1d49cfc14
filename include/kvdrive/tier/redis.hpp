// tier::RedisTier: a remote tier on a Redis (or Valkey) server, through hiredis. Engines that
// serve the same prompt prefix share its KV pages through it instead of recomputing them
// (KvManager::share_prefixes, load_prefix; docs/remote.md).
//
// - Keys: "<key_prefix>:<model digest>:<prefix digest>:<layer>:<head>:<page>" for shared pages
//   (publish, lookup, submit with a digest). As a plain StorageTier (PageKey only) the middle
//   part is "<tier instance>.seq<N>", private to this object.
// - Values: the page behind a 16-byte header whose checksum is bound to the key (RemoteValue);
//   a value that fails it is a miss ("corrupt"), never data.
// - One I/O thread owns the connection. Reads (submit/wait, so the caller overlaps them),
//   lookups and other calls that wait run first, in order; best-effort writes (publish) run
//   when none is waiting. Commands are pipelined, max_in_flight at a time.
// - Retention: a TTL on every stored page, and a byte budget on what this tier keeps stored.
// - Failure: a down server, a timeout or an error reply counts as an error and a miss. A job
//   whose connection fails before any reply retries once on a new connection (a restarted
//   server); after any other failure the tier fails fast for retry_after_ms, then tries again.
//   The server never holds the only copy of a page (KvManager keeps every page on its own
//   tiers). The checksums catch damage, not malice: the server must be trusted.
#pragma once

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <random>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/redis_url.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier {

class RedisTier {
 public:
  struct Params {
    std::string url = "redis://127.0.0.1:6379/0";  ///< see RedisUrl
    PrefixDigest model{};            ///< the model/run digest: what else decides the K/V (weights, RoPE, ...)
    std::string key_prefix = "kvd";  ///< first part of every key
    std::int64_t ttl_ms = 0;         ///< stored pages expire after this long; 0: never
    std::uint64_t byte_budget = 0;   ///< value bytes this tier keeps stored at most; 0: unbounded
    int timeout_ms = 1000;           ///< connecting, and waiting for each reply
    int retry_after_ms = 1000;       ///< after a failed connection attempt, fail fast this long
    std::size_t max_in_flight = 64;  ///< commands sent before their replies are read (1..65536)
    std::size_t max_queued_bytes = std::size_t{256} << 20;  ///< publish() drops pages past this backlog
  };

  static constexpr bool kAddressable = false;

  RedisTier() : RedisTier(Params{}) {}
  /// Parses and checks the parameters (throws kvdrive::Error on a bad URL or value); connects
  /// lazily, on the first command.
  explicit RedisTier(Params p) : s_(std::make_unique<State>()) {
    s_->url = RedisUrl::parse(p.url);
    KVD_EXPECT(p.ttl_ms >= 0 && p.ttl_ms <= (std::int64_t{1} << 40), "RedisTier: ttl_ms is {}, expected 0..2^40 (0: no expiry)", p.ttl_ms);
    KVD_EXPECT(p.timeout_ms > 0, "RedisTier: timeout_ms is {}, expected > 0", p.timeout_ms);
    KVD_EXPECT(p.retry_after_ms >= 0, "RedisTier: retry_after_ms is {}, expected >= 0", p.retry_after_ms);
    KVD_EXPECT(p.max_in_flight >= 1 && p.max_in_flight <= 65536, "RedisTier: max_in_flight is {}, expected 1..65536",
               p.max_in_flight);
    KVD_EXPECT(!p.key_prefix.empty(), "RedisTier: empty key_prefix");
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
    s_->worker = std::thread([s = s_.get()] { s->run(); });
    s_->page_bytes = g.page_bytes;  // read by the I/O thread only after a job is queued under mu
  }

  // ---- sharing (RemoteTier): pages addressed by content --------------------------------------

  /// The Redis key of a shared page: the prefix digest, and the key's layer, head and page (its
  /// sequence is not part of it).
  std::string key(const PrefixDigest& prefix, const PageKey& k) const { return s_->key_of(&prefix, k); }
  /// The Redis key of a page stored through the plain StorageTier calls.
  std::string key(const PageKey& k) const { return s_->key_of(nullptr, k); }

  /// Stores shared pages in the background, best effort: copies them and returns at once; never
  /// throws. Pages past the byte budget or the queue's limit are not stored (remote_stats()).
  void publish(const PrefixDigest& prefix, std::span<const WriteRequest> pages) noexcept {
    if (pages.empty() || s_->page_bytes == 0) return;
    try {
      auto job = std::make_shared<Job>();
      job->kind = Job::Kind::publish;
      const std::size_t vb = s_->value_bytes();
      job->keys.reserve(pages.size());
      job->values.resize(pages.size() * vb);
      for (std::size_t i = 0; i < pages.size(); ++i) {
        job->keys.push_back(s_->key_of(&prefix, pages[i].key));
        RemoteValue::encode(job->keys.back(), pages[i].src, s_->page_bytes, job->values.data() + i * vb);
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
  ReadTicket submit(const PrefixDigest& prefix, std::span<const ReadRequest> reads) { return submit_reads(&prefix, reads); }

  /// Blocks until every page queued by publish() so far is stored or given up.
  void flush() {
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::barrier;
    run_sync(job);
  }

  /// How many leading pages (0, 1, ...) of the prefix are present for every layer < layers and
  /// head < heads, up to max_pages. A server that fails counts as holding nothing more.
  std::uint32_t lookup(const PrefixDigest& prefix, std::uint32_t layers, std::uint32_t heads, std::uint32_t max_pages) {
    if (layers == 0 || heads == 0 || max_pages == 0) return 0;
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::lookup;
    job->lookup = {prefix, layers, heads, max_pages};
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
      RemoteValue::encode(job->keys.back(), pages[i].src, s_->page_bytes, job->values.data() + i * vb);
    }
    run_sync(job);
    KVD_EXPECT(job->stored == pages.size(), "RedisTier: stored {} of {} pages on {} ({})", job->stored, pages.size(),
               s_->url.describe(), job->why.empty() ? "byte budget full" : job->why);
  }

  /// Starts reading pages (stored through write()) into the callers' buffers; returns at once.
  ReadTicket submit(std::span<const ReadRequest> reads) { return submit_reads(nullptr, reads); }

  /// Finishes a read batch and reports each read's outcome (in submit order); never throws for
  /// a server's trouble. A buffer whose read is not a hit holds undefined bytes.
  void wait_each(ReadTicket ticket, std::span<RemoteRead> outcomes) {
    std::shared_ptr<Job> job = take(ticket);
    KVD_EXPECT(outcomes.size() == job->outcomes.size(), "RedisTier::wait_each: {} outcome slots for {} reads", outcomes.size(),
               job->outcomes.size());
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
    s_->forget_expired(Clock::now());
    const std::uint64_t used = s_->budget_used;
    return used >= s_->p.byte_budget ? 0 : static_cast<std::size_t>((s_->p.byte_budget - used) / s_->value_bytes());
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
  using Clock = std::chrono::steady_clock;

  struct Job {
    enum class Kind { read, write, publish, erase, exists, lookup, barrier } kind = Kind::read;
    std::vector<std::string> keys;
    std::vector<std::byte> values;  // write/publish: encoded values, value_bytes each
    std::vector<std::byte*> dst;    // read
    std::vector<RemoteRead> outcomes;
    struct {
      PrefixDigest prefix;
      std::uint32_t layers = 0, heads = 0, max_pages = 0;
    } lookup;
    std::size_t stored = 0;
    std::uint32_t found = 0;
    std::string why;  // the last connection or reply error
    bool replied = false;  // the server has answered part of it
    bool done = false;
  };

  /// Everything the I/O thread shares with callers; behind a pointer so the tier moves.
  struct State {
    Params p;
    RedisUrl url;
    std::atomic<std::size_t> page_bytes = 0;  // set once, by open()
    std::mutex mu;
    std::condition_variable work_cv, done_cv;
    std::deque<std::shared_ptr<Job>> queue;       // jobs a caller waits for
    std::deque<std::shared_ptr<Job>> background;  // publish() and flush()
    std::unordered_map<ReadTicket, std::shared_ptr<Job>> tickets;
    ReadTicket next_ticket = 0;
    std::string instance;  // this object's part of the plain StorageTier keys
    std::size_t queued_bytes = 0;  // publish() values not yet sent
    RemoteStats stats;
    bool stopping = false;
    std::thread worker;
    // Byte budget: what this tier stored and has not expired or deleted (all pages share one TTL,
    // so they expire in write order; a rewrite or erase bumps the generation).
    struct Stored {
      std::uint64_t generation = 0;
    };
    std::unordered_map<std::string, Stored> stored;
    std::deque<std::tuple<Clock::time_point, std::string, std::uint64_t>> expiry;
    std::uint64_t budget_used = 0, generation = 0;
    // The I/O thread's own.
    redisContext* ctx = nullptr;
    Clock::time_point down_until{};

    ~State() { stop(); }

    std::size_t value_bytes() const { return RemoteValue::kHeaderBytes + page_bytes; }
    void check_open() const { KVD_EXPECT(page_bytes > 0, "RedisTier: used before open()"); }

    std::string key_of(const PrefixDigest* prefix, const PageKey& k) const {
      const std::string who = prefix ? prefix->hex() : fmt::format("{}.seq{}", instance, k.sequence);
      return fmt::format("{}:{}:{}:{}:{}:{}", p.key_prefix, p.model.hex(), who, k.layer, k.head, k.page);
    }

    void push(std::shared_ptr<Job> job) {  // under mu
      const bool later = job->kind == Job::Kind::publish || job->kind == Job::Kind::barrier;
      (later ? background : queue).push_back(std::move(job));
      work_cv.notify_one();
    }

    void stop() {
      {
        std::lock_guard lock(mu);
        stopping = true;
        work_cv.notify_all();
      }
      if (worker.joinable()) worker.join();
      if (ctx) redisFree(ctx);
      ctx = nullptr;
    }

    // ---- the I/O thread --------------------------------------------------------------------------

    void run() {
      // hiredis writes with write(2): a server that went away must give EPIPE, not kill the process.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      for (;;) {
        std::shared_ptr<Job> job;
        {
          std::unique_lock lock(mu);
          work_cv.wait(lock, [&] { return stopping || !queue.empty() || !background.empty(); });
          if (queue.empty() && background.empty()) return;  // stopping, and every queued job is done
          auto& from = queue.empty() ? background : queue;
          job = std::move(from.front());
          from.pop_front();
        }
        try {
          execute(*job);
        } catch (...) {  // out of memory: the job fails like a lost connection
          try {
            drop_connection("out of memory", *job);
          } catch (...) {
          }
          std::fill(job->outcomes.begin(), job->outcomes.end(), RemoteRead::error);
        }
        std::lock_guard lock(mu);
        if (job->kind == Job::Kind::publish) queued_bytes -= job->keys.size() * value_bytes();
        job->done = true;
        done_cv.notify_all();
      }
    }

    void drop_connection(std::string why, Job& job) {
      if (ctx) redisFree(ctx);
      ctx = nullptr;
      job.why = std::move(why);
      // Swallow the SIGPIPE a write to a closed socket left pending on this thread.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) > 0) {
      }
    }

    bool connect(Job& job) {
      if (ctx) return true;
      const auto now = Clock::now();
      if (now < down_until) {
        job.why = "server marked down after a failed connection";
        return false;
      }
      const timeval tv{p.timeout_ms / 1000, (p.timeout_ms % 1000) * 1000};
      ctx = url.is_unix() ? redisConnectUnixWithTimeout(url.socket_path.c_str(), tv) : redisConnectWithTimeout(url.host.c_str(), url.port, tv);
      const auto failed = [&](std::string why) {
        drop_connection(fmt::format("connecting to {}: {}", url.describe(), why), job);
        down_until = Clock::now() + std::chrono::milliseconds(p.retry_after_ms);
        return false;
      };
      if (ctx == nullptr) return failed("out of memory");
      if (ctx->err) return failed(ctx->errstr);
      if (redisSetTimeout(ctx, tv) != REDIS_OK) return failed("cannot set the timeout");
      std::vector<std::string> hello;
      if (!url.password.empty()) {
        if (url.user.empty())
          hello = {"AUTH", url.password};
        else
          hello = {"AUTH", url.user, url.password};
        if (std::string e = simple_command(hello); !e.empty()) return failed("AUTH: " + e);
      }
      if (url.db != 0)
        if (std::string e = simple_command({"SELECT", std::to_string(url.db)}); !e.empty()) return failed("SELECT: " + e);
      std::lock_guard lock(mu);
      stats.connects += 1;
      return true;
    }

    /// Runs one command on the fresh connection; returns "" or what went wrong.
    std::string simple_command(const std::vector<std::string>& args) {
      std::vector<const char*> argv;
      std::vector<std::size_t> len;
      for (const std::string& a : args) add(argv, len, a);
      auto* r = static_cast<redisReply*>(redisCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), len.data()));
      if (r == nullptr) return ctx->errstr;
      std::string e = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "";
      freeReplyObject(r);
      return e;
    }

    /// Sends n commands, keeping at most max_in_flight of them unanswered (a sliding window, so
    /// the server never waits for the next batch), and hands each reply to on_reply(i, reply);
    /// after a failure the remaining ones get on_reply(i, nullptr). A connection the server
    /// closed before giving this job any reply (it restarted since the connection was made) is
    /// replaced once; any other failure marks the server down for retry_after_ms.
    template <class Args, class OnReply>
    void pipeline(Job& job, std::size_t n, Args&& args_of, OnReply&& on_reply) {
      std::vector<const char*> argv;
      std::vector<std::size_t> len;
      std::size_t done = 0;  // replies handed to on_reply
      bool retried = false;
      while (done < n) {
        const bool reused = ctx != nullptr;
        if (!connect(job)) break;
        std::size_t sent = done;
        bool ok = true;
        while (ok && done < n) {
          // hiredis buffers appended commands and sends them when a reply must be read.
          for (; ok && sent < n && sent - done < p.max_in_flight; ++sent) {
            argv.clear();
            len.clear();
            args_of(sent, argv, len);
            ok = redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), len.data()) == REDIS_OK;
          }
          void* reply = nullptr;
          if (!ok || redisGetReply(ctx, &reply) != REDIS_OK || reply == nullptr) {
            ok = false;
            break;
          }
          on_reply(done++, static_cast<redisReply*>(reply));
          freeReplyObject(reply);
          if (!job.replied) job.why.clear();  // a failure before a retry is no longer the story
          job.replied = true;
        }
        if (ok) break;
        const int io_errno = errno;
        // Closed by the server (a restart while the tier was idle), not a timeout.
        const bool closed = ctx && (ctx->err == REDIS_ERR_EOF || (ctx->err == REDIS_ERR_IO && (io_errno == ECONNRESET || io_errno == EPIPE)));
        drop_connection(fmt::format("{}: {}", url.describe(), ctx && ctx->err ? ctx->errstr : "command failed"), job);
        if (closed && reused && !retried && !job.replied) {
          retried = true;  // a stale connection: try again on a new one
          continue;
        }
        down_until = Clock::now() + std::chrono::milliseconds(p.retry_after_ms);
        break;
      }
      for (; done < n; ++done) on_reply(done, nullptr);
    }

    static void add(std::vector<const char*>& argv, std::vector<std::size_t>& len, std::string_view s) {
      argv.push_back(s.data());
      len.push_back(s.size());
    }

    void execute(Job& job) {
      switch (job.kind) {
        case Job::Kind::read: return read(job);
        case Job::Kind::write:
        case Job::Kind::publish: return write(job);
        case Job::Kind::erase: return erase(job);
        case Job::Kind::exists: return exists(job);
        case Job::Kind::lookup: return lookup(job);
        case Job::Kind::barrier: return;
      }
    }

    void read(Job& job) {
      RemoteStats delta;
      pipeline(
          job, job.keys.size(), [&](std::size_t i, auto& argv, auto& len) { add(argv, len, "GET"), add(argv, len, job.keys[i]); },
          [&](std::size_t i, redisReply* r) {
            RemoteRead& out = job.outcomes[i];
            if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
              out = RemoteRead::error;
              delta.errors += 1;
            } else if (r->type == REDIS_REPLY_NIL) {
              out = RemoteRead::missing;
              delta.missing += 1;
            } else if (r->type == REDIS_REPLY_STRING &&
                       RemoteValue::decode(job.keys[i], reinterpret_cast<const std::byte*>(r->str), r->len, job.dst[i], page_bytes)) {
              out = RemoteRead::hit;
              delta.hits += 1;
              delta.bytes_read += page_bytes;
            } else {
              out = RemoteRead::corrupt;
              delta.corrupt += 1;
            }
          });
      std::lock_guard lock(mu);
      stats.hits += delta.hits, stats.missing += delta.missing, stats.corrupt += delta.corrupt, stats.errors += delta.errors;
      stats.bytes_read += delta.bytes_read;
    }

    /// Budget accounting (under mu). Forgets what has expired.
    void forget_expired(Clock::time_point now) {
      while (!expiry.empty() && std::get<0>(expiry.front()) <= now) {
        const auto& [when, k, gen] = expiry.front();
        if (auto it = stored.find(k); it != stored.end() && it->second.generation == gen) {
          stored.erase(it);
          budget_used -= value_bytes();
        }
        expiry.pop_front();
      }
    }
    enum class Take { refused, fresh, rewrite };
    /// Takes room for a value (a key it already holds takes none).
    Take take_budget(const std::string& key, Clock::time_point now) {
      if (p.byte_budget == 0) return Take::rewrite;
      forget_expired(now);
      if (stored.contains(key)) return Take::rewrite;
      if (budget_used + value_bytes() > p.byte_budget) return Take::refused;
      budget_used += value_bytes();
      stored[key] = Stored{++generation};
      return Take::fresh;
    }
    /// A value the server took: it expires ttl_ms from now (the reply came after the SET arrived).
    void stored_at(const std::string& key, Clock::time_point now) {
      if (p.byte_budget == 0 || p.ttl_ms == 0) return;
      auto it = stored.find(key);
      if (it == stored.end()) it = stored.emplace(key, Stored{}).first;  // rewritten after its expiry was forgotten
      it->second.generation = ++generation;
      expiry.emplace_back(now + std::chrono::milliseconds(p.ttl_ms), key, generation);
    }
    void give_back_budget(const std::string& key) {  // under mu
      if (p.byte_budget == 0) return;
      if (stored.erase(key)) budget_used -= value_bytes();
    }

    void write(Job& job) {
      const std::size_t vb = value_bytes();
      std::vector<std::size_t> send;  // the values the budget admits
      std::vector<Take> taken(job.keys.size());
      {
        std::lock_guard lock(mu);
        const auto now = Clock::now();
        for (std::size_t i = 0; i < job.keys.size(); ++i) {
          taken[i] = take_budget(job.keys[i], now);
          if (taken[i] != Take::refused)
            send.push_back(i);
          else
            stats.over_budget += 1;
        }
      }
      const std::string ttl = std::to_string(p.ttl_ms);
      std::vector<std::size_t> failed, ok;
      try {
        pipeline(
            job, send.size(),
            [&](std::size_t j, auto& argv, auto& len) {
              const std::size_t i = send[j];
              add(argv, len, "SET"), add(argv, len, job.keys[i]);
              add(argv, len, std::string_view(reinterpret_cast<const char*>(job.values.data() + i * vb), vb));
              if (p.ttl_ms > 0) add(argv, len, "PX"), add(argv, len, ttl);
            },
            [&](std::size_t j, redisReply* r) {
              if (r != nullptr && r->type == REDIS_REPLY_STATUS)
                ok.push_back(send[j]);
              else
                failed.push_back(send[j]);
              if (r != nullptr && r->type == REDIS_REPLY_ERROR) job.why = std::string(r->str, r->len);
            });
      } catch (...) {  // out of memory: what was not answered counts as not stored
        for (std::size_t j = ok.size() + failed.size(); j < send.size(); ++j) failed.push_back(send[j]);
      }
      std::lock_guard lock(mu);
      const auto now = Clock::now();
      for (std::size_t i : ok) stored_at(job.keys[i], now);
      for (std::size_t i : failed)
        if (taken[i] == Take::fresh) give_back_budget(job.keys[i]);  // a failed rewrite leaves the old value there
      job.stored = ok.size();
      stats.written += ok.size();
      stats.bytes_written += ok.size() * page_bytes;
      stats.write_errors += failed.size();
    }

    void erase(Job& job) {
      bool deleted = false;
      pipeline(
          job, 1, [&](std::size_t, auto& argv, auto& len) { add(argv, len, "DEL"), add(argv, len, job.keys[0]); },
          [&](std::size_t, redisReply* r) { deleted = r != nullptr && r->type == REDIS_REPLY_INTEGER; });
      std::lock_guard lock(mu);
      if (deleted) give_back_budget(job.keys[0]);
    }

    void exists(Job& job) {
      pipeline(
          job, 1, [&](std::size_t, auto& argv, auto& len) { add(argv, len, "EXISTS"), add(argv, len, job.keys[0]); },
          [&](std::size_t, redisReply* r) { job.found = r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer == 1; });
    }

    /// One EXISTS per page over every (layer, head) key of it, max_in_flight pages at a time;
    /// the run ends at the first page with a key missing.
    void lookup(Job& job) {
      const auto& q = job.lookup;
      const std::size_t per_page = static_cast<std::size_t>(q.layers) * q.heads;
      std::vector<std::string> keys(per_page);  // hiredis copies a command when it is appended
      bool run = true, failed = false;
      for (std::uint32_t first = 0; run && first < q.max_pages; first += static_cast<std::uint32_t>(p.max_in_flight)) {
        const std::size_t n = std::min<std::size_t>(p.max_in_flight, q.max_pages - first);
        pipeline(
            job, n,
            [&](std::size_t i, auto& argv, auto& len) {
              add(argv, len, "EXISTS");
              for (std::uint32_t l = 0; l < q.layers; ++l)
                for (std::uint32_t h = 0; h < q.heads; ++h) {
                  std::string& k = keys[static_cast<std::size_t>(l) * q.heads + h];
                  k = key_of(&q.prefix, PageKey{0, l, h, static_cast<std::uint32_t>(first + i)});
                  add(argv, len, k);
                }
            },
            [&](std::size_t, redisReply* r) {
              failed = failed || r == nullptr || r->type != REDIS_REPLY_INTEGER;
              run = run && r != nullptr && r->type == REDIS_REPLY_INTEGER && static_cast<std::size_t>(r->integer) == per_page;
              if (run) job.found += 1;
            });
      }
      std::lock_guard lock(mu);
      stats.lookups += 1;
      stats.lookup_errors += failed;
    }
  };

  ReadTicket submit_reads(const PrefixDigest* prefix, std::span<const ReadRequest> reads) {
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::read;
    s_->check_open();
    job->keys.reserve(reads.size());
    job->dst.reserve(reads.size());
    for (const ReadRequest& r : reads) {
      job->keys.push_back(s_->key_of(prefix, r.key));
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

  std::unique_ptr<State> s_;
};

static_assert(StorageTier<RedisTier>);
static_assert(RemoteTier<RedisTier>);

}  // namespace kvdrive::tier
