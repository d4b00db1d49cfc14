// tier::PrefixStore and chained page keys: pages stored once every stream of a page key is
// published, read back checked, kept across reopening; damaged files are misses and are
// deleted; least recently used files go first past the capacity; one process at a time; and the
// reference decoder reading a document's pages back after a "restart" with a new question after
// the document, with the same logits bit for bit as computing everything.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/prefix_store.hpp"
#include "support.hpp"
#include "workload.hpp"

#include "decoder/decoder.hpp"
#include "decoder/sampler.hpp"
#include "model/synthetic.hpp"

using namespace kvdrive;
using test::flip_byte;
using tier::PageKey;
using tier::PrefixStore;
using tier::RemoteRead;

namespace {

constexpr std::size_t kPage = 96;  // bytes per page
constexpr std::uint32_t kLayers = 2, kHeads = 3;

PrefixStore open_store(const test::TempDir& dir, std::uint64_t capacity = std::uint64_t{1} << 30, PrefixDigest model = {1, 2, 0}) {
  PrefixStore s({.dir = dir.file("store"), .model = model, .capacity_bytes = capacity});
  s.open(tier::TierGeometry{kPage, kLayers, kHeads});
  return s;
}

/// Page p of stream (layer, head) under chain key `key`: bytes nothing else has.
std::vector<std::byte> page_of(const PrefixDigest& key, std::uint32_t layer, std::uint32_t head) {
  std::vector<std::byte> b(kPage);
  std::mt19937_64 rng(key.low ^ (key.high << 7) ^ (layer * 131u + head));
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

/// Publishes every stream of pages [first, last) of the chain, layer by layer as prefill does.
void publish(PrefixStore& s, const std::vector<PrefixDigest>& chain, std::uint32_t first, std::uint32_t last, std::uint32_t layers = kLayers) {
  for (std::uint32_t l = 0; l < layers; ++l) {
    std::vector<std::vector<std::byte>> keep;
    std::vector<tier::WriteRequest> w;
    for (std::uint32_t p = first; p < last; ++p)
      for (std::uint32_t h = 0; h < kHeads; ++h) {
        keep.push_back(page_of(chain[p], l, h));
        w.push_back({PageKey{7, l, h, p}, nullptr});
      }
    for (std::size_t i = 0; i < w.size(); ++i) w[i].src = keep[i].data();
    s.publish(chain, w);
  }
}

/// Reads every stream of pages [0, n) and returns the outcomes; checks that each hit holds the
/// bytes published for it.
std::vector<RemoteRead> read_back(PrefixStore& s, const std::vector<PrefixDigest>& chain, std::uint32_t n) {
  std::vector<std::byte> buf(static_cast<std::size_t>(n) * kLayers * kHeads * kPage);
  std::vector<tier::ReadRequest> reads;
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (std::uint32_t h = 0; h < kHeads; ++h)
      for (std::uint32_t p = 0; p < n; ++p) reads.push_back({PageKey{99, l, h, p}, buf.data() + reads.size() * kPage});
  std::vector<RemoteRead> out(reads.size());
  s.wait_each(s.submit(chain, reads), out);
  for (std::size_t i = 0; i < reads.size(); ++i)
    if (out[i] == RemoteRead::hit) {
      const PageKey& k = reads[i].key;
      CHECK(std::memcmp(reads[i].dst, page_of(chain[k.page], k.layer, k.head).data(), kPage) == 0);
    }
  return out;
}

std::vector<PrefixDigest> chain_of(std::uint64_t seed, std::size_t n) {
  std::vector<PrefixDigest> c;
  for (std::size_t i = 0; i < n; ++i) c.push_back({seed * 1000 + i, seed, static_cast<std::int64_t>(i)});
  return c;
}

/// The two-layer synthetic Llama the decoder tests run.
llama::Model tiny_model(ThreadPool& pool) {
  return llama::make_synthetic({"tiny", 4},
                               llama::ShapeOverrides{.layers = 2, .heads = {}, .kv_heads = {}, .head_dim = {}, .hidden = {}, .vocab = {}}, pool);
}

/// A manager config for it: sparse at 25%, a 32-token local window.
Config tiny_config(const llama::Model& m, DType dtype) {
  Config cfg;
  cfg.shape = {m.config.layers, m.config.heads, m.config.kv_heads, m.config.head_dim()};
  cfg.dtype = dtype;
  cfg.budget = Budget::fraction(0.25);
  cfg.local_tokens = 32;
  return cfg;
}

/// `n` seeded token ids below 512.
std::vector<int> random_tokens(std::size_t n, std::mt19937& rng) {
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(rng() % 512);
  return t;
}

using Stored = KvManager<index::Hierarchical, eviction::Lookahead, Tiers<tier::HostTier>, pipeline::Serial, backend::Cpu, PrefixStore>;
using Alone = KvManager<index::Hierarchical, eviction::Lookahead>;

}  // namespace

TEST_CASE("page_chain: two prompts share exactly their common leading whole pages, and only under one layout") {
  Config cfg;
  cfg.shape = {2, 4, 2, 16};
  cfg.page_tokens = 8;
  std::vector<std::int32_t> a(50), b;
  std::iota(a.begin(), a.end(), 3);
  b = a;
  b[29] = 1000;  // page 3 (tokens 24..31) differs, and so everything after it
  b.resize(45);
  const auto ca = manager::page_chain(cfg, a), cb = manager::page_chain(cfg, b);
  REQUIRE(ca.size() == 6);  // 50 tokens: 6 whole pages (the part page has no key)
  REQUIRE(cb.size() == 5);
  for (std::size_t p = 0; p < 3; ++p) CHECK(ca[p] == cb[p]);
  for (std::size_t p = 3; p < 5; ++p) CHECK_FALSE(ca[p] == cb[p]);
  CHECK(ca[2].tokens == 24);
  for (std::size_t p = 1; p < ca.size(); ++p) CHECK_FALSE(ca[p] == ca[p - 1]);
  Config f32 = cfg;
  f32.dtype = DType::f32;
  Config pages16 = cfg;
  pages16.page_tokens = 16;
  CHECK_FALSE(manager::page_chain(f32, a)[0] == ca[0]);
  CHECK_FALSE(manager::page_chain(pages16, a)[0] == manager::page_chain(cfg, a)[1]);
  // The same tokens moved by one page are other keys: a key names its position too.
  const std::vector<std::int32_t> shifted(a.begin() + 8, a.end());
  CHECK_FALSE(manager::page_chain(cfg, shifted)[0] == ca[1]);
}

TEST_CASE("PrefixStore: a page key is stored once all its streams are published, read back checked, and kept across reopening") {
  test::TempDir dir;
  const auto chain = chain_of(1, 4);
  {
    PrefixStore s = open_store(dir);
    publish(s, chain, 0, 3, 1);  // layer 0 only: nothing complete yet
    CHECK(s.lookup(chain, kLayers, kHeads) == 0);
    CHECK(s.stored_keys() == 0);
    publish(s, chain, 0, 3);  // every layer
    CHECK(s.lookup(chain, kLayers, kHeads) == 3);
    CHECK(s.stored_keys() == 3);
    const auto out = read_back(s, chain, 4);
    for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == (i % 4 < 3 ? RemoteRead::hit : RemoteRead::missing));
    CHECK(s.remote_stats().hits == 3 * kLayers * kHeads);
    CHECK(s.remote_stats().written == 3 * kLayers * kHeads);
  }
  PrefixStore s = open_store(dir);  // a restart
  CHECK(s.stored_keys() == 3);
  CHECK(s.lookup(chain, kLayers, kHeads) == 3);
  for (RemoteRead r : read_back(s, std::vector<PrefixDigest>(chain.begin(), chain.begin() + 3), 3)) CHECK(r == RemoteRead::hit);
  auto parted = chain;
  parted[1] = {5, 5, 0};
  CHECK(s.lookup(parted, kLayers, kHeads) == 1);
  CHECK(s.lookup(chain_of(2, 3), kLayers, kHeads) == 0);
  CHECK(s.lookup(chain, kLayers + 1, kHeads) == 0);  // more layers than a page key holds
  // The files are private to the user, and another model's store in the same folder sees nothing.
  CHECK((std::filesystem::status(s.file_path(chain[0])).permissions() & std::filesystem::perms::group_read) == std::filesystem::perms::none);
}

