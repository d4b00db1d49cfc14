// redis::Connection: RedisTier's connection to its server, owned by the I/O thread (hiredis):
// connecting with the timeout (AUTH and SELECT as the URL asks), and pipelining a job's
// commands, max_in_flight unanswered at a time. A connection the server closed before the job
// got any reply (it restarted since) is replaced once; any other failure drops the connection
// and marks the server down for retry_after_ms, during which connecting fails at once.
#pragma once

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/tier/redis/job.hpp"
#include "kvdrive/tier/redis_url.hpp"

namespace kvdrive::tier::redis {

/// One command's arguments, as hiredis takes them (the strings must outlive the call).
struct Command {
  std::vector<const char*> argv;
  std::vector<std::size_t> len;

  void clear() {
    argv.clear();
    len.clear();
  }
  void add(std::string_view s) {
    argv.push_back(s.data());
    len.push_back(s.size());
  }
};

class Connection {
 public:
  /// on_connect: called for each connection made (the tier counts them).
  Connection(const RedisUrl& url, int timeout_ms, int retry_after_ms, std::size_t max_in_flight, std::function<void()> on_connect)
      : url_(url), timeout_ms_(timeout_ms), retry_after_ms_(retry_after_ms), max_in_flight_(max_in_flight), on_connect_(std::move(on_connect)) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
    if (ctx_) redisFree(ctx_);
  }

  /// Forgets the connection; `why` becomes the job's story.
  void drop(std::string why, Job& job) {
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
    job.why = std::move(why);
    // Swallow the SIGPIPE a write to a closed socket left pending on this thread.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe, nullptr, &zero) > 0) {
    }
  }

  /// Sends n commands (args_of(i, command) fills the i-th), keeping at most max_in_flight of
  /// them unanswered (a sliding window, so the server never waits for the next batch), and
  /// hands each reply to on_reply(i, reply); after a failure the remaining ones get
  /// on_reply(i, nullptr).
  template <class Args, class OnReply>
  void pipeline(Job& job, std::size_t n, Args&& args_of, OnReply&& on_reply) {
    Command cmd;
    std::size_t done = 0;  // replies handed to on_reply
    bool retried = false;
    while (done < n) {
      const bool reused = ctx_ != nullptr;
      if (!connect(job)) break;
      if (send(job, n, done, cmd, args_of, on_reply)) break;
      const int io_errno = errno;
      // Closed by the server (a restart while the tier was idle), not a timeout.
      const bool closed = ctx_ && (ctx_->err == REDIS_ERR_EOF || (ctx_->err == REDIS_ERR_IO && (io_errno == ECONNRESET || io_errno == EPIPE)));
      drop(fmt::format("{}: {}", url_.describe(), ctx_ && ctx_->err ? ctx_->errstr : "command failed"), job);
      if (closed && reused && !retried && !job.replied) {
        retried = true;  // a stale connection: try again on a new one
        continue;
      }
      down_until_ = Clock::now() + std::chrono::milliseconds(retry_after_ms_);
      break;
    }
    for (; done < n; ++done) on_reply(done, nullptr);
  }

 private:
  /// The sliding window over one connection; false when it fails (done: replies handed on).
  template <class Args, class OnReply>
  bool send(Job& job, std::size_t n, std::size_t& done, Command& cmd, Args& args_of, OnReply& on_reply) {
    std::size_t sent = done;
    while (done < n) {
      // hiredis buffers appended commands and sends them when a reply must be read.
      for (; sent < n && sent - done < max_in_flight_; ++sent) {
        cmd.clear();
        args_of(sent, cmd);
        if (redisAppendCommandArgv(ctx_, static_cast<int>(cmd.argv.size()), cmd.argv.data(), cmd.len.data()) != REDIS_OK) return false;
      }
      void* reply = nullptr;
      if (redisGetReply(ctx_, &reply) != REDIS_OK || reply == nullptr) return false;
      on_reply(done++, static_cast<redisReply*>(reply));
      freeReplyObject(reply);
      if (!job.replied) job.why.clear();  // a failure before a retry is no longer the story
      job.replied = true;
    }
    return true;
  }

  bool connect(Job& job) {
    if (ctx_) return true;
    const auto now = Clock::now();
    if (now < down_until_) {
      job.why = "server marked down after a failed connection";
      return false;
    }
    const timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
    ctx_ = url_.is_unix() ? redisConnectUnixWithTimeout(url_.socket_path.c_str(), tv) : redisConnectWithTimeout(url_.host.c_str(), url_.port, tv);
    const auto failed = [&](std::string why) {
      drop(fmt::format("connecting to {}: {}", url_.describe(), why), job);
      down_until_ = Clock::now() + std::chrono::milliseconds(retry_after_ms_);
      return false;
    };
    if (ctx_ == nullptr) return failed("out of memory");
    if (ctx_->err) return failed(ctx_->errstr);
    if (redisSetTimeout(ctx_, tv) != REDIS_OK) return failed("cannot set the timeout");
    if (!url_.password.empty()) {
      const std::vector<std::string> auth =
          url_.user.empty() ? std::vector<std::string>{"AUTH", url_.password} : std::vector<std::string>{"AUTH", url_.user, url_.password};
      if (std::string e = simple_command(auth); !e.empty()) return failed("AUTH: " + e);
    }
    if (url_.db != 0)
      if (std::string e = simple_command({"SELECT", std::to_string(url_.db)}); !e.empty()) return failed("SELECT: " + e);
    on_connect_();
    return true;
  }

  /// Runs one command on the fresh connection; returns "" or what went wrong.
  std::string simple_command(const std::vector<std::string>& args) {
    Command cmd;
    for (const std::string& a : args) cmd.add(a);
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(cmd.argv.size()), cmd.argv.data(), cmd.len.data()));
    if (r == nullptr) return ctx_->errstr;
    std::string e = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "";
    freeReplyObject(r);
    return e;
  }

  const RedisUrl& url_;
  int timeout_ms_, retry_after_ms_;
  std::size_t max_in_flight_;
  std::function<void()> on_connect_;
  redisContext* ctx_ = nullptr;
  Clock::time_point down_until_{};
};

}  // namespace kvdrive::tier::redis
