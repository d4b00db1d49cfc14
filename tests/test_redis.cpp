// tier::RedisTier against a private redis-server (tests/redis_server.hpp): URLs, round trips,
// misses, checksums, TTL, the byte budget, a dead server; and KvManager sharing a prompt prefix
// between engines through it (share_prefixes, load_prefix), with the server killed mid-run.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <numeric>
#include <random>
#include <cstring>
#include <thread>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/redis.hpp"
#include "redis_server.hpp"
#include "support.hpp"
#include "workload.hpp"

#include "decoder/decoder.hpp"
#include "decoder/sampler.hpp"
#include "model/synthetic.hpp"

using namespace kvdrive;
using kvdrive::testing::RedisServer;
using tier::PageKey;
using tier::RedisTier;
using tier::RemoteRead;

namespace {

/// Skips (with a visible message) where redis-server is not installed.
bool have_redis() {
  if (kvdrive::testing::redis_server_binary()) return true;
  MESSAGE("SKIPPED: redis-server is not installed (scripts/bootstrap installs it)");
  return false;
}

std::vector<std::byte> page_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> p(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : p) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return p;
}

RedisTier open_tier(RedisTier::Params p, std::size_t bytes) {
  RedisTier t(std::move(p));
  t.open(tier::TierGeometry{bytes});
  return t;
}

}  // namespace

TEST_CASE("redis URL: the forms a user writes, and clear errors for the rest") {
  auto u = tier::RedisUrl::parse("redis://127.0.0.1:6380/2");
  CHECK(u.host == "127.0.0.1");
  CHECK(u.port == 6380);
  CHECK(u.db == 2);
  CHECK(u.user.empty());
  CHECK(u.password.empty());
  CHECK_FALSE(u.is_unix());

  u = tier::RedisUrl::parse("redis://alice:p%40ss@cache.internal");
  CHECK(u.user == "alice");
  CHECK(u.password == "p@ss");
  CHECK(u.host == "cache.internal");
  CHECK(u.port == 6379);
  CHECK(u.db == 0);
  CHECK(u.describe() == "redis://alice:***@cache.internal:6379/0");

  u = tier::RedisUrl::parse("redis://:secret@[::1]:7000/");
  CHECK(u.user.empty());
  CHECK(u.password == "secret");
  CHECK(u.host == "::1");
  CHECK(u.port == 7000);

  u = tier::RedisUrl::parse("unix:///run/redis/redis.sock?db=3");
  CHECK(u.is_unix());
  CHECK(u.socket_path == "/run/redis/redis.sock");
  CHECK(u.db == 3);

  for (const char* bad : {"http://host", "redis://", "redis://host:0", "redis://host:65536", "redis://host:12x", "redis://host/abc", "rediss://host",
                          "unix://relative.sock", "unix:///s.sock?database=1", "redis://[::1", "redis://u:%zz@h"})
    CHECK_THROWS_AS(tier::RedisUrl::parse(bad), Error);
  CHECK_THROWS_WITH_AS(tier::RedisUrl::parse("redis://h:99999"), doctest::Contains("port '99999'"), Error);
  try {
    tier::RedisUrl::parse("redis://bob:hunter2@h:99999");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("hunter2") == std::string::npos);  // the password is not shown
    CHECK(std::string(e.what()).find("redis://***@h:99999") != std::string::npos);
  }
  CHECK_THROWS_AS(tier::RedisUrl::parse("redis://u:%-1@h"), Error);
}

TEST_CASE("remote value: the checksum binds the page to its key") {
  const auto page = page_bytes(256, 1);
  std::vector<std::byte> value(tier::RemoteValue::kHeaderBytes + page.size()), back(page.size());
  tier::RemoteValue::encode("k1", page.data(), page.size(), value.data());
  CHECK(tier::RemoteValue::decode("k1", value.data(), value.size(), back.data(), back.size()));
  CHECK(back == page);
  std::vector<std::byte> untouched(page.size(), std::byte{7});
  CHECK_FALSE(tier::RemoteValue::decode("k2", value.data(), value.size(), untouched.data(), untouched.size()));  // another key
  CHECK_FALSE(tier::RemoteValue::decode("k1", value.data(), value.size() - 1, untouched.data(), untouched.size() - 1));
  value[tier::RemoteValue::kHeaderBytes + 100] ^= std::byte{1};
  CHECK_FALSE(tier::RemoteValue::decode("k1", value.data(), value.size(), untouched.data(), untouched.size()));
  CHECK(untouched == std::vector<std::byte>(page.size(), std::byte{7}));  // a failed decode writes nothing
}