TEST_CASE("PrefixStore: another model's pages are never found in the same folder") {
  test::TempDir dir;
  const auto chain = chain_of(3, 2);
  {
    PrefixStore a = open_store(dir, std::uint64_t{1} << 30, {1, 2, 0});
    publish(a, chain, 0, 2);
  }
  PrefixStore b = open_store(dir, std::uint64_t{1} << 30, {9, 9, 0});
  CHECK(b.stored_keys() == 2);  // the folder's files, any model's
  CHECK(b.lookup(chain, kLayers, kHeads) == 0);
  for (RemoteRead r : read_back(b, chain, 2)) CHECK(r == RemoteRead::missing);
}

TEST_CASE("PrefixStore: a damaged file is a miss, never data; it is deleted, and the page key is stored again") {
  test::TempDir dir;
  const auto chain = chain_of(4, 3);
  PrefixStore s = open_store(dir);
  publish(s, chain, 0, 3);
  const std::uint64_t header = 64 + kLayers * kHeads * 8;
  SUBCASE("a flipped bit in a page") { flip_byte(s.file_path(chain[1]), header + kPage * 4 + 17); }
  SUBCASE("a flipped bit in a page's checksum") { flip_byte(s.file_path(chain[1]), 64 + 8 * 5); }
  SUBCASE("a flipped bit in the header") { flip_byte(s.file_path(chain[1]), 20); }
  SUBCASE("a short file") { std::filesystem::resize_file(s.file_path(chain[1]), header + kPage * 2); }
  const auto out = read_back(s, chain, 3);
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == (i % 3 == 1 ? RemoteRead::corrupt : RemoteRead::hit));
  CHECK(s.remote_stats().corrupt == kLayers * kHeads);
  CHECK_FALSE(std::filesystem::exists(s.file_path(chain[1])));
  CHECK(s.lookup(chain, kLayers, kHeads) == 1);
  publish(s, chain, 0, 3);  // the next prefill of the same prompt stores it again
  CHECK(s.lookup(chain, kLayers, kHeads) == 3);
  for (RemoteRead r : read_back(s, chain, 3)) CHECK(r == RemoteRead::hit);
}

