// Storage tiers: SsdTier's sparse page reads against the device's own speed, measured side by
// side in one run. A store of `--pages` 4 KiB pages (one stream after another, as decode seals
// them) is written to `--dir`; then each round reads a random 6.25% of them in batches of
// `--batch` pages (what one decode step's misses look like) three ways, in turns:
//   raw      O_DIRECT io_uring reads of the same slots, one 4 KiB read per page, queue depth
//            `--qd`: the device's random-read speed at this block size (the fio figure)
//   ssd      SsdTier::submit/wait on the same pages: merging, checksums and copies included
//   ssd-reg  the same into buffers registered with io_uring (fixed reads), as KvManager's fast tier
//   ssd-qd1  SsdTier at queue depth 1, for scale
// O_DIRECT keeps the page cache out of it. Prints pages/s and MB/s and the ratio ssd / raw.
// Then a decode workload (each step reads a random 6.25% of every layer) through SsdTier and
// through MmapTier, the FlexGen-style strawman that loads whole layers (cold each step), and
// MmapTier's sequential bandwidth against O_DIRECT 1 MiB reads of the same bytes.
//
// Then the remote tier (RedisTier) over loopback, against redis-benchmark's GET at the same
// value size, pipeline depth and one connection, in the same run (see remote_report); it starts
// a private redis-server (or uses --redis URL) and is skipped where Redis is not installed.
//
// Last, semantic packing against seal order on the misses of a Lookahead W=3 cache (see
// packing_report).
//
//   bench_tier [--dir PATH] [--pages N] [--batch N] [--qd N] [--rounds N]
//              [--pack-layers N] [--pack-context TOKENS] [--pack-steps N] [--json FILE]
//              [--remote-pages N] [--redis URL] [--skip-ssd]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fstream>

#include <nlohmann/json.hpp>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/tier/mmap.hpp"
#ifdef KVD_BENCH_REDIS
#include "kvdrive/tier/redis.hpp"
#include "redis_server.hpp"
#endif

using namespace kvdrive;
using namespace kvdrive::tier;

namespace {

struct Options {
  std::string dir = std::filesystem::temp_directory_path().string();
  std::size_t pages = 65536;
  std::size_t batch = 256;
  unsigned qd = 64;
  int rounds = 3;
  int pack_layers = 2;                // packing report: layers of the synthetic trace
  std::int64_t pack_context = 16384;  // packing report: prompt tokens
  std::int64_t pack_steps = 64;       // packing report: decode steps
  std::string json;                   // also write the figures as JSON here
  std::size_t remote_pages = 32768;   // remote tier: pages stored on the Redis server (128 MiB)
  std::string redis;                  // remote tier: a server to use (default: start a private one)
  bool skip_ssd = false;              // only the remote tier and packing reports
};

/// n pages of 4 KiB, 4096-aligned, as the host pool hands them out (so SsdTier reads into them
/// directly, without its bounce buffer).
class AlignedPages {
 public:
  explicit AlignedPages(std::size_t n) {
    void* m = nullptr;
    KVD_EXPECT(::posix_memalign(&m, 4096, std::max<std::size_t>(1, n) * 4096) == 0, "bench_tier: out of memory");
    mem_.reset(static_cast<std::byte*>(m));
  }
  std::byte* operator[](std::size_t i) const { return mem_.get() + i * 4096; }