TEST_CASE("RedisTier: pages round-trip over TCP and a Unix socket, in batches larger than the pipeline") {
  if (!have_redis()) return;
  RedisServer server;
  constexpr std::size_t kBytes = 4096;
  for (const std::string& url : {server.url(1), server.unix_url()}) {
    CAPTURE(url);
    RedisTier t = open_tier({.url = url, .max_in_flight = 7}, kBytes);
    std::vector<std::vector<std::byte>> pages;
    std::vector<tier::WriteRequest> writes;
    for (std::uint32_t i = 0; i < 40; ++i) pages.push_back(page_bytes(kBytes, i + 100));
    for (std::uint32_t i = 0; i < 40; ++i) writes.push_back({PageKey{5, i % 3, i % 2, i}, pages[i].data()});
    t.write_batch(writes);
    std::vector<std::vector<std::byte>> back(41, std::vector<std::byte>(kBytes));
    std::vector<tier::ReadRequest> reads;
    for (std::uint32_t i = 0; i < 40; ++i) reads.push_back({writes[39 - i].key, back[i].data()});
    reads.push_back({PageKey{5, 0, 0, 999}, back[40].data()});  // never written
    std::vector<RemoteRead> outcome(reads.size());
    t.wait_each(t.submit(reads), outcome);
    for (std::uint32_t i = 0; i < 40; ++i) {
      CHECK(outcome[i] == RemoteRead::hit);
      CHECK(back[i] == pages[39 - i]);
    }
    CHECK(outcome[40] == RemoteRead::missing);
    CHECK_THROWS_WITH_AS(t.wait(t.submit(std::span(reads).subspan(40))), doctest::Contains("not on the server"), Error);
    CHECK(t.contains(writes[3].key));
    t.erase(writes[3].key);
    CHECK_FALSE(t.contains(writes[3].key));
    const auto st = t.remote_stats();
    CHECK(st.written == 40);
    CHECK(st.hits == 40);
    CHECK(st.missing == 2);
    CHECK(st.errors == 0);
    CHECK(st.connects == 1);
  }
  // Shared pages are found by any tier object on the same server and db, not on another db.
  RedisTier db1 = open_tier({.url = server.url(1)}, kBytes), db1_again = open_tier({.url = server.url(1)}, kBytes),
            db2 = open_tier({.url = server.url(2)}, kBytes);
  const std::vector<PrefixDigest> chain{{9, 9, 16}, {9, 10, 32}, {9, 11, 48}}, other{{9, 9, 16}, {8, 10, 32}};
  const auto p = page_bytes(kBytes, 1);
  std::vector<tier::WriteRequest> two{{PageKey{1, 0, 0, 0}, p.data()}, {PageKey{1, 0, 0, 1}, p.data()}};
  db1.publish(chain, two);
  db1.flush();
  CHECK(db1_again.lookup(chain, 1, 1) == 2);
  CHECK(db2.lookup(chain, 1, 1) == 0);
  CHECK(db1_again.lookup(other, 1, 1) == 1);  // a chain that parts after its first page
}

TEST_CASE("RedisTier: a damaged, truncated or misplaced value is a checksum miss, never data") {
  if (!have_redis()) return;
  RedisServer server;
  constexpr std::size_t kBytes = 1024;
  RedisTier t = open_tier({.url = server.url()}, kBytes);
  const auto a = page_bytes(kBytes, 1), b = page_bytes(kBytes, 2);
  const PageKey ka{1, 0, 0, 0}, kb{1, 0, 0, 1}, kc{1, 0, 0, 2};
  t.write(ka, a.data());
  t.write(kb, b.data());
  t.write(kc, b.data());
  // Flip one byte of a's page on the server; truncate b's; copy c's value under a's... no: put b's value under c's key.
  std::string va = server.command({"GET", t.key(ka)});
  va[tier::RemoteValue::kHeaderBytes + 17] ^= 0x20;
  CHECK(server.command({"SET", t.key(ka), va}) == "OK");
  std::string vb = server.command({"GET", t.key(kb)});
  CHECK(server.command({"SET", t.key(kb), vb.substr(0, vb.size() - 1)}) == "OK");
  CHECK(server.command({"SET", t.key(kc), server.command({"GET", t.key(kb)}) + "x"}) == "OK");
  const PageKey kd{1, 0, 0, 3};
  t.write(kd, a.data());
  CHECK(server.command({"SET", t.key(kd), vb}) == "OK");  // b's whole value under d's key: checksum bound to b's key
  std::vector<std::byte> out(4 * kBytes, std::byte{0x55});
  const std::vector<tier::ReadRequest> reads{
      {ka, out.data()}, {kb, out.data() + kBytes}, {kc, out.data() + 2 * kBytes}, {kd, out.data() + 3 * kBytes}};
  std::vector<RemoteRead> outcome(4);
  t.wait_each(t.submit(reads), outcome);
  for (auto o : outcome) CHECK(o == RemoteRead::corrupt);
  CHECK(t.remote_stats().corrupt == 4);
  CHECK(t.remote_stats().hits == 0);
  CHECK(out == std::vector<std::byte>(4 * kBytes, std::byte{0x55}));  // nothing written into the caller's pages
}

TEST_CASE("RedisTier: pages expire after the TTL") {
  if (!have_redis()) return;
  RedisServer server;
  RedisTier t = open_tier({.url = server.url(), .ttl_ms = 300}, 512);
  const auto p = page_bytes(512, 3);
  t.write(PageKey{1, 0, 0, 0}, p.data());
  CHECK(t.contains(PageKey{1, 0, 0, 0}));
  const long pttl = std::stol(server.command({"PTTL", t.key(PageKey{1, 0, 0, 0})}));
  CHECK(pttl > 0);
  CHECK(pttl <= 300);
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  CHECK_FALSE(t.contains(PageKey{1, 0, 0, 0}));
  std::vector<std::byte> out(512);
  RemoteRead o{};
  const tier::ReadRequest r{PageKey{1, 0, 0, 0}, out.data()};
  t.wait_each(t.submit(std::span(&r, 1)), std::span(&o, 1));
  CHECK(o == RemoteRead::missing);
}

