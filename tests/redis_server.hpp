// RedisServer: a private redis-server for the tests and bench_tier. It listens on a free
// loopback port and on a Unix socket in a fresh temporary folder, keeps nothing on disk, and
// is killed (and its folder removed) when the object goes. redis_server_binary() finds the
// program, so callers can skip with a message where it is not installed (scripts/bootstrap
// installs it).
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::testing {

/// A program of the Redis package (redis-server, redis-benchmark): the first on PATH, else in
/// /usr/bin, /usr/local/bin or /usr/sbin.
inline std::optional<std::string> find_redis_program(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH"))
    for (std::string_view rest = path; !rest.empty();) {
      const auto colon = rest.find(':');
      dirs.emplace_back(rest.substr(0, colon));
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    }
  dirs.insert(dirs.end(), {"/usr/bin", "/usr/local/bin", "/usr/sbin"});
  for (const std::string& d : dirs)
    if (const std::string p = d + "/" + name; ::access(p.c_str(), X_OK) == 0) return p;
  return std::nullopt;
}

/// The redis-server program: $KVD_REDIS_SERVER, else find_redis_program.
inline std::optional<std::string> redis_server_binary() {
  if (const char* env = std::getenv("KVD_REDIS_SERVER"); env && *env) return std::string(env);
  return find_redis_program("redis-server");
}

/// A port nobody listens on now (the kernel's choice for an ephemeral bind).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  KVD_EXPECT(fd >= 0, "free_loopback_port: socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  KVD_EXPECT(ok, "free_loopback_port: bind() failed");
  return ntohs(a.sin_port);
}

class RedisServer {
 public:
  /// Starts redis-server (throws kvdrive::Error if it is missing or does not answer PING).
  /// extra: more "--option value" arguments.
  explicit RedisServer(std::vector<std::string> extra = {}) {
    const auto bin = redis_server_binary();
    KVD_EXPECT(bin.has_value(), "RedisServer: redis-server not found (scripts/bootstrap installs it)");
    char tmpl[] = "/tmp/kvd-redis-XXXXXX";
    KVD_EXPECT(::mkdtemp(tmpl) != nullptr, "RedisServer: mkdtemp failed");
    dir_ = tmpl;
    for (int attempt = 0; attempt < 3 && pid_ <= 0; ++attempt) {
      port_ = free_loopback_port();
      start(*bin, extra);
      if (!wait_ready()) stop_process();
    }
    if (pid_ <= 0) {
      std::filesystem::remove_all(dir_);
      fail("RedisServer: {} did not start (see its log in a kept run: {}/redis.log)", *bin, dir_);
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer() {
    stop_process();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int port() const { return port_; }
  std::string socket_path() const { return dir_ + "/redis.sock"; }
  std::string url(int db = 0) const { return fmt::format("redis://127.0.0.1:{}/{}", port_, db); }
  std::string unix_url() const { return "unix://" + socket_path(); }
  bool running() const { return pid_ > 0; }

  /// Kills the server at once (SIGKILL), as a crash would.
  void kill() { stop_process(); }
  /// Stops the server without closing its sockets (SIGSTOP), as a hung machine does; resume()
  /// lets it go on.
  void pause() const { ::kill(pid_, SIGSTOP); }
  void resume() const { ::kill(pid_, SIGCONT); }

  /// Runs one command on a fresh connection and returns its reply as text (strings, status,
  /// integers, "(nil)", or "ERR ..."); throws if the server cannot be reached.
  std::string command(const std::vector<std::string>& args) const {
    redisContext* c = redisConnect("127.0.0.1", port_);
    KVD_EXPECT(c != nullptr && !c->err, "RedisServer: cannot connect to port {}", port_);
    std::vector<const char*> argv;
    std::vector<std::size_t> len;
    for (const std::string& a : args) argv.push_back(a.data()), len.push_back(a.size());
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), len.data()));
    std::string out;
    if (r == nullptr) {
      out = std::string("ERR ") + c->errstr;
    } else {
      switch (r->type) {
        case REDIS_REPLY_STRING:
        case REDIS_REPLY_STATUS:
        case REDIS_REPLY_ERROR: out = std::string(r->str, r->len); break;
        case REDIS_REPLY_INTEGER: out = std::to_string(r->integer); break;
        case REDIS_REPLY_NIL: out = "(nil)"; break;
        default: out = fmt::format("({} elements)", r->elements);
      }
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }

 private:
  void start(const std::string& bin, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        bin,  "--port",       std::to_string(port_), "--bind",           "127.0.0.1", "--dir",       dir_, "--save",     "",       "--appendonly",
        "no", "--unixsocket", socket_path(),         "--unixsocketperm", "700",       "--daemonize", "no", "--loglevel", "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir_ + "/redis.log";
    pid_ = ::fork();
    KVD_EXPECT(pid_ >= 0, "RedisServer: fork failed");
    if (pid_ == 0) {  // the child: only async-signal-safe calls until exec
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }

  bool wait_ready() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;  // it exited (port taken?)
        return false;
      }
      redisContext* c = redisConnect("127.0.0.1", port_);
      const bool up = c != nullptr && !c->err;
      bool pong = false;
      if (up) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
        pong = r != nullptr && (r->type == REDIS_REPLY_STATUS ||  // or a server with a password, asking for it
                                (r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("NOAUTH")));
        if (r) freeReplyObject(r);
      }
      if (c) redisFree(c);
      if (pong) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  void stop_process() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }

  std::string dir_;
  int port_ = 0;
  pid_t pid_ = 0;
};

}  // namespace kvdrive::testing