 private:
  std::unique_ptr<std::byte, decltype(&std::free)> mem_{nullptr, &std::free};
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#ifdef KVD_BENCH_REDIS
/// RedisTier's page reads over loopback against redis-benchmark's GET of values of the same size
/// (page + RemoteValue header) with the same pipeline depth (max_in_flight) and one connection:
/// what the server and the loopback give a plain client, so the ratio is RedisTier's own cost
/// (key building, checksums, copies, its I/O thread). Both run in turns on the same server.
void remote_report(const Options& o, nlohmann::json& result) {
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
  const auto write_all = [&](RedisTier& t) {
    std::vector<WriteRequest> w;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < o.remote_pages; ++i) {
      w.push_back({keys[i], data.data() + (i % 256) * kPage});
      if (w.size() == o.batch || i + 1 == o.remote_pages) {
        t.write_batch(w);
        w.clear();
      }
    }
    return seconds_since(t0);
  };
  const double t_write = write_all(tier), t_write_keyed = write_all(keyed);
  // Reads: random batches of `batch` pages, as a step's misses; two passes of each tier around
  // redis-benchmark.
  const AlignedPages dst(o.batch);
  std::vector<RemoteRead> outcome;
  std::size_t pages_read = 0, pages_read_keyed = 0;
  double t_read = 0, t_read_keyed = 0;
  const auto read_pass = [&](RedisTier& t, std::uint64_t seed, std::size_t& pages, double& secs) {
    std::mt19937_64 r(seed);
    std::vector<ReadRequest> req;
    for (std::size_t at = 0; at < o.remote_pages; at += o.batch) {
      req.clear();
      for (std::size_t j = 0; j < std::min(o.batch, o.remote_pages - at); ++j) req.push_back({keys[r() % keys.size()], dst[j]});
      outcome.resize(req.size());
      const auto t1 = std::chrono::steady_clock::now();
      t.wait_each(t.submit(req), outcome);
      secs += seconds_since(t1);
      for (RemoteRead x : outcome) KVD_EXPECT(x == RemoteRead::hit, "bench_tier: remote read missed: {}", RedisTier::describe(x));
      pages += req.size();
    }
  };
  read_pass(tier, 11, pages_read, t_read);
  read_pass(keyed, 11, pages_read_keyed, t_read_keyed);
  // redis-benchmark: SET fills key:N with values of the same size, then GET reads them.
  double bench_get = 0, bench_set = 0;
  const std::size_t value = kPage + RemoteValue::kHeaderBytes;
  const auto rb = kvdrive::testing::find_redis_program("redis-benchmark");
  if (rb && !where.is_unix()) {
    const std::string cmd = fmt::format("{} -h {} -p {} -n {} -r {} -d {} -P {} -c 1 -t set,get --csv{} 2>/dev/null", *rb, where.host,
                                        where.port, o.remote_pages * 2, o.remote_pages, value, params.max_in_flight, where.db ? fmt::format(" --dbnum {}", where.db) : "");
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, p)) {
        double rps = 0;
        if (std::sscanf(line, "\"GET\",\"%lf\"", &rps) == 1) bench_get = rps;
        if (std::sscanf(line, "\"SET\",\"%lf\"", &rps) == 1) bench_set = rps;
      }
      ::pclose(p);
    }
  }
  read_pass(keyed, 12, pages_read_keyed, t_read_keyed);
  read_pass(tier, 12, pages_read, t_read);
  const double reads_per_s = static_cast<double>(pages_read) / t_read, writes_per_s = static_cast<double>(o.remote_pages) / t_write;
  const double keyed_reads_per_s = static_cast<double>(pages_read_keyed) / t_read_keyed,
               keyed_writes_per_s = static_cast<double>(o.remote_pages) / t_write_keyed;
  const RemoteStats st = tier.remote_stats();
  std::printf("remote tier: RedisTier on %s, %zu pages of 4 KiB (values of %zu bytes), batches of %zu, %zu commands in flight, 1 connection\n",
              where.describe().c_str(), o.remote_pages, value, o.batch, params.max_in_flight);
  std::printf("%-22s %12s %10s %16s\n", "reader", "pages/s", "MB/s", "vs redis-benchmark");
  if (bench_get > 0)
    std::printf("%-22s %12.0f %10.1f %16s\n", "redis-benchmark GET", bench_get, bench_get * kPage / 1e6, "1");
  std::printf("%-22s %12.0f %10.1f %16s\n", "RedisTier read", reads_per_s, reads_per_s * kPage / 1e6,
              bench_get > 0 ? fmt::format("{:.3f}", reads_per_s / bench_get).c_str() : "(no redis-benchmark)");
  if (bench_set > 0)
    std::printf("%-22s %12.0f %10.1f %16s\n", "redis-benchmark SET", bench_set, bench_set * kPage / 1e6, "1");
  std::printf("%-22s %12.0f %10.1f %16s\n", "RedisTier write", writes_per_s, writes_per_s * kPage / 1e6,
              bench_set > 0 ? fmt::format("{:.3f}", writes_per_s / bench_set).c_str() : "");
  std::printf("%-22s %12.0f %10.1f %16s  (%.3f of RedisTier read; values keyed with an HMAC-SHA-256, 4136 bytes)\n", "RedisTier read, keyed",
              keyed_reads_per_s, keyed_reads_per_s * kPage / 1e6,
              bench_get > 0 ? fmt::format("{:.3f}", keyed_reads_per_s / bench_get).c_str() : "", keyed_reads_per_s / reads_per_s);
  std::printf("%-22s %12.0f %10.1f %16s  (%.3f of RedisTier write)\n", "RedisTier write, keyed", keyed_writes_per_s,
              keyed_writes_per_s * kPage / 1e6, bench_set > 0 ? fmt::format("{:.3f}", keyed_writes_per_s / bench_set).c_str() : "",
              keyed_writes_per_s / writes_per_s);
  std::printf("remote reads: %llu hits, %llu misses\n", static_cast<unsigned long long>(st.hits), static_cast<unsigned long long>(st.misses()));
  result["remote"] = {{"url", where.describe()},       {"pages", o.remote_pages},      {"value_bytes", value},
                      {"batch", o.batch},               {"in_flight", params.max_in_flight},
                      {"read_pages_per_s", reads_per_s}, {"write_pages_per_s", writes_per_s},
                      {"redis_benchmark_get_per_s", bench_get}, {"redis_benchmark_set_per_s", bench_set},
                      {"keyed_read_pages_per_s", keyed_reads_per_s}, {"keyed_write_pages_per_s", keyed_writes_per_s}};
}
#else
void remote_report(const Options&, nlohmann::json&) { std::printf("remote tier: skipped (built without hiredis)\n"); }
#endif