TEST_CASE("RedisTier: the byte budget bounds what it stores; erases and expiry give room back") {
  if (!have_redis()) return;
  RedisServer server;
  constexpr std::size_t kBytes = 1000, kValue = kBytes + tier::RemoteValue::kHeaderBytes;
  RedisTier t = open_tier({.url = server.url(), .ttl_ms = 400, .byte_budget = 3 * kValue + 10, .timeout_ms = 100}, kBytes);
  CHECK(t.free_pages() == 3);
  const auto p = page_bytes(kBytes, 4);
  std::vector<tier::WriteRequest> w;
  for (std::uint32_t i = 0; i < 5; ++i) w.push_back({PageKey{2, 0, 0, i}, p.data()});
  CHECK_THROWS_WITH_AS(t.write_batch(w), doctest::Contains("stored 3 of 5 pages"), Error);
  auto st = t.remote_stats();
  CHECK(st.written == 3);
  CHECK(st.over_budget == 2);
  CHECK(server.command({"DBSIZE"}) == "3");
  CHECK(t.free_pages() == 0);
  CHECK_THROWS_WITH_AS(t.write(PageKey{2, 0, 0, 9}, p.data()), doctest::Contains("byte budget"), Error);
  t.publish(std::vector<PrefixDigest>(5, PrefixDigest{5, 5, 80}), std::span(w).first(2));  // shared pages count against the same budget
  t.flush();
  CHECK(t.remote_stats().over_budget == 5);
  t.write(w[0].key, p.data());  // a rewrite takes no more room
  t.erase(w[1].key);
  CHECK(t.free_pages() == 1);
  t.write(PageKey{2, 0, 0, 7}, p.data());
  std::this_thread::sleep_for(std::chrono::milliseconds(650));  // TTL + timeout: all expired
  CHECK_FALSE(t.contains(w[0].key));
  CHECK_FALSE(t.contains(PageKey{2, 0, 0, 7}));
  t.write(PageKey{2, 0, 0, 8}, p.data());
  CHECK(t.free_pages() == 2);
}

TEST_CASE("RedisTier: a server that is down or dies gives misses and errors, fast, and never throws from publish") {
  if (!have_redis()) return;
  auto server = std::make_unique<RedisServer>();
  constexpr std::size_t kBytes = 2048;
  RedisTier t = open_tier({.url = server->url(), .timeout_ms = 300, .retry_after_ms = 200}, kBytes);
  const auto p = page_bytes(kBytes, 5);
  t.write(PageKey{3, 0, 0, 0}, p.data());
  const std::string url = server->url();
  server->kill();
  std::vector<std::byte> out(kBytes);
  const tier::ReadRequest r{PageKey{3, 0, 0, 0}, out.data()};
  RemoteRead o{};
  const auto t0 = std::chrono::steady_clock::now();
  t.wait_each(t.submit(std::span(&r, 1)), std::span(&o, 1));
  CHECK(o == RemoteRead::error);
  const std::vector<tier::WriteRequest> w{{PageKey{3, 0, 0, 1}, p.data()}};
  t.publish(std::vector<PrefixDigest>(2, PrefixDigest{1, 2, 0}), w);  // queued, fails in the background
  t.flush();
  CHECK_FALSE(t.contains(PageKey{3, 0, 0, 0}));
  CHECK(t.lookup(std::vector<PrefixDigest>(4, PrefixDigest{3, 0, 0}), 1, 1) == 0);
  CHECK_THROWS_AS(t.write(PageKey{3, 0, 0, 2}, p.data()), Error);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 3.0);  // no hang: a refused connection fails at once, then fast for retry_after_ms
  const auto st = t.remote_stats();
  CHECK(st.errors == 1);
  CHECK(st.write_errors >= 2);
  CHECK(st.lookup_errors == 1);
  // A tier pointed at a port where nothing listens behaves the same from the start.
  RedisTier nowhere = open_tier({.url = fmt::format("redis://127.0.0.1:{}/0", kvdrive::testing::free_loopback_port())}, kBytes);
  nowhere.wait_each(nowhere.submit(std::span(&r, 1)), std::span(&o, 1));
  CHECK(o == RemoteRead::error);
  CHECK(nowhere.lookup(std::vector<PrefixDigest>(8, PrefixDigest{1, 0, 0}), 2, 2) == 0);
  CHECK(nowhere.remote_stats().errors == 1);
  CHECK(nowhere.remote_stats().connects == 0);
  (void)url;
}

// ---- KvManager sharing prefixes -------------------------------------------------------------------

