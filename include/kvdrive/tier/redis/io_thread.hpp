// redis::IoThread: RedisTier's I/O thread. It owns the connection and runs the queued jobs, one
// at a time, callers' first, each as pipelined Redis commands: reads as GET (checked with
// RemoteValue), writes and publishes as SET (PX ttl_ms) within the byte budget, erase as DEL,
// exists and prefix lookups as EXISTS. It counts every outcome in the tier's statistics; a
// failure is never an exception here, only a miss or an error outcome.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kvdrive/tier/redis/budget.hpp"
#include "kvdrive/tier/redis/connection.hpp"
#include "kvdrive/tier/redis/job.hpp"
#include "kvdrive/tier/redis/state.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier::redis {

class IoThread {
 public:
  explicit IoThread(State& s)
      : s_(s), conn_(s.url, s.p.timeout_ms, s.p.retry_after_ms, s.p.max_in_flight, [&s] {
          std::lock_guard lock(s.mu);
          s.stats.connects += 1;
        }) {}

  /// Runs jobs until the tier stops and every queued job is done.
  void run() {
    // hiredis writes with write(2): a server that went away must give EPIPE, not kill the process.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    while (std::shared_ptr<Job> job = s_.next()) {
      try {
        execute(*job);
      } catch (...) {  // out of memory: the job fails like a lost connection
        try {
          conn_.drop("out of memory", *job);
        } catch (...) {
        }
        std::fill(job->outcomes.begin(), job->outcomes.end(), RemoteRead::error);
      }
      s_.finish(*job);
    }
  }

 private:
  using Take = ByteBudget::Take;

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
    const std::size_t page_bytes = s_.page_bytes;
    conn_.pipeline(
        job, job.keys.size(), [&](std::size_t i, Command& c) { c.add("GET"), c.add(job.keys[i]); },
        [&](std::size_t i, redisReply* r) {
          RemoteRead& out = job.outcomes[i];
          if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
            out = RemoteRead::error;
            delta.errors += 1;
          } else if (r->type == REDIS_REPLY_NIL) {
            out = RemoteRead::missing;
            delta.missing += 1;
          } else if (r->type == REDIS_REPLY_STRING && s_.decode(job.keys[i], reinterpret_cast<const std::byte*>(r->str), r->len, job.dst[i])) {
            out = RemoteRead::hit;
            delta.hits += 1;
            delta.bytes_read += page_bytes;
          } else {
            out = RemoteRead::corrupt;
            delta.corrupt += 1;
          }
        });
    std::lock_guard lock(s_.mu);
    s_.stats.hits += delta.hits, s_.stats.missing += delta.missing, s_.stats.corrupt += delta.corrupt, s_.stats.errors += delta.errors;
    s_.stats.bytes_read += delta.bytes_read;
  }

  /// The values the budget admits (their indices), and what each took.
  std::vector<std::size_t> admit(const Job& job, std::vector<Take>& taken) {
    std::vector<std::size_t> send;
    std::lock_guard lock(s_.mu);
    const auto now = Clock::now();
    for (std::size_t i = 0; i < job.keys.size(); ++i) {
      taken[i] = s_.budget.take(job.keys[i], now);
      if (taken[i] != Take::refused) send.push_back(i);
      else s_.stats.over_budget += 1;
    }
    return send;
  }

  void write(Job& job) {
    const std::size_t vb = s_.value_bytes();
    std::vector<Take> taken(job.keys.size());
    const std::vector<std::size_t> send = admit(job, taken);
    const std::string ttl = std::to_string(s_.p.ttl_ms);
    std::vector<std::size_t> failed, ok;
    try {
      conn_.pipeline(
          job, send.size(),
          [&](std::size_t j, Command& c) {
            const std::size_t i = send[j];
            c.add("SET"), c.add(job.keys[i]);
            c.add(std::string_view(reinterpret_cast<const char*>(job.values.data() + i * vb), vb));
            if (s_.p.ttl_ms > 0) c.add("PX"), c.add(ttl);
          },
          [&](std::size_t j, redisReply* r) {
            if (r != nullptr && r->type == REDIS_REPLY_STATUS) ok.push_back(send[j]);
            else failed.push_back(send[j]);
            if (r != nullptr && r->type == REDIS_REPLY_ERROR) job.why = std::string(r->str, r->len);
          });
    } catch (...) {  // out of memory: what was not answered counts as not stored
      for (std::size_t j = ok.size() + failed.size(); j < send.size(); ++j) failed.push_back(send[j]);
    }
    std::lock_guard lock(s_.mu);
    const auto now = Clock::now();
    for (std::size_t i : ok) s_.budget.stored_at(job.keys[i], now);
    for (std::size_t i : failed)
      if (taken[i] == Take::fresh) s_.budget.give_back(job.keys[i]);  // a failed rewrite leaves the old value there
    job.stored = ok.size();
    s_.stats.written += ok.size();
    s_.stats.bytes_written += ok.size() * s_.page_bytes;
    s_.stats.write_errors += failed.size();
  }

  void erase(Job& job) {
    bool deleted = false;
    conn_.pipeline(
        job, 1, [&](std::size_t, Command& c) { c.add("DEL"), c.add(job.keys[0]); },
        [&](std::size_t, redisReply* r) { deleted = r != nullptr && r->type == REDIS_REPLY_INTEGER; });
    std::lock_guard lock(s_.mu);
    if (deleted) s_.budget.give_back(job.keys[0]);
  }

  void exists(Job& job) {
    conn_.pipeline(
        job, 1, [&](std::size_t, Command& c) { c.add("EXISTS"), c.add(job.keys[0]); },
        [&](std::size_t, redisReply* r) { job.found = r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer == 1; });
  }

  /// One EXISTS per page over every (layer, head) key of it, max_in_flight pages at a time;
  /// the run ends at the first page with a key missing.
  void lookup(Job& job) {
    const auto& q = job.lookup;
    const std::size_t per_page = static_cast<std::size_t>(q.layers) * q.heads;
    std::vector<std::string> keys(per_page);  // hiredis copies a command when it is appended
    bool run = true, failed = false;
    const auto max_pages = static_cast<std::uint32_t>(q.chain.size());
    for (std::uint32_t first = 0; run && first < max_pages; first += static_cast<std::uint32_t>(s_.p.max_in_flight)) {
      const std::size_t n = std::min<std::size_t>(s_.p.max_in_flight, max_pages - first);
      conn_.pipeline(
          job, n,
          [&](std::size_t i, Command& c) {
            c.add("EXISTS");
            for (std::uint32_t l = 0; l < q.layers; ++l)
              for (std::uint32_t h = 0; h < q.heads; ++h) {
                std::string& k = keys[static_cast<std::size_t>(l) * q.heads + h];
                k = s_.key_of(&q.chain[first + i], PageKey{0, l, h, static_cast<std::uint32_t>(first + i)});
                c.add(k);
              }
          },
          [&](std::size_t, redisReply* r) {
            failed = failed || r == nullptr || r->type != REDIS_REPLY_INTEGER;
            run = run && r != nullptr && r->type == REDIS_REPLY_INTEGER && static_cast<std::size_t>(r->integer) == per_page;
            if (run) job.found += 1;
          });
    }
    std::lock_guard lock(s_.mu);
    s_.stats.lookups += 1;
    s_.stats.lookup_errors += failed;
  }

  State& s_;
  Connection conn_;
};

}  // namespace kvdrive::tier::redis
