// bench_tier's remote report: RedisTier's page reads and writes over loopback against
// redis-benchmark's GET and SET at the same value size, pipeline depth and one connection, in the
// same run, plain and with a deployment secret. It starts a private redis-server (or uses --redis
// URL) and is skipped where Redis is not installed or bench_tier was built without hiredis.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tier_common.hpp"
#ifdef KVD_BENCH_REDIS
#include "kvdrive/tier/redis.hpp"
#include "redis_server.hpp"
#endif

namespace kvdrive::bench_tier {

#ifdef KVD_BENCH_REDIS
/// Writes every key's page (one of data's 256 pages of 4 KiB) in batches of `batch`; returns the
/// seconds it took.
inline double write_all(RedisTier& t, const std::vector<PageKey>& keys, const std::vector<std::byte>& data, std::size_t batch) {
  constexpr std::size_t kPage = 4096;
  std::vector<WriteRequest> w;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    w.push_back({keys[i], data.data() + (i % 256) * kPage});
    if (w.size() == batch || i + 1 == keys.size()) {
      t.write_batch(w);
      w.clear();
    }
  }
  return seconds_since(t0);
}

/// One pass of reads: random batches of `batch` of the keys, as a step's misses, as many pages as
/// there are keys; adds the pages read and the seconds taken to `pages` and `secs`.
inline void read_pass(RedisTier& t, std::uint64_t seed, const std::vector<PageKey>& keys, const AlignedPages& dst, std::size_t batch,
                      std::size_t& pages, double& secs) {
  std::mt19937_64 r(seed);
  std::vector<ReadRequest> req;
  std::vector<RemoteRead> outcome;
  for (std::size_t at = 0; at < keys.size(); at += batch) {
    req.clear();
    for (std::size_t j = 0; j < std::min(batch, keys.size() - at); ++j) req.push_back({keys[r() % keys.size()], dst[j]});
    outcome.resize(req.size());
    const auto t1 = std::chrono::steady_clock::now();
    t.wait_each(t.submit(req), outcome);
    secs += seconds_since(t1);
    for (RemoteRead x : outcome) KVD_EXPECT(x == RemoteRead::hit, "bench_tier: remote read missed: {}", RedisTier::describe(x));
    pages += req.size();
  }
}

/// redis-benchmark's requests per second (0: not run, where it is not installed or the server is
/// on a Unix socket).
struct RedisBenchmark {
  double get = 0, set = 0;
};

/// redis-benchmark: SET fills key:N with values of the same size, then GET reads them.
inline RedisBenchmark redis_benchmark(const RedisUrl& where, std::size_t remote_pages, std::size_t value, std::size_t in_flight) {
  RedisBenchmark out;
  const auto rb = kvdrive::testing::find_redis_program("redis-benchmark");
  if (!rb || where.is_unix()) return out;
  const std::string cmd = fmt::format("{} -h {} -p {} -n {} -r {} -d {} -P {} -c 1 -t set,get --csv{} 2>/dev/null", *rb, where.host, where.port,
                                      remote_pages * 2, remote_pages, value, in_flight, where.db ? fmt::format(" --dbnum {}", where.db) : "");
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, p)) {
      double rps = 0;
      if (std::sscanf(line, "\"GET\",\"%lf\"", &rps) == 1) out.get = rps;
      if (std::sscanf(line, "\"SET\",\"%lf\"", &rps) == 1) out.set = rps;
    }
    ::pclose(p);
  }
  return out;
}

/// The remote report's figures: pages per second of each reader and writer.
struct RemoteFigures {
  double reads_per_s = 0, writes_per_s = 0, keyed_reads_per_s = 0, keyed_writes_per_s = 0;
  RedisBenchmark bench;
};