namespace {

using test::Workload;
using SsdTiers = Tiers<tier::HostTier, tier::SsdTier>;
template <class Pipeline, class Remote>
using SharingManager = KvManager<index::Hierarchical, eviction::Lookahead, SsdTiers, Pipeline, backend::Cpu, Remote>;

SsdTiers ssd_tiers(const test::TempDir& dir, const char* name) {
  tier::SsdTier::Params p;
  p.path = dir.file(name);
  tier::SsdTier::remove_files(p.path);
  return SsdTiers(tier::HostTier{}, tier::SsdTier(p));
}

/// The digest of sequence s's shared prefix: its first prefix[s] tokens (here: seeded stand-ins).
PrefixDigest prefix_digest(const Workload& w, int s, int tokens) {
  const std::uint64_t id[] = {w.seed, static_cast<std::uint64_t>(s)};
  return PrefixDigest::of_bytes(id, sizeof id, tokens);
}

/// A remote tier that kills the server right after answering a lookup: the reads that follow fail.
struct KillAfterLookup : RedisTier {
  RedisServer* server = nullptr;
  using RedisTier::RedisTier;
  std::uint32_t lookup(tier::PageChain chain, std::uint32_t l, std::uint32_t h) {
    const std::uint32_t found = RedisTier::lookup(chain, l, h);
    if (server) server->kill();
    return found;
  }
};
static_assert(tier::RemoteTier<KillAfterLookup>);

/// Prefills sequence s of the workload into kv in chunks of `chunk` tokens, as an engine does:
/// load_prefix first when it can share, then computes (here: takes from the workload) only the
/// tokens after what it loaded. Returns the tokens loaded; checks that the loaded K/V are the
/// workload's, in the KV dtype.
template <class M>
std::int64_t prefill_sharing(M& kv, SeqId id, const Workload& w, int s, int chunk) {
  const auto& sh = w.cfg.shape;
  const int n = w.prompt[static_cast<std::size_t>(s)], kvh = sh.kv_heads, d = sh.head_dim;
  std::int64_t loaded = 0;
  if constexpr (requires { kv.load_prefix(id, n - 1, chunk); }) {
    const auto r = kv.load_prefix(id, n - 1, chunk, [&](int l, View<const float, 3> k, View<const float, 3> v) {
      const auto k_all = w.rows(s, l, 0, n, kvh, 1), v_all = w.rows(s, l, 0, n, kvh, 2);
      bool same = true;
      for (std::int64_t t = 0; t < k.extent(0); ++t)
        for (int h = 0; h < kvh; ++h)
          for (int j = 0; j < d; ++j) {
            const std::size_t at = (static_cast<std::size_t>(t) * kvh + h) * d + j;
            const auto round = [&](float x) { return w.cfg.dtype == DType::f16 ? float(half(x)) : x; };
            same = same && k.data[at] == round(k_all[at]) && v.data[at] == round(v_all[at]);
          }
      CHECK(same);
    });
    loaded = r.tokens;
    for (int l = 0; l < sh.layers; ++l) CHECK(kv.length(id, l) == loaded);
  }
  for (int l = 0; l < sh.layers; ++l) {
    const auto k = w.rows(s, l, 0, n, kvh, 1), v = w.rows(s, l, 0, n, kvh, 2);
    for (std::int64_t t0 = loaded; t0 < n; t0 += chunk) {
      const std::int64_t m = std::min<std::int64_t>(chunk, n - t0);
      const std::size_t at = static_cast<std::size_t>(t0) * kvh * d;
      kv.prefill(id, l, make_view(k.data() + at, m, kvh, d), make_view(v.data() + at, m, kvh, d));
    }
  }
  return loaded;
}

template <class M>
std::vector<SeqId> add_all(M& kv, const Workload& w, const std::vector<int>& prefix) {
  std::vector<SeqId> ids;
  for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) ids.push_back(kv.add_sequence(prefix_digest(w, s, prefix[s])));
  return ids;
}

}  // namespace

TEST_CASE("two KvManagers share a prompt prefix through one server: the second reads it instead of computing it, same output") {
  if (!have_redis()) return;
  RedisServer server;
  test::TempDir dir;
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 3 * test::scale(); ++trial) {
    CAPTURE(trial);
    const Workload w = test::random_workload(rng);
    const auto& sh = w.cfg.shape;
    const int pt = w.cfg.page_tokens;
    const int chunk = std::vector<int>{3 * pt, 20, 64, 1000}[rng() % 4];  // the engine's prefill chunk
    CAPTURE(chunk);
    std::vector<int> prefix;  // the shared part: the whole prompt, or a part of it
    for (int n : w.prompt) prefix.push_back(rng() % 2 ? n : n / 2 + 3);
    const auto params = [&] { return RedisTier::Params{.url = server.url(), .model = PrefixDigest::of_bytes("model", 5), .max_in_flight = 16}; };
    RedisTier ra(params()), rb_own(params());
    // Odd trials: both managers (whose sequence ids are the same numbers) share one tier object.
    RedisTier& rb = trial % 2 ? ra : rb_own;
    SharingManager<pipeline::Serial, RedisTier> a(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "a"));
    SharingManager<pipeline::Elastic, RedisTier> b(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "b"));
    KvManager<index::Hierarchical, eviction::Lookahead, SsdTiers> alone(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "c"));
    a.share_prefixes(ra);
    b.share_prefixes(rb);
    const auto ia = add_all(a, w, prefix), ib = add_all(b, w, prefix), ic = add_all(alone, w, prefix);
    for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) {
      CHECK(prefill_sharing(a, ia[s], w, s, chunk) == 0);  // first: nothing there yet, it computes and publishes
      prefill_sharing(alone, ic[s], w, s, chunk);
    }
    ra.flush();
    const tier::RemoteStats before = rb.remote_stats();
    std::uint64_t expect_read = 0, expect_written = 0;
    const std::uint64_t streams = static_cast<std::uint64_t>(sh.layers) * sh.kv_heads;
    for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) {
      const std::int64_t unit = std::lcm(chunk, pt);  // whole pages in whole chunks, and one token left to compute
      const std::int64_t want = std::min(prefix[s], w.prompt[s] - 1) / unit * unit;
      CHECK(prefill_sharing(b, ib[s], w, s, chunk) == want);
      expect_read += static_cast<std::uint64_t>(want / pt) * streams;
      // It publishes only the prefix pages it computed (the last one, when the prefix is the whole prompt).
      expect_written += static_cast<std::uint64_t>(std::min(prefix[s], w.prompt[s]) / pt - want / pt) * streams;
    }
    rb.flush();
    CHECK(rb.remote_stats().hits - before.hits == expect_read);
    CHECK(rb.remote_stats().misses() == 0);
    CHECK(rb.remote_stats().written - before.written == expect_written);
    for (int t = 0; t < w.steps; ++t)
      for (int l = 0; l < sh.layers; ++l) {
        const auto oa = test::step(a, w, ia, l, t), ob = test::step(b, w, ib, l, t), oc = test::step(alone, w, ic, l, t);
        CHECK(test::same_bits(oa, oc));
        CHECK(test::same_bits(ob, oc));
      }
  }
}