TEST_CASE("PrefixStore: past its capacity the least recently used files go first, in an order kept across reopening") {
  test::TempDir dir;
  const std::uint64_t file = 64 + kLayers * kHeads * (8 + kPage);
  const auto a = chain_of(10, 1), b = chain_of(11, 1), c = chain_of(12, 1), d = chain_of(13, 1), e = chain_of(14, 1);
  {
    PrefixStore s = open_store(dir, 3 * file);
    publish(s, a, 0, 1);
    publish(s, b, 0, 1);
    publish(s, c, 0, 1);
    CHECK(s.stored_bytes() == 3 * file);
    CHECK(read_back(s, a, 1)[0] == RemoteRead::hit);  // a is now the most recently used
    publish(s, d, 0, 1);                              // b goes
    CHECK(s.evicted() == 1);
    CHECK(s.lookup(b, kLayers, kHeads) == 0);
    CHECK(s.lookup(a, kLayers, kHeads) == 1);
    CHECK(s.stored_bytes() == 3 * file);
  }
  PrefixStore s = open_store(dir, 3 * file);
  CHECK(s.stored_bytes() == 3 * file);
  publish(s, e, 0, 1);  // c is the least recently used now
  CHECK(s.lookup(c, kLayers, kHeads) == 0);
  CHECK(s.lookup(a, kLayers, kHeads) == 1);
  CHECK(s.lookup(d, kLayers, kHeads) == 1);
  CHECK(s.lookup(e, kLayers, kHeads) == 1);
  // A page key larger than the whole capacity is not stored, and nothing is evicted for it.
  PrefixStore tiny({.dir = dir.file("tiny"), .model = {1, 2, 0}, .capacity_bytes = file - 1});
  tiny.open(tier::TierGeometry{kPage, kLayers, kHeads});
  publish(tiny, a, 0, 1);
  CHECK(tiny.stored_keys() == 0);
  CHECK(tiny.remote_stats().over_budget == kLayers * kHeads);
}