/// Semantic packing against the naive layout (pages in seal order), on the miss stream a
/// Lookahead W=3 cache leaves: two KvManagers over their own SsdTier stores, the same synthetic
/// trace (preset `default`, its first `layers` layers), the Hierarchical index at a 6.25%
/// budget, warm-up after prefill. They decode step by step in turns, so the disk's state is
/// shared; every miss is an O_DIRECT read. Reports I/Os, pages per I/O and fetch throughput.
void packing_report(const Options& o, const index::HierarchicalParams& params, const char* clustering) {
  const eval::SyntheticPreset preset = eval::synthetic_preset("default");
  const int layers = o.pack_layers, kvh = preset.shape.kv_heads, qh = preset.shape.q_heads, d = preset.shape.head_dim;
  const int g = qh / kvh;
  const eval::SyntheticTrace trace(preset, 1, o.pack_context, o.pack_steps);
  Config c;
  c.shape = {layers, qh, kvh, d};
  c.budget = Budget::fraction(0.0625);
  using SsdTiers = Tiers<HostTier, SsdTier>;
  using M = KvManager<index::Hierarchical, eviction::Lookahead, SsdTiers>;
  auto store = [&](const char* name) {
    SsdTier::Params p;
    p.path = (std::filesystem::path(o.dir) / fmt::format("kvd_bench_pack_{}.store", name)).string();
    p.queue_depth = o.qd;
    p.mode = tier::SsdOpen::recreate;
    p.delete_on_close = true;
    return p;
  };
  const SsdTier::Params packed_store = store("packed"), naive_store = store("naive");
  Config naive_config = c;
  naive_config.pack_by_cluster = false;
  M packed(c, index::Hierarchical(params), eviction::Lookahead{3}, SsdTiers(HostTier{}, SsdTier(packed_store)));
  M naive(naive_config, index::Hierarchical(params), eviction::Lookahead{3}, SsdTiers(HostTier{}, SsdTier(naive_store)));
  const SeqId pid = packed.add_sequence(), nid = naive.add_sequence();
  std::vector<eval::StreamTrace> streams;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kvh; ++h) streams.push_back(trace.stream(l, h));
  const std::int64_t n = o.pack_context, obs = streams[0].observed;
  std::vector<float> k, v, q;
  for (int l = 0; l < layers; ++l) {
    k.assign(static_cast<std::size_t>(n) * kvh * d, 0.0f);
    v.assign(k.size(), 0.0f);
    q.assign(static_cast<std::size_t>(obs) * qh * d, 0.0f);
    for (int h = 0; h < kvh; ++h) {
      const eval::StreamTrace& st = streams[static_cast<std::size_t>(l * kvh + h)];
      for (std::int64_t t = 0; t < n; ++t) {
        std::copy_n(st.key(t), d, k.data() + (static_cast<std::size_t>(t) * kvh + h) * d);
        std::copy_n(st.value(t), d, v.data() + (static_cast<std::size_t>(t) * kvh + h) * d);
      }
      for (std::int64_t i = 0; i < obs; ++i)
        std::copy_n(st.observed_queries.data() + static_cast<std::size_t>(i) * g * d, static_cast<std::size_t>(g) * d,
                    q.data() + (static_cast<std::size_t>(i) * qh + static_cast<std::size_t>(h) * g) * d);
    }
    for (M* kv : {&packed, &naive}) {
      const SeqId id = kv == &packed ? pid : nid;
      kv->prefill(id, l, make_view(k, n, kvh, d), make_view(v, n, kvh, d));
      kv->warm_up(id, l, make_view(q, obs, qh, d));
    }
  }
  const std::uint64_t ops0[2] = {packed.tiers().get<1>().read_ops(), naive.tiers().get<1>().read_ops()};
  const std::uint64_t bytes0[2] = {packed.total_stats().bytes_read[1], naive.total_stats().bytes_read[1]};
  double fetch[2] = {0, 0};
  std::vector<float> qs(static_cast<std::size_t>(qh) * d), ks(static_cast<std::size_t>(kvh) * d), vs(ks.size()), out(qs.size());
  for (std::int64_t s = 0; s < o.pack_steps; ++s)
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kvh; ++h) {
        const eval::StreamTrace& st = streams[static_cast<std::size_t>(l * kvh + h)];
        std::copy_n(st.query(s), static_cast<std::size_t>(g) * d, qs.data() + static_cast<std::size_t>(h) * g * d);
        std::copy_n(st.key(n + s), d, ks.data() + static_cast<std::size_t>(h) * d);
        std::copy_n(st.value(n + s), d, vs.data() + static_cast<std::size_t>(h) * d);
      }
      for (int which = 0; which < 2; ++which) {
        M& kv = which == 0 ? packed : naive;
        const SeqId batch[] = {which == 0 ? pid : nid};
        kv.attend(l, batch, make_view(qs, 1, qh, d), make_view(ks, 1, kvh, d), make_view(vs, 1, kvh, d), make_view(out, 1, qh, d));
        fetch[which] += kv.last_stats().time.fetch_ms / 1e3;
      }
    }
  const Stats& ps = packed.total_stats();
  const Stats& ns = naive.total_stats();
  std::uint64_t ops[2], bytes[2];
  for (int i = 0; i < 2; ++i) {
    M& kv = i == 0 ? packed : naive;
    ops[i] = kv.tiers().get<1>().read_ops() - ops0[i];
    bytes[i] = kv.total_stats().bytes_read[1] - bytes0[i];
  }
  std::printf("packing, %s (synthetic default, %d layers x %d KV heads, %lld-token prompt, %lld steps, 6.25%%, Lookahead W=3, "
              "warm-up): %llu pages packed; misses %llu (same in both: %s), hit rate %.1f%%\n",
              clustering, layers, kvh, static_cast<long long>(n), static_cast<long long>(o.pack_steps), static_cast<unsigned long long>(ps.packed),
              static_cast<unsigned long long>(ps.misses), ps.misses == ns.misses ? "yes" : "NO", 100 * ps.hit_rate());
  const char* names[2] = {"packed", "naive"};
  for (int i = 0; i < 2; ++i)
    std::printf("  %-6s: %llu I/Os for %llu pages (%.2f pages per I/O), fetch %.1f ms, %.0f MB/s\n", names[i],
                static_cast<unsigned long long>(ops[i]), static_cast<unsigned long long>(bytes[i] / c.page_bytes()),
                static_cast<double>(bytes[i] / c.page_bytes()) / static_cast<double>(std::max<std::uint64_t>(1, ops[i])), 1e3 * fetch[i],
                static_cast<double>(bytes[i]) / 1e6 / std::max(1e-9, fetch[i]));
  std::printf("  packed / naive: I/Os %.2f, fetch time %.2f\n", static_cast<double>(ops[0]) / static_cast<double>(std::max<std::uint64_t>(1, ops[1])),
              fetch[0] / std::max(1e-9, fetch[1]));
  packed.release(pid);
  naive.release(nid);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") o.dir = argv[i + 1];
    else if (a == "--pages") o.pages = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--batch") o.batch = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--qd") o.qd = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
    else if (a == "--rounds") o.rounds = std::atoi(argv[i + 1]);
    else if (a == "--pack-layers") o.pack_layers = std::atoi(argv[i + 1]);
    else if (a == "--pack-context") o.pack_context = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a == "--pack-steps") o.pack_steps = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a == "--json") o.json = argv[i + 1];
    else if (a == "--remote-pages") o.remote_pages = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--redis") o.redis = argv[i + 1];
    else if (a == "--skip-ssd") o.skip_ssd = std::string(argv[i + 1]) == "1";
    else {
      std::fprintf(stderr, "bench_tier: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    KVD_EXPECT(o.pages >= 64 && o.batch >= 1 && o.qd >= 1 && o.rounds >= 1 && o.remote_pages >= 1, "bench_tier: bad options");
    nlohmann::json result;
    if (o.skip_ssd) {
      remote_report(o, result);
      if (!o.json.empty()) std::ofstream(o.json) << result.dump(2) << "\n";
      return 0;
    }
    KVD_EXPECT(o.pack_layers >= 1 && o.pack_layers <= 8 && o.pack_context >= 1024 && o.pack_steps >= 1,
               "bench_tier: --pack-layers 1..8, --pack-context >= 1024, --pack-steps >= 1");
    constexpr std::size_t kPage = 4096;
    const std::string path = (std::filesystem::path(o.dir) / "kvd_bench_tier.store").string();
    SsdTier::remove_files(path);
    auto make = [&](unsigned qd, SsdOpen mode = SsdOpen::open_or_create) {
      SsdTier::Params p;
      p.path = path;
      p.mode = mode;
      p.queue_depth = qd;
      p.alignment = 4096;
      p.extent_pages = 1024;
      return SsdTier(p);
    };
    // The store: 8 streams' pages, written a batch at a time as decode would seal them.
    std::vector<PageKey> keys;
    {
      SsdTier t = make(o.qd);
      t.open({kPage});
      std::vector<std::byte> data(kPage * 256);
      std::mt19937_64 rng(1);
      for (auto& b : data) b = static_cast<std::byte>(rng());
      std::vector<WriteRequest> batch;
      for (std::size_t i = 0; i < o.pages; ++i) {
        keys.push_back({1, static_cast<std::uint32_t>(i % 8), 0, static_cast<std::uint32_t>(i / 8)});
        batch.push_back({keys.back(), data.data() + (i % 256) * kPage});
        if (batch.size() == 256 || i + 1 == o.pages) {
          t.write_batch(batch);
          batch.clear();
        }
      }
    }
    {  // the readers close before the store is removed
      // Readers of the store just written: read-only opens share its lock (a writer would be alone).
      SsdTier ssd = make(o.qd, SsdOpen::read_only), ssd1 = make(1, SsdOpen::read_only), ssd_reg = make(o.qd, SsdOpen::read_only);
      ssd.open({kPage});
      ssd_reg.open({kPage});
      const AlignedPages dst_reg(o.batch);  // registered with ssd_reg's ring, as KvManager does with its fast tier
      const bool registered = ssd_reg.register_memory(dst_reg[0], o.batch * kPage);
      std::vector<std::uint64_t> offsets(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i) offsets[i] = ssd.slot_offset(ssd.slot_of(keys[i]));
      std::printf("bench_tier: %zu pages of 4 KiB in %s (%s, %s), batches of %zu pages, queue depth %u\n", o.pages, path.c_str(),
                  std::string(ssd.io_name()).c_str(), ssd.direct_io() ? "O_DIRECT" : "buffered: O_DIRECT refused", o.batch, o.qd);
      const int raw_fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      KVD_EXPECT(raw_fd >= 0, "bench_tier: cannot open {} with O_DIRECT: {}", path, std::strerror(errno));
      IoEngine raw;
      raw.open(IoBackend::automatic, o.qd, 0);
      void* mem = nullptr;
      KVD_EXPECT(::posix_memalign(&mem, 4096, o.batch * kPage) == 0, "bench_tier: out of memory");
      std::byte* buf = static_cast<std::byte*>(mem);
      const AlignedPages dst(o.batch);

      const std::size_t want = std::max<std::size_t>(o.batch, o.pages / 16);  // 6.25% of the pages
      double t_raw = 0, t_ssd = 0, t_ssd1 = 0, t_reg = 0;
      std::size_t pages_read = 0;
      std::uint64_t ssd_ops = 0;
      for (int round = 0; round < o.rounds; ++round) {
        std::mt19937_64 rng(100 + static_cast<std::uint64_t>(round));
        std::vector<std::size_t> pick(o.pages);
        for (std::size_t i = 0; i < pick.size(); ++i) pick[i] = i;
        std::shuffle(pick.begin(), pick.end(), rng);
        pick.resize(want);
        for (std::size_t at = 0; at < pick.size(); at += o.batch) {
          const std::size_t n = std::min(o.batch, pick.size() - at);
          // raw: one 4 KiB O_DIRECT read per page
          std::vector<IoRead> reads(n);
          for (std::size_t j = 0; j < n; ++j) reads[j] = {offsets[pick[at + j]], kPage, buf + j * kPage, 0};
          auto t0 = std::chrono::steady_clock::now();
          raw.read_all(raw_fd, reads);
          t_raw += seconds_since(t0);
          for (const IoRead& r : reads) KVD_EXPECT(r.result == static_cast<std::int64_t>(kPage), "bench_tier: raw read failed");
          // ssd at the same queue depth, then at depth 1
          std::vector<ReadRequest> req(n);
          for (std::size_t j = 0; j < n; ++j) req[j] = {keys[pick[at + j]], dst[j]};
          const std::uint64_t ops0 = ssd.read_ops();
          t0 = std::chrono::steady_clock::now();
          ssd.wait(ssd.submit(req));
          t_ssd += seconds_since(t0);
          ssd_ops += ssd.read_ops() - ops0;
          // ssd into registered buffers (fixed reads)
          for (std::size_t j = 0; j < n; ++j) req[j].dst = dst_reg[j];
          t0 = std::chrono::steady_clock::now();
          ssd_reg.wait(ssd_reg.submit(req));
          t_reg += seconds_since(t0);
          for (std::size_t j = 0; j < n; ++j) req[j].dst = dst[j];
          if (round == 0) {
            if (at == 0) ssd1.open({kPage});
            t0 = std::chrono::steady_clock::now();
            ssd1.wait(ssd1.submit(req));
            t_ssd1 += seconds_since(t0);
          }
          pages_read += n;
        }
      }
      ::close(raw_fd);
      std::free(mem);
      const double mb = static_cast<double>(pages_read) * kPage / 1e6;
      std::printf("%-10s %12s %10s %14s\n", "reader", "pages/s", "MB/s", "vs raw");
      std::printf("%-10s %12.0f %10.1f %14s\n", "raw", static_cast<double>(pages_read) / t_raw, mb / t_raw, "1 (the device)");
      std::printf("%-10s %12.0f %10.1f %14.3f\n", "ssd", static_cast<double>(pages_read) / t_ssd, mb / t_ssd, t_raw / t_ssd);
      std::printf("%-10s %12.0f %10.1f %14.3f  (%s; %llu fixed reads)\n", "ssd-reg", static_cast<double>(pages_read) / t_reg, mb / t_reg,
                  t_raw / t_reg, registered ? "destination buffers registered with io_uring" : "registration refused here: plain reads",
                  static_cast<unsigned long long>(ssd_reg.fixed_reads()));
      const double mb1 = static_cast<double>(want) * kPage / 1e6;
      std::printf("%-10s %12.0f %10.1f %14s\n", "ssd-qd1", static_cast<double>(want) / t_ssd1, mb1 / t_ssd1, "(round 1 only)");
      std::printf("ssd merged %zu page reads into %llu I/Os (adjacent slots)\n", pages_read, static_cast<unsigned long long>(ssd_ops));
      result = {{"pages", o.pages},
                          {"batch", o.batch},
                          {"queue_depth", o.qd},
                          {"io", std::string(ssd.io_name())},
                          {"direct_io", ssd.direct_io()},
                          {"random_4k_mb_per_s", {{"raw", mb / t_raw}, {"ssd", mb / t_ssd}, {"ssd_registered", mb / t_reg}, {"ssd_qd1", mb1 / t_ssd1}}}};

      // A decode workload against the FlexGen-style strawman: the store's 8 streams are 8 layers;
      // each step reads a random 6.25% of every layer's pages (its misses). MmapTier loads each
      // layer whole; its page cache is dropped before every step, as when the KV outgrows DRAM.
      const std::string mpath = (std::filesystem::path(o.dir) / "kvd_bench_tier.mmap").string();
      {
        MmapTier mm(MmapTier::Params{mpath, o.pages});
        mm.open({kPage});
        std::vector<std::byte> page(kPage);
        std::vector<PageKey> by_layer = keys;  // FlexGen keeps a layer's KV together
        std::stable_sort(by_layer.begin(), by_layer.end(), [](const PageKey& a, const PageKey& b) { return a.layer < b.layer; });
        for (const PageKey& k : by_layer) {
          const ReadRequest r{k, page.data()};
          ssd.wait(ssd.submit(std::span<const ReadRequest>(&r, 1)));
          mm.write(k, page.data());
        }
        const int steps = 4;
        const std::size_t per_layer = o.pages / 8;
        // Misses per layer-step: all selected pages (no cache), or what a Lookahead W = 3 cache
        // leaves (12.3%: its measured miss rate on the default trace, docs/eviction.md).
        for (const double miss_rate : {1.0, 0.123}) {
          const std::size_t misses = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(per_layer / 16) * miss_rate));
          double t_ssd_dec = 0, t_mm_dec = 0;
          std::mt19937_64 rng(7);
          const AlignedPages out(misses);
          for (int step = 0; step < steps; ++step)
            for (std::uint32_t layer = 0; layer < 8; ++layer) {
              std::vector<ReadRequest> req;
              std::set<std::uint32_t> chosen;
              while (chosen.size() < misses) chosen.insert(static_cast<std::uint32_t>(rng() % per_layer));
              std::size_t j = 0;
              for (std::uint32_t pg : chosen) req.push_back({{1, layer, 0, pg}, out[j++]});
              auto t0 = std::chrono::steady_clock::now();
              ssd.wait(ssd.submit(req));
              t_ssd_dec += seconds_since(t0);
              mm.drop_cache();
              t0 = std::chrono::steady_clock::now();
              mm.wait(mm.submit(req));
              t_mm_dec += seconds_since(t0);
            }
          result["decode_workload"].push_back({{"misses_per_layer", misses}, {"miss_rate", miss_rate}, {"ssd_ms_per_step", 1e3 * t_ssd_dec / steps},
                                          {"mmap_ms_per_step", 1e3 * t_mm_dec / steps}});
          std::printf("decode workload, %s (%d steps x 8 layers, %zu of %zu pages read per layer): ssd %.1f ms/step, mmap %.1f ms/step: "
                      "ssd %.1fx faster\n",
                      miss_rate == 1.0 ? "no cache: every selected page (6.25%)" : "the misses a Lookahead W=3 cache leaves", steps, misses,
                      per_layer, 1e3 * t_ssd_dec / steps, 1e3 * t_mm_dec / steps, t_mm_dec / t_ssd_dec);
        }
        const double layer_mb = static_cast<double>(per_layer * kPage) / 1e6;
        // Sequential bandwidth: MmapTier's cold whole-layer loads against O_DIRECT 1 MiB reads.
        const int seq_fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        KVD_EXPECT(seq_fd >= 0, "bench_tier: cannot reopen {}", path);
        const std::size_t chunk = 1 << 20, total = o.pages * kPage;
        void* big = nullptr;
        KVD_EXPECT(::posix_memalign(&big, 4096, 8 * chunk) == 0, "bench_tier: out of memory");
        std::vector<IoRead> seq;
        auto t0 = std::chrono::steady_clock::now();
        for (std::size_t off = 0; off < total; off += 8 * chunk) {
          seq.clear();
          for (std::size_t k = 0; k < 8 && off + k * chunk < total; ++k)
            seq.push_back({4096 + off + k * chunk, std::min(chunk, total - off - k * chunk), static_cast<std::byte*>(big) + k * chunk, 0});
          raw.read_all(seq_fd, seq);
        }
        const double t_seq = seconds_since(t0);
        ::close(seq_fd);
        std::free(big);
        mm.drop_cache();
        std::vector<std::byte> one(kPage);
        t0 = std::chrono::steady_clock::now();
        for (std::uint32_t layer = 0; layer < 8; ++layer) {
          const ReadRequest r{{1, layer, 0, 0}, one.data()};
          mm.wait(mm.submit(std::span<const ReadRequest>(&r, 1)));
        }
        const double t_mm_seq = seconds_since(t0);
        result["sequential_mb_per_s"] = {{"raw_1mib", static_cast<double>(total) / 1e6 / t_seq}, {"mmap_layers", 8 * layer_mb / t_mm_seq}};
        std::printf("sequential: O_DIRECT 1 MiB reads %.0f MB/s; mmap whole-layer loads (cold) %.0f MB/s = %.2f of the device\n",
                    static_cast<double>(total) / 1e6 / t_seq, 8 * layer_mb / t_mm_seq, (8 * layer_mb / t_mm_seq) / (static_cast<double>(total) / 1e6 / t_seq));
      }
      std::filesystem::remove(mpath);
    }
    SsdTier::remove_files(path);
    remote_report(o, result);
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << result.dump(2) << "\n";
      KVD_EXPECT(f.good(), "bench_tier: cannot write {}", o.json);
    }
    packing_report(o, index::HierarchicalParams{}, "hierarchical (KVDrive)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tier: %s\n", e.what());
    return 1;
  }
  return 0;
}