TEST_CASE("sharing survives the server: a corrupt page, a server killed mid-load, and one killed mid-decode") {
  if (!have_redis()) return;
  test::TempDir dir;
  std::mt19937_64 rng(12);
  Workload w = test::random_workload(rng);
  w.prompt = {200, 137};
  const auto& sh = w.cfg.shape;
  const int pt = w.cfg.page_tokens;
  const std::vector<int> prefix = w.prompt;
  const int chunk = 16;
  KvManager<index::Hierarchical, eviction::Lookahead, SsdTiers> alone(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "ref"));
  const auto ic = add_all(alone, w, prefix);
  for (int s = 0; s < 2; ++s) prefill_sharing(alone, ic[s], w, s, chunk);
  std::vector<std::vector<std::vector<float>>> want(static_cast<std::size_t>(w.steps));
  for (int t = 0; t < w.steps; ++t)
    for (int l = 0; l < sh.layers; ++l) want[t].push_back(test::step(alone, w, ic, l, t));
  const auto decode_matches = [&](auto& kv, const std::vector<SeqId>& ids, const std::function<void(int)>& at_step = {}) {
    bool same = true;
    for (int t = 0; t < w.steps; ++t) {
      if (at_step) at_step(t);
      for (int l = 0; l < sh.layers; ++l) same = same && test::same_bits(test::step(kv, w, ids, l, t), want[t][l]);
    }
    return same;
  };
  const PrefixDigest model = PrefixDigest::of_bytes("m", 1);
  const auto publish = [&](RedisServer& server) {
    RedisTier r({.url = server.url(), .model = model});
    SharingManager<pipeline::Serial, RedisTier> a(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "pub"));
    a.share_prefixes(r);
    const auto ia = add_all(a, w, prefix);
    for (int s = 0; s < 2; ++s) prefill_sharing(a, ia[s], w, s, chunk);
    r.flush();
    return r.key(a.shared_chain(ia[0])[5], tier::PageKey{0, 1, 2, 5});  // a page inside sequence 0's prefix
  };

  SUBCASE("a corrupt page ends the run there; the rest is computed") {
    RedisServer server;
    const std::string bad = publish(server);
    std::string v = server.command({"GET", bad});
    v[v.size() / 2] ^= 0x01;
    server.command({"SET", bad, v});
    RedisTier r({.url = server.url(), .model = model});
    SharingManager<pipeline::Elastic, RedisTier> b(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "b"));
    b.share_prefixes(r);
    const auto ib = add_all(b, w, prefix);
    CHECK(prefill_sharing(b, ib[0], w, 0, chunk) == 5 * pt / 16 * 16);  // page 5 of (layer 1, head 2) failed: pages 0-4, whole chunks
    CHECK(prefill_sharing(b, ib[1], w, 1, chunk) == (137 - 1) / 16 * 16);
    CHECK(r.remote_stats().corrupt == 1);
    CHECK(decode_matches(b, ib));
  }
  SUBCASE("the server dies between the lookup and the reads: nothing is loaded, all is computed") {
    RedisServer server;
    publish(server);
    KillAfterLookup r({.url = server.url(), .model = model, .timeout_ms = 300});
    r.server = &server;
    SharingManager<pipeline::Serial, KillAfterLookup> b(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "b"));
    b.share_prefixes(r);
    const auto ib = add_all(b, w, prefix);
    CHECK(prefill_sharing(b, ib[0], w, 0, chunk) == 0);
    CHECK(prefill_sharing(b, ib[1], w, 1, chunk) == 0);  // the server is gone: the lookup finds nothing
    CHECK(r.remote_stats().errors > 0);
    CHECK(r.remote_stats().hits == 0);
    CHECK(decode_matches(b, ib));
  }
  SUBCASE("the server dies while an engine decodes and adds sequences: decoding goes on, output unchanged") {
    auto server = std::make_unique<RedisServer>();
    publish(*server);
    RedisTier r({.url = server->url(), .model = model, .timeout_ms = 300});
    SharingManager<pipeline::Elastic, RedisTier> b(w.cfg, {}, eviction::Lookahead{2}, ssd_tiers(dir, "b"));
    b.share_prefixes(r);
    auto ib = add_all(b, w, prefix);
    CHECK(prefill_sharing(b, ib[0], w, 0, chunk) > 0);
    CHECK(prefill_sharing(b, ib[1], w, 1, chunk) > 0);
    CHECK(decode_matches(b, ib, [&](int t) {
      if (t == 2) server->kill();
      if (t == 3) {  // a new sequence while the server is down: it computes its prefill; publishing fails quietly
        const SeqId extra = b.add_sequence(prefix_digest(w, 7, 64));
        const auto k = w.rows(7, 0, 0, 64, sh.kv_heads, 1);
        CHECK(b.load_prefix(extra, 63, chunk).tokens == 0);
        for (int l = 0; l < sh.layers; ++l) {
          b.prefill(extra, l, make_view(k, 64, sh.kv_heads, sh.head_dim), make_view(k, 64, sh.kv_heads, sh.head_dim));
        }
        b.release(extra);
      }
    }));
    r.flush();
    CHECK(r.remote_stats().write_errors + r.remote_stats().errors + r.remote_stats().lookup_errors > 0);
  }
}