TEST_CASE("PrefixStore: a prompt larger than the capacity keeps the leading pages that fit; it evicts others', never its own") {
  test::TempDir dir;
  const std::uint64_t file = 64 + kLayers * kHeads * (8 + kPage);
  const auto old = chain_of(20, 1), doc = chain_of(21, 6);
  std::optional<PrefixStore> opened(open_store(dir, 3 * file));
  PrefixStore& s = *opened;
  publish(s, old, 0, 1);
  publish(s, doc, 0, 2);  // prefill's first chunk
  publish(s, doc, 2, 6);  // the rest: page 2 evicts the old prompt, pages 3..5 find only the document's own
  CHECK(s.lookup(old, kLayers, kHeads) == 0);
  CHECK(s.evicted() == 1);
  CHECK(s.lookup(doc, kLayers, kHeads) == 3);
  const auto out = read_back(s, doc, 6);
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == (i % 6 < 3 ? RemoteRead::hit : RemoteRead::missing));
  CHECK(s.remote_stats().over_budget == 3 * kLayers * kHeads);
  CHECK(s.stored_bytes() == 3 * file);
  // Another prompt takes the space of the document's tail, never its head: a page is of no use
  // without the pages before it, so a run is marked used last page first (when stored and read).
  const auto next = chain_of(22, 1);
  publish(s, next, 0, 1);
  CHECK(s.lookup(next, kLayers, kHeads) == 1);
  CHECK(s.lookup(doc, kLayers, kHeads) == 2);
  publish(s, chain_of(23, 1), 0, 1);
  CHECK(s.lookup(doc, kLayers, kHeads) == 1);
  // The order holds across reopening too (it is kept in the files' mtimes): the head goes last.
  opened.reset();
  PrefixStore again = open_store(dir, 3 * file);
  publish(again, chain_of(24, 1), 0, 1);
  CHECK(again.lookup(doc, kLayers, kHeads) == 0);
  CHECK(again.lookup(next, kLayers, kHeads) == 1);
}