/// The remote report's table and its JSON (result["remote"]).
inline void print_remote(const Options& o, const RedisUrl& where, std::size_t in_flight, const RemoteFigures& f, const RemoteStats& st,
                         nlohmann::json& result) {
  constexpr std::size_t kPage = 4096;
  const std::size_t value = kPage + RemoteValue::kHeaderBytes;
  const double bench_get = f.bench.get, bench_set = f.bench.set;
  std::printf("remote tier: RedisTier on %s, %zu pages of 4 KiB (values of %zu bytes), batches of %zu, %zu commands in flight, 1 connection\n",
              where.describe().c_str(), o.remote_pages, value, o.batch, in_flight);
  std::printf("%-22s %12s %10s %16s\n", "reader", "pages/s", "MB/s", "vs redis-benchmark");
  if (bench_get > 0) std::printf("%-22s %12.0f %10.1f %16s\n", "redis-benchmark GET", bench_get, bench_get * kPage / 1e6, "1");
  std::printf("%-22s %12.0f %10.1f %16s\n", "RedisTier read", f.reads_per_s, f.reads_per_s * kPage / 1e6,
              bench_get > 0 ? fmt::format("{:.3f}", f.reads_per_s / bench_get).c_str() : "(no redis-benchmark)");
  if (bench_set > 0) std::printf("%-22s %12.0f %10.1f %16s\n", "redis-benchmark SET", bench_set, bench_set * kPage / 1e6, "1");
  std::printf("%-22s %12.0f %10.1f %16s\n", "RedisTier write", f.writes_per_s, f.writes_per_s * kPage / 1e6,
              bench_set > 0 ? fmt::format("{:.3f}", f.writes_per_s / bench_set).c_str() : "");
  std::printf("%-22s %12.0f %10.1f %16s  (%.3f of RedisTier read; values keyed with an HMAC-SHA-256, 4136 bytes)\n", "RedisTier read, keyed",
              f.keyed_reads_per_s, f.keyed_reads_per_s * kPage / 1e6,
              bench_get > 0 ? fmt::format("{:.3f}", f.keyed_reads_per_s / bench_get).c_str() : "", f.keyed_reads_per_s / f.reads_per_s);
  std::printf("%-22s %12.0f %10.1f %16s  (%.3f of RedisTier write)\n", "RedisTier write, keyed", f.keyed_writes_per_s,
              f.keyed_writes_per_s * kPage / 1e6, bench_set > 0 ? fmt::format("{:.3f}", f.keyed_writes_per_s / bench_set).c_str() : "",
              f.keyed_writes_per_s / f.writes_per_s);
  std::printf("remote reads: %llu hits, %llu misses\n", static_cast<unsigned long long>(st.hits), static_cast<unsigned long long>(st.misses()));
  result["remote"] = {{"url", where.describe()},
                      {"pages", o.remote_pages},
                      {"value_bytes", value},
                      {"batch", o.batch},
                      {"in_flight", in_flight},
                      {"read_pages_per_s", f.reads_per_s},
                      {"write_pages_per_s", f.writes_per_s},
                      {"redis_benchmark_get_per_s", bench_get},
                      {"redis_benchmark_set_per_s", bench_set},
                      {"keyed_read_pages_per_s", f.keyed_reads_per_s},
                      {"keyed_write_pages_per_s", f.keyed_writes_per_s}};
}

/// RedisTier's page reads over loopback against redis-benchmark's GET of values of the same size
/// (page + RemoteValue header) with the same pipeline depth (max_in_flight) and one connection:
/// what the server and the loopback give a plain client, so the ratio is RedisTier's own cost
/// (key building, checksums, copies, its I/O thread). Both run in turns on the same server.
inline void remote_report(const Options& o, nlohmann::json& result) {
  using kvdrive::testing::RedisServer;
  constexpr std::size_t kPage = 4096;
  std::unique_ptr<RedisServer> server;
  std::string url = o.redis;
  if (url.empty()) {
    if (!kvdrive::testing::redis_server_binary()) {
      std::printf("remote tier: skipped (redis-server is not installed; scripts/bootstrap installs it)\n");
      return;
    }
    server = std::make_unique<RedisServer>();
    url = server->url();
  }
  const RedisUrl where = RedisUrl::parse(url);
  RedisTier::Params params;
  params.url = url;
  params.key_prefix = "kvd-bench";
  RedisTier tier(params);
  tier.open({kPage});
  // The same pages through a tier with a deployment secret (an HMAC-SHA-256 per value).
  RedisTier::Params keyed_params = params;
  keyed_params.key_prefix = "kvd-bench-keyed";
  keyed_params.secret = "bench_tier: a 32-byte secret ...";
  RedisTier keyed(keyed_params);
  keyed.open({kPage});
  // The store: remote_pages random pages, written in batches of `batch`.
  std::vector<std::byte> data(kPage * 256);
  std::mt19937_64 rng(3);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  std::vector<PageKey> keys;
  for (std::size_t i = 0; i < o.remote_pages; ++i) keys.push_back({1, static_cast<std::uint32_t>(i % 8), 0, static_cast<std::uint32_t>(i / 8)});
  const double t_write = write_all(tier, keys, data, o.batch), t_write_keyed = write_all(keyed, keys, data, o.batch);
  // Reads: random batches of `batch` pages, as a step's misses; two passes of each tier around
  // redis-benchmark.
  const AlignedPages dst(o.batch);
  std::size_t pages_read = 0, pages_read_keyed = 0;
  double t_read = 0, t_read_keyed = 0;
  read_pass(tier, 11, keys, dst, o.batch, pages_read, t_read);
  read_pass(keyed, 11, keys, dst, o.batch, pages_read_keyed, t_read_keyed);
  RemoteFigures f;
  f.bench = redis_benchmark(where, o.remote_pages, kPage + RemoteValue::kHeaderBytes, params.max_in_flight);
  read_pass(keyed, 12, keys, dst, o.batch, pages_read_keyed, t_read_keyed);
  read_pass(tier, 12, keys, dst, o.batch, pages_read, t_read);
  f.reads_per_s = static_cast<double>(pages_read) / t_read, f.writes_per_s = static_cast<double>(o.remote_pages) / t_write;
  f.keyed_reads_per_s = static_cast<double>(pages_read_keyed) / t_read_keyed;
  f.keyed_writes_per_s = static_cast<double>(o.remote_pages) / t_write_keyed;
  print_remote(o, where, params.max_in_flight, f, tier.remote_stats(), result);
}
#else
inline void remote_report(const Options&, nlohmann::json&) { std::printf("remote tier: skipped (built without hiredis)\n"); }
#endif

}  // namespace kvdrive::bench_tier