TEST_CASE("load_prefix: misuse is a clear error; a sequence without a digest, or no server, loads nothing") {
  Workload w;
  w.cfg.shape = {2, 4, 2, 16};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.prompt = {100};
  RedisTier nowhere(
      {.url = fmt::format("redis://127.0.0.1:{}/0", kvdrive::testing::free_loopback_port()), .model = PrefixDigest{7, 7, 0}, .timeout_ms = 200});
  {
    RedisTier no_model({.url = "redis://127.0.0.1:1/0"});
    KvManager<index::Quest, eviction::Lookahead, Tiers<tier::HostTier>, pipeline::Serial, backend::Cpu, RedisTier> other(w.cfg);
    CHECK_THROWS_WITH_AS(other.share_prefixes(no_model), doctest::Contains("no model digest"), Error);
  }
  KvManager<index::Quest, eviction::Lookahead, Tiers<tier::HostTier>, pipeline::Serial, backend::Cpu, RedisTier> kv(w.cfg);
  const SeqId plain = kv.add_sequence();
  CHECK(kv.load_prefix(plain, 99, 16).tokens == 0);  // no remote tier yet
  kv.share_prefixes(nowhere);
  CHECK(kv.load_prefix(plain, 99, 16).tokens == 0);  // no digest: nothing asked
  CHECK(nowhere.remote_stats().lookups == 0);
  const SeqId id = kv.add_sequence(prefix_digest(w, 0, 100));
  CHECK_THROWS_WITH_AS(kv.load_prefix(id, 99, 0), doctest::Contains("chunk 0 must be in 1..2^30"), Error);
  const auto r = kv.load_prefix(id, 99, 16);  // the server is not there: a miss, not an error
  CHECK(r.tokens == 0);
  CHECK(nowhere.remote_stats().lookup_errors == 1);
  const auto k = w.rows(0, 0, 0, 24, 2, 1);
  kv.prefill(id, 0, make_view(k, 24, 2, 16), make_view(k, 24, 2, 16));  // publishing fails quietly
  CHECK_THROWS_WITH_AS(kv.load_prefix(id, 99, 16), doctest::Contains("already holds 24 tokens"), Error);
  nowhere.flush();
  CHECK(nowhere.remote_stats().write_errors == 3 * 2);  // 3 pages of 2 heads
}

// ---- the reference decoder ------------------------------------------------------------------------

TEST_CASE("the decoder reads a shared prompt prefix from the server instead of computing it, with the same logits") {
  if (!have_redis()) return;
  using namespace kvdrive::llama;
  RedisServer server;
  ThreadPool pool(2);
  const Model m =
      make_synthetic({"tiny", 4}, ShapeOverrides{.layers = 2, .heads = {}, .kv_heads = {}, .head_dim = {}, .hidden = {}, .vocab = {}}, pool);
  std::mt19937 rng(2);
  std::vector<int> prompt(330);
  for (auto& t : prompt) t = static_cast<int>(rng() % 512);
  for (DType dtype : {DType::f16, DType::f32}) {
    CAPTURE(dtype_name(dtype));
    Config cfg;
    cfg.shape = {m.config.layers, m.config.heads, m.config.kv_heads, m.config.head_dim()};
    cfg.dtype = dtype;
    cfg.budget = Budget::fraction(0.25);
    cfg.local_tokens = 32;
    using Shared = KvManager<index::Hierarchical, eviction::Lookahead, Tiers<tier::HostTier>, pipeline::Serial, backend::Cpu, RedisTier>;
    using Alone = KvManager<index::Hierarchical, eviction::Lookahead>;
    const PrefixDigest digest = PrefixDigest::of_tokens(std::span<const int>(prompt).first(260));  // a shared 260-token prefix
    const auto params = [&] { return RedisTier::Params{.url = server.unix_url(), .model = model_digest(m)}; };
    RedisTier ra(params()), rb(params());
    Shared a(cfg), b(cfg);
    Alone c(cfg);
    a.share_prefixes(ra);
    b.share_prefixes(rb);
    constexpr int kChunk = 48;
    Decoder<Shared> da(m, a, pool, kChunk, digest), db(m, b, pool, kChunk, digest);
    Decoder<Alone> dc(m, c, pool, kChunk, digest);
    std::vector<float> la = da.prefill(prompt), lc = dc.prefill(prompt);
    ra.flush();
    std::vector<float> lb = db.prefill(prompt);
    CHECK(da.times().prefix_loaded_tokens == 0);
    CHECK(db.times().prefix_loaded_tokens == 240);  // 260 tokens, cut to whole 48-token chunks
    CHECK(rb.remote_stats().hits == 240u / 8 * cfg.shape.layers * cfg.shape.kv_heads);
    CHECK(test::same_bits(la, lc));
    CHECK(test::same_bits(lb, lc));
    for (int s = 0; s < 6; ++s) {
      const int next = Sampler::argmax(lc);
      CHECK(Sampler::argmax(lb) == next);
      la = da.step(next), lb = db.step(next), lc = dc.step(next);
      CHECK(test::same_bits(la, lc));
      CHECK(test::same_bits(lb, lc));
    }
  }
}

// ---- values that cannot be forged (Params::secret), a hung server, a password ----------------

namespace {
const std::string kSecretA = "deployment A: 32 bytes of secret", kSecretB = "deployment B: 32 bytes of secret";

/// A value for `key` as a client without secret A could write it: a plain checksummed value, or
/// one keyed with another secret.
std::string forged_value(const std::string& key, const std::vector<std::byte>& page, const std::string* other_secret) {
  std::vector<std::byte> v;
  if (other_secret != nullptr) {
    const tier::redis::ValueMac mac(*other_secret);
    v.resize(tier::redis::ValueMac::kHeaderBytes + page.size());
    mac.encode(key, page.data(), page.size(), v.data());
  } else {
    v.resize(tier::RemoteValue::kHeaderBytes + page.size());
    tier::RemoteValue::encode(key, page.data(), page.size(), v.data());  // the checksum recomputed: well formed
  }
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}
}  // namespace

