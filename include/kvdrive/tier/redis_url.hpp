// RedisUrl: where a remote tier's server is, parsed from a URL:
//   redis://[[user]:password@]host[:port][/db]      TCP (IPv6 hosts in brackets: [::1])
//   unix:///path/to/redis.sock[?db=N]               a Unix socket
// User and password may be percent-encoded (%40 for '@'). Port defaults to 6379, db to 0.
// TLS (rediss://) is not supported. Plain parsing, no server contact: bad URLs throw
// kvdrive::Error naming the part that is wrong.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::tier {

struct RedisUrl {
  std::string host;  ///< TCP host (empty for a Unix socket)
  int port = 6379;
  std::string socket_path;  ///< Unix socket path (empty for TCP)
  std::string user;         ///< empty: the default user
  std::string password;     ///< empty: no AUTH
  int db = 0;

  bool is_unix() const { return !socket_path.empty(); }

  /// The URL again, with the password masked (for logs and error messages).
  std::string describe() const {
    const std::string auth = password.empty() ? (user.empty() ? "" : user + ":@") : user + ":***@";
    if (is_unix()) return fmt::format("unix://{}{}", socket_path, db ? fmt::format("?db={}", db) : "");
    const bool v6 = host.find(':') != std::string::npos;
    return fmt::format("redis://{}{}{}{}:{}/{}", auth, v6 ? "[" : "", host, v6 ? "]" : "", port, db);
  }

  static RedisUrl parse(std::string_view full) {
    RedisUrl r;
    // Error messages show the URL with any user:password part masked.
    std::string shown(full);
    if (const auto at = shown.rfind('@'), scheme = shown.find("://");
        shown.starts_with("redis") && at != std::string::npos && scheme != std::string::npos && at > scheme)
      shown.replace(scheme + 3, at - scheme - 3, "***");
    const std::string_view url = shown;
    const std::string_view real = full;
    constexpr std::string_view tcp = "redis://", unix_scheme = "unix://";
    if (real.starts_with(unix_scheme)) return parse_unix(real.substr(unix_scheme.size()), url);
    KVD_EXPECT(!real.starts_with("rediss://"), "redis URL '{}': TLS (rediss://) is not supported", url);
    KVD_EXPECT(real.starts_with(tcp), "redis URL '{}': expected redis://[[user]:password@]host[:port][/db] or unix:///path", url);
    std::string_view rest = real.substr(tcp.size());
    if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
      const std::string_view auth = rest.substr(0, at);
      rest = rest.substr(at + 1);
      const auto colon = auth.find(':');
      if (colon == std::string_view::npos) {
        r.password = decode(auth, url);  // redis://password@host, as redis-cli -u reads it
      } else {
        r.user = decode(auth.substr(0, colon), url);
        r.password = decode(auth.substr(colon + 1), url);
      }
    }
    std::string_view hostport = rest;
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
      hostport = rest.substr(0, slash);
      const std::string_view db = rest.substr(slash + 1);
      if (!db.empty()) r.db = parse_number(db, "db", url, 0, 1 << 20);
    }
    parse_host_port(hostport, url, r);
    return r;
  }

 private:
  /// unix:// URLs, after the scheme: /path[?db=N].
  static RedisUrl parse_unix(std::string_view rest, std::string_view url) {
    RedisUrl r;
    if (const auto q = rest.find('?'); q != std::string_view::npos) {
      const std::string_view query = rest.substr(q + 1);
      rest = rest.substr(0, q);
      KVD_EXPECT(query.starts_with("db="), "redis URL '{}': the only query a unix:// URL takes is ?db=N", url);
      r.db = parse_number(query.substr(3), "db", url, 0, 1 << 20);
    }
    KVD_EXPECT(rest.starts_with('/'), "redis URL '{}': a unix:// URL needs an absolute socket path (unix:///path)", url);
    r.socket_path = std::string(rest);
    return r;
  }

  /// host[:port], or [v6 host][:port].
  static void parse_host_port(std::string_view hostport, std::string_view url, RedisUrl& r) {
    std::string_view port;
    if (hostport.starts_with('[')) {
      const auto close = hostport.find(']');
      KVD_EXPECT(close != std::string_view::npos, "redis URL '{}': unclosed '[' in the host", url);
      r.host = std::string(hostport.substr(1, close - 1));
      const std::string_view after = hostport.substr(close + 1);
      KVD_EXPECT(after.empty() || after.starts_with(':'), "redis URL '{}': unexpected '{}' after the host", url, after);
      if (!after.empty()) port = after.substr(1);
    } else {
      const auto colon = hostport.find(':');
      r.host = std::string(hostport.substr(0, colon));
      if (colon != std::string_view::npos) port = hostport.substr(colon + 1);
    }
    KVD_EXPECT(!r.host.empty(), "redis URL '{}': no host", url);
    if (!port.empty() || hostport.ends_with(':')) r.port = parse_number(port, "port", url, 1, 65535);
  }

  static int parse_number(std::string_view s, const char* what, std::string_view url, int lo, int hi) {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    KVD_EXPECT(ec == std::errc{} && end == s.data() + s.size() && !s.empty() && v >= lo && v <= hi,
               "redis URL '{}': {} '{}' is not a number in {}..{}", url, what, s, lo, hi);
    return v;
  }

  static std::string decode(std::string_view s, std::string_view url) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '%') {
        out += s[i];
        continue;
      }
      const auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      };
      const int hi = i + 2 < s.size() ? hex(s[i + 1]) : -1, lo = i + 2 < s.size() ? hex(s[i + 2]) : -1;
      KVD_EXPECT(hi >= 0 && lo >= 0, "redis URL '{}': bad percent-escape in the user or password", url);
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    }
    return out;
  }
};

}  // namespace kvdrive::tier