TEST_CASE("PrefixStore: one process at a time; a crash's temporaries are deleted, other files left alone") {
  test::TempDir dir;
  const std::string folder = dir.file("store");
  {
    PrefixStore s = open_store(dir);
    CHECK_THROWS_WITH_AS(PrefixStore({.dir = folder, .model = {1, 2, 0}}), doctest::Contains("in use by this process"), Error);
    const pid_t child = ::fork();
    if (child == 0) {  // the store is held by the parent: the child is refused, naming it
      bool refused = false;
      try {
        PrefixStore other({.dir = folder, .model = {1, 2, 0}});
      } catch (const Error& e) {
        refused = std::string(e.what()).find(fmt::format("in use by process {}", ::getppid())) != std::string::npos;
      }
      ::_exit(refused ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  { std::ofstream(folder + "/.tmp-1-1") << "half a file"; }
  { std::ofstream(folder + "/notes.txt") << "mine"; }
  PrefixStore s = open_store(dir);  // the first one closed: this one gets the lock
  CHECK_FALSE(std::filesystem::exists(folder + "/.tmp-1-1"));
  CHECK(std::filesystem::exists(folder + "/notes.txt"));
  CHECK_THROWS_WITH_AS(PrefixStore({.dir = dir.file("missing/store"), .model = {1, 2, 0}}), doctest::Contains("cannot make the folder"), Error);
  CHECK_THROWS_WITH_AS(PrefixStore({.dir = dir.file("m"), .model = {}}), doctest::Contains("no model digest"), Error);
}

TEST_CASE("a document with a new question reads the document's pages from the store after a restart: same logits as computing all") {
  using namespace kvdrive::llama;
  ThreadPool pool(2);
  const Model m = tiny_model(pool);
  std::mt19937 rng(5);
  const std::vector<int> doc = random_tokens(300, rng), q1 = random_tokens(21, rng), q2 = random_tokens(26, rng);
  std::vector<int> first = doc, second = doc;
  first.insert(first.end(), q1.begin(), q1.end());
  second.insert(second.end(), q2.begin(), q2.end());
  for (DType dtype : {DType::f16, DType::f32}) {
    CAPTURE(dtype_name(dtype));
    test::TempDir dir;
    const Config cfg = tiny_config(m, dtype);
    const PrefixStore::Params params{.dir = dir.file("prefixes"), .model = model_digest(m)};
    constexpr int kChunk = 48;
    const int pt = cfg.page_tokens;
    {  // the first run: the document and a first question, stored as prefill goes
      PrefixStore store(params);
      Stored kv(cfg);
      kv.share_prefixes(store);
      Decoder<Stored> d(m, kv, pool, kChunk, std::span<const int>(first));
      d.prefill(first);
      CHECK(d.times().prefix_loaded_tokens == 0);
      CHECK(store.remote_stats().written == static_cast<std::uint64_t>(first.size() / pt) * cfg.shape.layers * cfg.shape.kv_heads);
    }
    // The restart: a new store object over the folder, a new manager, a new question.
    PrefixStore store(params);
    Stored kv(cfg);
    kv.share_prefixes(store);
    Alone cold_kv(cfg);
    Decoder<Stored> warm(m, kv, pool, kChunk, std::span<const int>(second));
    Decoder<Alone> cold(m, cold_kv, pool, kChunk);
    std::vector<float> lw = warm.prefill(second), lc = cold.prefill(second);
    // The document's whole pages, cut to whole 48-token chunks.
    const std::int64_t expect = static_cast<std::int64_t>(doc.size()) / pt * pt / kChunk * kChunk;
    CHECK(warm.times().prefix_loaded_tokens == expect);
    CHECK(store.remote_stats().hits == static_cast<std::uint64_t>(expect / pt) * cfg.shape.layers * cfg.shape.kv_heads);
    CHECK(test::same_bits(lw, lc));
    for (int s = 0; s < 6; ++s) {
      const int next = Sampler::argmax(lc);
      CHECK(Sampler::argmax(lw) == next);
      lw = warm.step(next), lc = cold.step(next);
      CHECK(test::same_bits(lw, lc));
    }
  }
}

TEST_CASE("a damaged page file in the document's run ends the run there: the rest is computed, same logits, and stored again") {
  using namespace kvdrive::llama;
  ThreadPool pool(2);
  const Model m = tiny_model(pool);
  std::mt19937 rng(6);
  const std::vector<int> prompt = random_tokens(200, rng);
  test::TempDir dir;
  const Config cfg = tiny_config(m, DType::f16);
  const PrefixStore::Params params{.dir = dir.file("prefixes"), .model = model_digest(m)};
  constexpr int kChunk = 16;
  Alone cold_kv(cfg);
  Decoder<Alone> cold(m, cold_kv, pool, kChunk);
  const std::vector<float> lc = cold.prefill(prompt);
  const auto run = [&](std::int64_t expect_loaded) {
    PrefixStore store(params);
    Stored kv(cfg);
    kv.share_prefixes(store);
    Decoder<Stored> d(m, kv, pool, kChunk, std::span<const int>(prompt));
    CHECK(test::same_bits(d.prefill(prompt), lc));
    CHECK(d.times().prefix_loaded_tokens == expect_loaded);
    return manager::page_chain(kv.config(), prompt);
  };
  const auto chain = run(0);
  {
    PrefixStore peek(params);
    flip_byte(peek.file_path(chain[5]), 64 + 8 * 6 + 100);  // page 5, some stream's bytes
  }
  run(5 * cfg.page_tokens / kChunk * kChunk);  // pages 0-4 good (cut to whole chunks), 5 on computed, 5 stored again
  run(static_cast<std::int64_t>(prompt.size() - 1) / cfg.page_tokens * cfg.page_tokens);  // the whole run but the last token's page
}