TEST_CASE("keyed value: the HMAC binds the page to its key and the secret; the secret names a key space") {
  const auto page = page_bytes(300, 3);
  const tier::redis::ValueMac a(kSecretA), a_again(kSecretA), b(kSecretB);
  std::vector<std::byte> value(tier::redis::ValueMac::kHeaderBytes + page.size()), back(page.size());
  a.encode("k1", page.data(), page.size(), value.data());
  CHECK(a_again.decode("k1", value.data(), value.size(), back.data(), back.size()));
  CHECK(back == page);
  std::vector<std::byte> untouched(page.size(), std::byte{7});
  CHECK_FALSE(b.decode("k1", value.data(), value.size(), untouched.data(), untouched.size()));  // another secret
  CHECK_FALSE(a.decode("k2", value.data(), value.size(), untouched.data(), untouched.size()));  // another key
  for (std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{20}, tier::redis::ValueMac::kHeaderBytes + 299}) {
    auto bad = value;
    bad[at] ^= std::byte{0x10};
    CHECK_FALSE(a.decode("k1", bad.data(), bad.size(), untouched.data(), untouched.size()));
  }
  CHECK(untouched == std::vector<std::byte>(page.size(), std::byte{7}));
  CHECK(a.key_namespace() == a_again.key_namespace());
  CHECK(a.key_namespace() != b.key_namespace());
  CHECK(a.key_namespace().size() == 16);
  CHECK(a.key_namespace().find("deployment") == std::string::npos);
  CHECK_THROWS_WITH_AS(tier::redis::ValueMac("short"), doctest::Contains("at least 16"), Error);
  CHECK_THROWS_WITH_AS(RedisTier({.secret = "short"}), doctest::Contains("at least 16"), Error);
}

TEST_CASE("RedisTier with a secret: a value written without it, or with another deployment's, is a miss and never data") {
  if (!have_redis()) return;
  RedisServer server;
  constexpr std::size_t kBytes = 512;
  const PrefixDigest model{4, 4, 0};
  RedisTier a = open_tier({.url = server.url(), .model = model, .secret = kSecretA}, kBytes),
            a2 = open_tier({.url = server.url(), .model = model, .secret = kSecretA}, kBytes),
            b = open_tier({.url = server.url(), .model = model, .secret = kSecretB}, kBytes),
            plain = open_tier({.url = server.url(), .model = model}, kBytes);
  const std::vector<PrefixDigest> chain{{1, 1, 8}, {2, 2, 16}, {3, 3, 24}};
  std::vector<std::vector<std::byte>> pages;
  std::vector<tier::WriteRequest> w;
  for (std::uint32_t p = 0; p < 3; ++p) pages.push_back(page_bytes(kBytes, 10 + p));
  for (std::uint32_t p = 0; p < 3; ++p) w.push_back({PageKey{1, 0, 0, p}, pages[p].data()});
  a.publish(chain, w);
  a.flush();
  CHECK(a2.lookup(chain, 1, 1) == 3);  // the same deployment finds them
  CHECK(b.lookup(chain, 1, 1) == 0);   // another deployment's key space: not even found
  CHECK(plain.lookup(chain, 1, 1) == 0);
  // A client without the secret overwrites page 1 with a well-formed plain value, page 2 with a
  // value keyed by another secret: both are misses, and the reader's buffers keep their bytes.
  const auto evil = page_bytes(kBytes, 666);
  CHECK(server.command({"SET", a.key(chain[1], PageKey{0, 0, 0, 1}), forged_value(a.key(chain[1], PageKey{0, 0, 0, 1}), evil, nullptr)}) == "OK");
  CHECK(server.command({"SET", a.key(chain[2], PageKey{0, 0, 0, 2}), forged_value(a.key(chain[2], PageKey{0, 0, 0, 2}), evil, &kSecretB)}) == "OK");
  std::vector<std::byte> buf(3 * kBytes, std::byte{9});
  std::vector<tier::ReadRequest> reads;
  for (std::uint32_t p = 0; p < 3; ++p) reads.push_back({PageKey{5, 0, 0, p}, buf.data() + p * kBytes});
  std::vector<RemoteRead> out(3);
  a2.wait_each(a2.submit(chain, reads), out);
  CHECK(out[0] == RemoteRead::hit);
  CHECK(std::memcmp(buf.data(), pages[0].data(), kBytes) == 0);
  CHECK(out[1] == RemoteRead::corrupt);
  CHECK(out[2] == RemoteRead::corrupt);
  CHECK(std::memcmp(buf.data() + kBytes, evil.data(), kBytes) != 0);
  CHECK(std::memcmp(buf.data() + 2 * kBytes, evil.data(), kBytes) != 0);
  CHECK(a2.remote_stats().corrupt == 2);
}

TEST_CASE("a forged page on the server never reaches the decoder: the run ends before it, same logits as computing all") {
  if (!have_redis()) return;
  using namespace kvdrive::llama;
  RedisServer server;
  ThreadPool pool(2);
  const Model m =
      make_synthetic({"tiny", 4}, ShapeOverrides{.layers = 2, .heads = {}, .kv_heads = {}, .head_dim = {}, .hidden = {}, .vocab = {}}, pool);
  std::mt19937 rng(8);
  std::vector<int> prompt(200);
  for (auto& t : prompt) t = static_cast<int>(rng() % 512);
  Config cfg;
  cfg.shape = {m.config.layers, m.config.heads, m.config.kv_heads, m.config.head_dim()};
  cfg.budget = Budget::fraction(0.25);
  cfg.local_tokens = 32;
  using Shared = KvManager<index::Hierarchical, eviction::Lookahead, Tiers<tier::HostTier>, pipeline::Serial, backend::Cpu, RedisTier>;
  using Alone = KvManager<index::Hierarchical, eviction::Lookahead>;
  const auto params = [&] { return RedisTier::Params{.url = server.url(), .model = model_digest(m), .secret = kSecretA}; };
  constexpr int kChunk = 16;
  Alone c(cfg);
  Decoder<Alone> dc(m, c, pool, kChunk);
  const std::vector<float> lc = dc.prefill(prompt);
  RedisTier ra(params()), rb(params());
  Shared a(cfg), b(cfg);
  a.share_prefixes(ra);
  b.share_prefixes(rb);
  {
    Decoder<Shared> da(m, a, pool, kChunk, std::span<const int>(prompt));
    CHECK(test::same_bits(da.prefill(prompt), lc));
    ra.flush();
    // An attacker without the secret replaces page 6 of layer 1, head 0 with its own bytes, as a
    // well-formed plain value.
    const std::string key = ra.key(a.shared_chain(da.sequence())[6], PageKey{0, 1, 0, 6});
    const auto evil = page_bytes(a.config().page_bytes(), 13);
    CHECK(server.command({"SET", key, forged_value(key, evil, nullptr)}) == "OK");
  }
  Decoder<Shared> db(m, b, pool, kChunk, std::span<const int>(prompt));
  CHECK(test::same_bits(db.prefill(prompt), lc));
  CHECK(db.times().prefix_loaded_tokens == 6 * cfg.page_tokens / kChunk * kChunk);  // pages 0-5, cut to whole chunks
  CHECK(rb.remote_stats().corrupt == 1);
}

TEST_CASE("a hung server (SIGSTOP) costs at most about the timeout per call, and the output is unchanged") {
  if (!have_redis()) return;
  RedisServer server;
  constexpr std::size_t kBytes = 256;
  constexpr int kTimeoutMs = 300;
  RedisTier t = open_tier({.url = server.url(), .model = {5, 5, 0}, .timeout_ms = kTimeoutMs, .retry_after_ms = 0}, kBytes);
  const std::vector<PrefixDigest> chain{{1, 2, 8}, {3, 4, 16}};
  const auto page = page_bytes(kBytes, 1);
  const std::vector<tier::WriteRequest> w{{PageKey{1, 0, 0, 0}, page.data()}, {PageKey{1, 0, 0, 1}, page.data()}};
  t.publish(chain, w);
  t.flush();
  CHECK(t.lookup(chain, 1, 1) == 2);
  server.pause();
  const auto seconds_of = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // A call on the open connection waits one timeout; a reconnect (the retry) may wait another.
  const double bound = 2.0 * kTimeoutMs / 1000 + 0.5;
  std::uint32_t found = 99;
  CHECK(seconds_of([&] { found = t.lookup(chain, 1, 1); }) < bound);
  CHECK(found == 0);
  std::vector<std::byte> buf(kBytes, std::byte{3});
  const tier::ReadRequest r{PageKey{2, 0, 0, 0}, buf.data()};
  RemoteRead o = RemoteRead::hit;
  CHECK(seconds_of([&] { t.wait_each(t.submit(chain, std::span(&r, 1)), std::span(&o, 1)); }) < bound);
  CHECK(o == RemoteRead::error);
  CHECK(buf == std::vector<std::byte>(kBytes, std::byte{3}));
  CHECK(seconds_of([&] { t.publish(chain, w), t.flush(); }) < bound);
  server.resume();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(t.lookup(chain, 1, 1) == 2);  // back, on a new connection
}

TEST_CASE("RedisTier: AUTH with a password in the URL; a wrong or missing password is a miss, never a hang or a throw") {
  if (!have_redis()) return;
  RedisServer server({"--requirepass", "p@ss word"});
  constexpr std::size_t kBytes = 128;
  const std::string url = fmt::format("redis://:p%40ss%20word@127.0.0.1:{}/0", server.port());
  RedisTier good = open_tier({.url = url, .model = {6, 6, 0}}, kBytes);
  const std::vector<PrefixDigest> chain{{7, 7, 8}};
  const auto page = page_bytes(kBytes, 2);
  good.publish(chain, std::vector<tier::WriteRequest>{{PageKey{1, 0, 0, 0}, page.data()}});
  good.flush();
  CHECK(good.remote_stats().written == 1);
  CHECK(good.lookup(chain, 1, 1) == 1);
  for (const std::string& other : {fmt::format("redis://:wrong@127.0.0.1:{}/0", server.port()), server.url()}) {
    RedisTier t = open_tier({.url = other, .model = {6, 6, 0}, .retry_after_ms = 0}, kBytes);
    CHECK(t.lookup(chain, 1, 1) == 0);
    std::vector<std::byte> buf(kBytes);
    const tier::ReadRequest r{PageKey{2, 0, 0, 0}, buf.data()};
    RemoteRead o = RemoteRead::hit;
    t.wait_each(t.submit(chain, std::span(&r, 1)), std::span(&o, 1));
    CHECK(o == RemoteRead::error);
  }
}
