// SsdTier: round trips through both I/O engines, extents and merged reads, durability across
// reopen (puts, overwrites, erases), torn log blocks, and every bad input of the storage issue
// that this tier handles: not a store, another page size or version, a flipped bit, a short
// read, a full store; each file operation failing (through the File seam, fault_file.hpp), a
// killed writer and a power loss. Each test works in its own temporary directory and removes
// it. The test_ssd_mutant_* builds run these tests on a defective store (ssd_mutants.hpp).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/mmap.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "fault_file.hpp"
#include "fault_tier.hpp"
#include "ssd_mutants.hpp"
#include "support.hpp"

using namespace kvdrive;
using namespace kvdrive::tier;

namespace {

using test::flip_byte;
using test::TempDir;
/// SsdTier, or in the test_ssd_mutant_* builds the mutant (ssd_mutants.hpp).
using Ssd = test::StoreUnderTest<>;

std::vector<std::byte> page_bytes_of(std::size_t bytes, const PageKey& k, int version = 0) {
  std::vector<std::byte> p(bytes);
  std::mt19937_64 rng(k.sequence * 1000003 + k.layer * 7919 + k.head * 104729 + k.page * 15485863 + static_cast<std::uint64_t>(version));
  for (auto& b : p) b = static_cast<std::byte>(rng() & 0xff);
  return p;
}

Ssd::Params params(const std::string& path, IoBackend io = IoBackend::automatic) {
  Ssd::Params p;
  p.path = path;
  p.alignment = 4096;  // forced, as the issue asks of tests
  p.io = io;
  p.extent_pages = 8;
  return p;
}

template <class Store>
std::vector<std::byte> read_one(Store& t, const PageKey& k, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  const ReadRequest r{k, out.data()};
  t.wait(t.submit(std::span<const ReadRequest>(&r, 1)));
  return out;
}

/// A batch of page versions ready for write_batch: each page's bytes (page_bytes_of) and its request.
struct VersionBatch {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<WriteRequest> reqs;

  template <class KeyOf>
  VersionBatch(const std::map<std::uint32_t, int>& pages, KeyOf&& key, std::size_t page_size = 4096) {
    for (const auto& [page, version] : pages) bytes.push_back(page_bytes_of(page_size, key(page), version));
    std::size_t i = 0;
    for (const auto& [page, version] : pages) reqs.push_back({key(page), bytes[i++].data()});
  }
};

/// Picks one entry of a non-empty map at random.
template <class Map>
auto pick(Map& m, std::mt19937_64& rng) {
  auto it = m.begin();
  std::advance(it, static_cast<long>(rng() % m.size()));
  return it;
}

}  // namespace

TEST_CASE("SsdTier: pages round-trip through both I/O engines, in any batch order") {
  for (IoBackend io : {IoBackend::automatic, IoBackend::threads}) {
    for (std::size_t page_bytes : {std::size_t{4096}, std::size_t{1000}}) {
      CAPTURE(page_bytes);
      TempDir dir;
      Ssd t(params(dir.file("store"), io));
      t.open({page_bytes});
      MESSAGE("SsdTier I/O: " << std::string(t.io_name())
                              << (t.direct_io() ? std::string(", O_DIRECT") : std::string(", buffered (O_DIRECT refused)")));
      CHECK(t.slot_bytes() == (page_bytes == 4096 ? 4096u : 1008u));  // 1000 bytes: packed, 16-byte slots, 4 to a block
      CHECK(t.pages_per_block() == (page_bytes == 4096 ? 1u : 4u));
      std::vector<PageKey> keys;
      std::vector<WriteRequest> batch;
      std::vector<std::vector<std::byte>> data;
      for (std::uint32_t s = 0; s < 3; ++s)
        for (std::uint32_t page = 0; page < 40; ++page) keys.push_back({1, s, s % 2, page});
      data.reserve(keys.size());
      for (const PageKey& k : keys) {
        data.push_back(page_bytes_of(page_bytes, k));
        batch.push_back({k, data.back().data()});
      }
      t.write_batch(std::span<const WriteRequest>(batch.data(), 60));
      for (std::size_t i = 60; i < keys.size(); ++i) t.write(keys[i], data[i].data());
      CHECK(t.stored_pages() == keys.size());
      // A shuffled batch reads back exactly.
      std::vector<std::size_t> order(keys.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), std::mt19937_64(3));
      std::vector<std::vector<std::byte>> out(keys.size(), std::vector<std::byte>(page_bytes));
      std::vector<ReadRequest> reads;
      for (std::size_t i : order) reads.push_back({keys[i], out[i].data()});
      t.wait(t.submit(reads));
      for (std::size_t i = 0; i < keys.size(); ++i) CHECK(out[i] == data[i]);
    }
  }
}

TEST_CASE("SsdTier: a stream's pages take adjacent slots, and adjacent reads merge") {
  TempDir dir;
  Ssd::Params p = params(dir.file("store"));
  p.extent_pages = 16;
  p.max_merge_bytes = 8 * 4096;
  Ssd t(p);
  t.open({4096});
  std::vector<std::byte> buf(4096);
  for (std::uint32_t page = 0; page < 16; ++page) {
    t.write({7, 2, 1, page}, page_bytes_of(4096, {7, 2, 1, page}).data());
    t.write({7, 2, 0, page}, page_bytes_of(4096, {7, 2, 0, page}).data());  // another stream, interleaved
  }
  for (std::uint32_t page = 1; page < 16; ++page) CHECK(t.slot_of({7, 2, 1, page}) == t.slot_of({7, 2, 1, page - 1}) + 1);
  // Pages 0..11 of one stream: 12 adjacent slots, merged into I/Os of at most 8 slots: 2 reads.
  std::vector<std::vector<std::byte>> out(12, std::vector<std::byte>(4096));
  std::vector<ReadRequest> reads;
  for (std::uint32_t page = 0; page < 12; ++page) reads.push_back({{7, 2, 1, page}, out[page].data()});
  const std::uint64_t before = t.read_ops();
  t.wait(t.submit(reads));
  CHECK(t.read_ops() - before == 2);
  for (std::uint32_t page = 0; page < 12; ++page) CHECK(out[page] == page_bytes_of(4096, {7, 2, 1, page}));
}

TEST_CASE("SsdTier: merged reads go straight into aligned caller buffers (readv), verified there") {
  for (IoBackend io : {IoBackend::automatic, IoBackend::threads}) {
    TempDir dir;
    Ssd::Params p = params(dir.file("store"), io);
    p.extent_pages = 16;
    p.max_merge_bytes = 8 * 4096;
    Ssd t(p);
    t.open({4096});
    for (std::uint32_t page = 0; page < 12; ++page) t.write({7, 2, 1, page}, page_bytes_of(4096, {7, 2, 1, page}).data());
    // Aligned buffers, scattered in memory and in reverse order of the slots.
    void* mem = nullptr;
    REQUIRE(::posix_memalign(&mem, 4096, 24 * 4096) == 0);
    std::unique_ptr<std::byte, decltype(&std::free)> arena(static_cast<std::byte*>(mem), &std::free);
    std::vector<ReadRequest> reads;
    for (std::uint32_t page = 0; page < 12; ++page) reads.push_back({{7, 2, 1, page}, arena.get() + (23 - 2 * page) * 4096});
    const std::uint64_t ops = t.read_ops(), scattered = t.scattered_ops();
    t.wait(t.submit(reads));
    CHECK(t.read_ops() - ops == 2);
    CHECK(t.scattered_ops() - scattered == 2);
    for (std::uint32_t page = 0; page < 12; ++page) CHECK(std::memcmp(reads[page].dst, page_bytes_of(4096, {7, 2, 1, page}).data(), 4096) == 0);
    // A buffer that is not aligned sends the batch through the bounce buffer (under O_DIRECT).
    reads[5].dst = arena.get() + 12 * 4096 + 8;
    t.wait(t.submit(reads));
    CHECK(t.scattered_ops() - scattered == (t.direct_io() ? 2 : 4));
    CHECK(std::memcmp(reads[5].dst, page_bytes_of(4096, {7, 2, 1, 5}).data(), 4096) == 0);
    // A flipped bit is caught in the caller's buffer too.
    flip_byte(dir.file("store"), t.slot_offset(t.slot_of({7, 2, 1, 3})) + 100);
    reads[5].dst = arena.get() + 13 * 4096;
    CHECK_THROWS_WITH_AS(t.wait(t.submit(reads)), doctest::Contains("checksum mismatch on page"), Error);
  }
}

TEST_CASE(
    "SsdTier: small pages are packed several to a block; a batch fills fresh blocks in its order; a block holding pages is never written again") {
  constexpr std::size_t kPage = 1000;  // 1008-byte slots, four to a 4 KiB block
  const auto key = [](std::uint32_t page) { return PageKey{1, 0, 0, page}; };
  const auto read_all = [&](Ssd& t, const std::vector<std::uint32_t>& pages) {
    std::vector<std::vector<std::byte>> out(pages.size(), std::vector<std::byte>(kPage));
    std::vector<ReadRequest> reads;
    for (std::size_t i = 0; i < pages.size(); ++i) reads.push_back({key(pages[i]), out[i].data()});
    t.wait(t.submit(reads));
    for (std::size_t i = 0; i < pages.size(); ++i) CHECK(out[i] == page_bytes_of(kPage, key(pages[i])));
  };
  TempDir dir;
  Ssd::Params p = params(dir.file("store"));
  p.capacity_pages = 10;  // three blocks
  {
    Ssd t(p);
    t.open({kPage});
    REQUIRE(t.slot_bytes() == 1008);
    REQUIRE(t.pages_per_block() == 4);
    CHECK(t.free_pages() == 10);
    // One batch, not in page order: its pages take slots 0..5 in the batch's order (blocks 0 and 1).
    const std::vector<std::uint32_t> order = {5, 3, 0, 4, 1, 2};
    std::vector<std::vector<std::byte>> bytes;
    std::vector<WriteRequest> batch;
    for (std::uint32_t page : order) bytes.push_back(page_bytes_of(kPage, key(page)));
    for (std::size_t i = 0; i < order.size(); ++i) batch.push_back({key(order[i]), bytes[i].data()});
    t.write_batch(batch);
    for (std::size_t i = 0; i < order.size(); ++i) CHECK(t.slot_of(key(order[i])) == i);
    CHECK(t.slot_offset(5) == 4096 + 4096 + 1008);  // the header block, block 0, then slot 1 of block 1
    CHECK(t.free_pages() == 4);                     // block 1 holds pages: its two free slots are not usable
    // The next write goes to a fresh block, not into block 1's free slots.
    t.write(key(6), page_bytes_of(kPage, key(6)).data());
    CHECK(t.slot_of(key(6)) == 8);
    CHECK(t.free_pages() == 0);
    CHECK_THROWS_WITH_AS(t.write(key(7), page_bytes_of(kPage, key(7)).data()), doctest::Contains("full"), Error);
    // The four pages of block 0 come in one read of one block; all seven in one merged read.
    std::uint64_t ops = t.read_ops(), device = t.device_bytes_read(), logical = t.page_bytes_read();
    read_all(t, {4, 0, 3, 5});
    CHECK(t.read_ops() - ops == 1);
    CHECK(t.device_bytes_read() - device == 4096);
    CHECK(t.page_bytes_read() - logical == 4 * kPage);
    ops = t.read_ops(), device = t.device_bytes_read();
    read_all(t, {0, 1, 2, 3, 4, 5, 6});
    CHECK(t.read_ops() - ops == 1);
    CHECK(t.device_bytes_read() - device == 3 * 4096);
    // A block is free only once no page lives in it: erasing one page of block 0 frees nothing,
    // erasing block 2's only page frees block 2 (once durable), and the next batch reuses it.
    t.erase(key(0));
    t.erase(key(6));
    CHECK(t.free_pages() == 4);
    t.sync();
    t.write(key(7), page_bytes_of(kPage, key(7)).data());
    CHECK(t.slot_of(key(7)) == 8);
    // A flipped bit in one packed page is an error naming it; its block's other pages read fine.
    flip_byte(dir.file("store"), t.slot_offset(t.slot_of(key(3))) + 10);
    CHECK_THROWS_WITH_AS(read_all(t, {3}), doctest::Contains("checksum mismatch on page (seq 1, layer 0, head 0, page 3)"), Error);
    read_all(t, {5, 4});
    flip_byte(dir.file("store"), t.slot_offset(t.slot_of(key(3))) + 10);  // back as it was
  }
  // Reopened: the same slots, the same room, the blocks that hold pages still untouched.
  Ssd t(p);
  t.open({kPage});
  CHECK(t.pages_per_block() == 4);
  CHECK(t.stored_pages() == 6);
  CHECK(t.slot_of(key(2)) == 5);
  CHECK(t.free_pages() == 0);
  read_all(t, {1, 2, 3, 4, 5, 7});
  t.erase(key(7));
  t.sync();
  t.write(key(8), page_bytes_of(kPage, key(8)).data());
  CHECK(t.slot_of(key(8)) == 8);
  read_all(t, {1, 2, 3, 4, 5, 8});
}

TEST_CASE("SsdTier: pack_pages = false keeps a slot of whole blocks per page") {
  TempDir dir;
  Ssd::Params p = params(dir.file("store"));
  p.pack_pages = false;
  Ssd t(p);
  t.open({1000});
  CHECK(t.slot_bytes() == 4096);
  CHECK(t.pages_per_block() == 1);
  const PageKey k{1, 0, 0, 0};
  t.write(k, page_bytes_of(1000, k).data());
  CHECK(read_one(t, k, 1000) == page_bytes_of(1000, k));
  CHECK(t.device_bytes_read() == 4096);
}

TEST_CASE("SsdTier: reads into registered memory are io_uring fixed reads; KvManager registers its fast tier") {
  TempDir dir;
  Ssd t(params(dir.file("store")));
  t.open({4096});
  for (std::uint32_t page = 0; page < 16; ++page) t.write({1, 0, 0, page}, page_bytes_of(4096, {1, 0, 0, page}).data());
  void* mem = nullptr;
  REQUIRE(::posix_memalign(&mem, 4096, 16 * 4096) == 0);
  std::unique_ptr<std::byte, decltype(&std::free)> arena(static_cast<std::byte*>(mem), &std::free);
  const bool registered = t.register_memory(arena.get(), 16 * 4096);
  if (!registered) MESSAGE("io_uring buffer registration is unavailable here (" << std::string(t.io_name()) << "): checking the fallback");
  CHECK(t.registered_bytes() == (registered ? 16 * 4096 : 0));
  // Pages 0, 2, 4, ... (slots in write order): no two adjacent, so each is a single-page read.
  std::vector<ReadRequest> reads;
  for (std::uint32_t page = 0; page < 8; ++page) reads.push_back({{1, 0, 0, 2 * page}, arena.get() + (15 - page) * 4096});
  const std::uint64_t ops = t.read_ops();
  t.wait(t.submit(reads));
  CHECK(t.read_ops() - ops == 8);
  CHECK(t.fixed_reads() == (registered ? 8u : 0u));
  for (std::uint32_t page = 0; page < 8; ++page) CHECK(std::memcmp(reads[page].dst, page_bytes_of(4096, {1, 0, 0, 2 * page}).data(), 4096) == 0);
  // A buffer outside the registered memory reads as before.
  std::vector<std::byte> other = read_one(t, {1, 0, 0, 6}, 4096);
  CHECK(other == page_bytes_of(4096, {1, 0, 0, 6}));

  // Behind KvManager, the fast tier's pool is registered as it grows, and misses land in it.
  Config c;
  c.shape = {1, 2, 1, 64};
  c.page_tokens = 16;
  c.local_tokens = 16;
  c.budget = Budget::pages(2);
  using SsdTiers = Tiers<HostTier, Ssd>;
  KvManager<index::Quest, eviction::Lookahead, SsdTiers> kv(c, {}, eviction::Lookahead{0}, SsdTiers(HostTier{}, Ssd(params(dir.file("kv")))));
  const SeqId id = kv.add_sequence();
  const int d = 64, prompt = 400;
  const auto k = test::random_floats(static_cast<std::size_t>(prompt) * d, 1), v = test::random_floats(k.size(), 2);
  kv.prefill(id, 0, make_view(k, prompt, 1, d), make_view(v, prompt, 1, d));
  const SeqId batch[] = {id};
  for (int step = 0; step < 4; ++step) {
    const auto q = test::random_floats(2 * d, 10 + step), kn = test::random_floats(d, 20 + step), vn = test::random_floats(d, 30 + step);
    std::vector<float> out(2 * d);
    kv.attend(0, batch, make_view(q, 1, 2, d), make_view(kn, 1, 1, d), make_view(vn, 1, 1, d), make_view(out, 1, 2, d));
  }
  const Ssd& ssd = kv.tiers().get<1>();
  CHECK(kv.total_stats().misses > 0);
  if (registered) {
    CHECK(ssd.registered_bytes() > 0);
    CHECK(ssd.fixed_reads() > 0);  // staged misses land in registered fast-tier slots
  }
}

TEST_CASE("SsdTier: a reopened store has every page the log committed, and nothing else") {
  TempDir dir;
  const std::string path = dir.file("store");
  const PageKey a{1, 0, 0, 0}, b{1, 0, 0, 1}, c{2, 3, 1, 9}, d{2, 3, 1, 10};
  {
    Ssd t(params(path));
    t.open({4096});
    t.write(a, page_bytes_of(4096, a).data());
    t.write(b, page_bytes_of(4096, b).data());
    t.write(c, page_bytes_of(4096, c).data());
    t.write(b, page_bytes_of(4096, b, 1).data());  // an overwrite: the new bytes win
    t.erase(a);                                    // durable with the next write
    t.write(d, page_bytes_of(4096, d).data());
    t.erase(c);
    t.sync();
  }
  {
    Ssd t(params(path));
    t.open({4096});
    CHECK(!t.contains(a));
    CHECK(!t.contains(c));
    CHECK(t.stored_pages() == 2);
    CHECK(read_one(t, b, 4096) == page_bytes_of(4096, b, 1));
    CHECK(read_one(t, d, 4096) == page_bytes_of(4096, d));
    // Freed slots are reused, and the store keeps working across a second reopen.
    t.write(a, page_bytes_of(4096, a, 2).data());
  }
  Ssd t(params(path));
  t.open({4096});
  CHECK(read_one(t, a, 4096) == page_bytes_of(4096, a, 2));
  CHECK(read_one(t, b, 4096) == page_bytes_of(4096, b, 1));
}

TEST_CASE("SsdTier: a store whose making was cut short opens as an empty store; a file that is not a store is still refused") {
  // A writer killed while it made the store leaves the data file (empty, or with its header) and
  // an empty or missing log: no page was committed, so the next writer finishes making it. (The
  // kill test found this: such a store could never be opened again.)
  TempDir dir;
  const std::string path = dir.file("store");
  const PageKey a{1, 0, 0, 0};
  auto finishes = [&](const char* what) {
    CAPTURE(what);
    {
      Ssd t(params(path));
      t.open({4096});
      CHECK(t.stored_pages() == 0);
      CHECK(t.recovery().why.find("making was cut short") != std::string::npos);
      t.write(a, page_bytes_of(4096, a).data());
    }
    Ssd t(params(path));
    t.open({4096});
    CHECK(t.stored_pages() == 1);
    CHECK(read_one(t, a, 4096) == page_bytes_of(4096, a));
  };
  SUBCASE("both files empty") {
    { std::ofstream(path, std::ios::binary); }
    { std::ofstream(path + ".log", std::ios::binary); }
    Ssd::Params ro = params(path);
    ro.mode = SsdOpen::read_only;
    Ssd r(ro);
    CHECK_THROWS_WITH_AS(r.open({4096}), doctest::Contains("making was cut short"), Error);
    finishes("both files empty");
  }
  SUBCASE("the data file's header written, the log empty or missing") {
    {
      Ssd t(params(path));
      t.open({4096});
    }
    REQUIRE(::truncate((path + ".log").c_str(), 0) == 0);
    finishes("log empty");
    SsdTier::remove_files(path);
    {
      Ssd t(params(path));
      t.open({4096});
    }
    std::filesystem::remove(path + ".log");
    finishes("log missing");
  }
  SUBCASE("a file that is not a store, with no log: refused and left as it was") {
    { std::ofstream(path) << "notes"; }
    Ssd t(params(path));
    CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains("is not a kvdrive store"), Error);
    std::ifstream f(path);
    std::string text;
    f >> text;
    CHECK(text == "notes");
    CHECK_FALSE(std::filesystem::exists(path + ".log"));  // nothing made beside it
  }
}

TEST_CASE("SsdTier: a torn last log block loses only its own records") {
  TempDir dir;
  const std::string path = dir.file("store");
  const PageKey a{1, 0, 0, 0}, b{1, 0, 0, 1}, c{1, 0, 0, 2};
  {
    Ssd t(params(path));
    t.open({4096});
    t.write(a, page_bytes_of(4096, a).data());  // log block 1
    t.write(b, page_bytes_of(4096, b).data());  // log block 2
  }
  // Tear block 2 (the last): garbage over the second half of its first record.
  flip_byte(path + ".log", 2 * 4096 + 40);
  {
    Ssd t(params(path));
    t.open({4096});
    CHECK(t.contains(a));
    CHECK(!t.contains(b));
    // Recovery says what it dropped: block 2 (4096 bytes), whose one record is the damaged one.
    const auto r = t.recovery();
    CHECK(r.replayed_records == 1);
    CHECK(r.dropped_bytes == 4096);
    CHECK(r.dropped_records == 0);
    CHECK(r.why.find("checksum fails") != std::string::npos);
    t.write(c, page_bytes_of(4096, c).data());  // reuses the torn block's place in the log
  }
  Ssd t(params(path));
  t.open({4096});
  CHECK(t.recovery().replayed_records == 2);
  CHECK(t.recovery().dropped_bytes == 0);
  CHECK(t.recovery().why == "the end of the log");
  CHECK(read_one(t, a, 4096) == page_bytes_of(4096, a));
  CHECK(read_one(t, c, 4096) == page_bytes_of(4096, c));
  CHECK(!t.contains(b));
}

TEST_CASE("SsdTier: bad stores, flipped bits, short reads and a full store give clear errors") {
  TempDir dir;
  SUBCASE("a file that is not a store") {
    { std::ofstream(dir.file("junk")) << std::string(8192, 'x'); }
    { std::ofstream(dir.file("junk.log")) << std::string(8192, 'x'); }
    Ssd t(params(dir.file("junk")));
    CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains("is not a kvdrive store"), Error);
  }
  SUBCASE("another page size") {
    {
      Ssd t(params(dir.file("store")));
      t.open({4096});
      t.write({1, 0, 0, 0}, page_bytes_of(4096, {1, 0, 0, 0}).data());
    }
    Ssd t(params(dir.file("store")));
    CHECK_THROWS_WITH_AS(t.open({2048}), doctest::Contains("another model shape or page size"), Error);
  }
  SUBCASE("another format version") {
    {
      Ssd t(params(dir.file("store")));
      t.open({4096});
    }
    // Rewrite the version with a valid header checksum: the version check, not the checksum, refuses it.
    ssd_format::Header h;
    {
      std::ifstream f(dir.file("store"), std::ios::binary);
      f.read(reinterpret_cast<char*>(&h), sizeof h);
    }
    h.version = 99;
    h.checksum = h.compute_checksum();
    {
      std::fstream f(dir.file("store"), std::ios::binary | std::ios::in | std::ios::out);
      f.write(reinterpret_cast<const char*>(&h), sizeof h);
    }
    Ssd t(params(dir.file("store")));
    CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains("format version 99"), Error);
  }
  SUBCASE("a version-1 store (made before packing) still opens and reads") {
    const PageKey k{1, 0, 0, 0};
    {
      Ssd t(params(dir.file("store")));
      t.open({4096});
      t.write(k, page_bytes_of(4096, k).data());
    }
    for (const std::string& file : {dir.file("store"), dir.file("store.log")}) {
      ssd_format::Header h;
      {
        std::ifstream f(file, std::ios::binary);
        f.read(reinterpret_cast<char*>(&h), sizeof h);
      }
      REQUIRE(h.version == ssd_format::kVersion);
      h.version = 1;
      h.checksum = h.compute_checksum();
      {
        std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
        f.write(reinterpret_cast<const char*>(&h), sizeof h);
      }
    }
    Ssd t(params(dir.file("store")));
    t.open({4096});
    CHECK(read_one(t, k, 4096) == page_bytes_of(4096, k));
  }
  SUBCASE("a slot size this page size cannot have") {
    {
      Ssd t(params(dir.file("store")));
      t.open({1000});
    }
    for (const std::uint64_t bad :
         {std::uint64_t{1000}, std::uint64_t{992}, std::uint64_t{3008}}) {  // not a multiple of 16, under the page, over half a block
      CAPTURE(bad);
      for (const std::string& file : {dir.file("store"), dir.file("store.log")}) {
        ssd_format::Header h;
        {
          std::ifstream f(file, std::ios::binary);
          f.read(reinterpret_cast<char*>(&h), sizeof h);
        }
        h.slot_bytes = bad;
        h.checksum = h.compute_checksum();
        {
          std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
          f.write(reinterpret_cast<const char*>(&h), sizeof h);
        }
      }
      Ssd t(params(dir.file("store")));
      CHECK_THROWS_WITH_AS(t.open({1000}), doctest::Contains("bad slot size"), Error);
    }
  }
  SUBCASE("a flipped bit is a checksum error naming the page, never wrong data") {
    Ssd t(params(dir.file("store")));
    t.open({4096});
    const PageKey k{3, 1, 0, 5};
    t.write(k, page_bytes_of(4096, k).data());
    flip_byte(dir.file("store"), t.slot_offset(t.slot_of(k)) + 123);
    std::vector<std::byte> out(4096);
    const ReadRequest r{k, out.data()};
    CHECK_THROWS_WITH_AS(t.wait(t.submit(std::span<const ReadRequest>(&r, 1))),
                         doctest::Contains("checksum mismatch on page (seq 3, layer 1, head 0, page 5)"), Error);
  }
  SUBCASE("a short read names the page") {
    Ssd t(params(dir.file("store")));
    t.open({4096});
    const PageKey k{1, 0, 0, 0};
    t.write(k, page_bytes_of(4096, k).data());
    REQUIRE(::truncate(dir.file("store").c_str(), static_cast<off_t>(t.slot_offset(t.slot_of(k)) + 1000)) == 0);
    CHECK_THROWS_WITH_AS(read_one(t, k, 4096), doctest::Contains("short read of page (seq 1, layer 0, head 0, page 0)"), Error);
  }
  SUBCASE("a missing page") {
    Ssd t(params(dir.file("store")));
    t.open({4096});
    CHECK_THROWS_WITH_AS(read_one(t, {9, 9, 9, 9}, 4096), doctest::Contains("no page"), Error);
  }
  SUBCASE("a full store refuses the page and keeps the others") {
    Ssd::Params p = params(dir.file("store"));
    p.capacity_pages = 8;
    Ssd t(p);
    t.open({4096});
    for (std::uint32_t i = 0; i < 8; ++i) t.write({1, 0, i % 2, i}, page_bytes_of(4096, {1, 0, i % 2, i}).data());
    CHECK(t.free_pages() == 0);
    CHECK_THROWS_WITH_AS(t.write({1, 0, 0, 99}, page_bytes_of(4096, {1, 0, 0, 99}).data()), doctest::Contains("full"), Error);
    for (std::uint32_t i = 0; i < 8; ++i) CHECK(read_one(t, {1, 0, i % 2, i}, 4096) == page_bytes_of(4096, {1, 0, i % 2, i}));
  }
}

TEST_CASE("SsdTier: one writer per store, in this process or another; read-only opens; files for the owner only") {
  // The test_ssd_mutant_NO_LOCK build runs this case over a File whose flock always succeeds:
  // it must fail (a second writer gets in).
  TempDir dir;
  const std::string path = dir.file("store");
  const PageKey a{1, 0, 0, 0}, b{1, 0, 0, 1};
  auto holder_pid = [&] {
    std::ifstream f(path + ".lock");
    long pid = 0;
    f >> pid;
    return pid;
  };
  SUBCASE("a second open in the same process fails, naming the path and the holder, until the first closes") {
    auto first = std::make_unique<Ssd>(params(path));
    first->open({4096});
    first->write(a, page_bytes_of(4096, a).data());
    CHECK(holder_pid() == static_cast<long>(::getpid()));
    for (SsdOpen mode : {SsdOpen::open_or_create, SsdOpen::recreate, SsdOpen::read_only}) {
      Ssd::Params p = params(path);
      p.mode = mode;
      Ssd second(p);
      CHECK_THROWS_WITH_AS(second.open({4096}), doctest::Contains((path + ": the store is in use by this process").c_str()), Error);
    }
    CHECK_THROWS_WITH_AS(Ssd::remove_files(path), doctest::Contains("in use by this process"), Error);
    CHECK(read_one(*first, a, 4096) == page_bytes_of(4096, a));  // the failed opens took nothing away
    first.reset();
    CHECK(holder_pid() == 0);  // the pid goes with the writer
    Ssd again(params(path));
    again.open({4096});
    CHECK(read_one(again, a, 4096) == page_bytes_of(4096, a));
  }
  SUBCASE("another process holding the store: opening, recreating and removing it fail naming its pid; its pages stay") {
    int ready[2], done[2];
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(done) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      char c = 0;
      try {
        Ssd t(params(path));
        t.open({4096});
        t.write(a, page_bytes_of(4096, a).data());
        c = 'r';
        (void)!::write(ready[1], &c, 1);
        (void)!::read(done[0], &c, 1);  // hold the store until the parent has tried
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    const std::string by_child = fmt::format("{}: the store is in use by process {}", path, child);
    for (SsdOpen mode : {SsdOpen::open_or_create, SsdOpen::recreate, SsdOpen::read_only}) {
      CAPTURE(static_cast<int>(mode));
      Ssd::Params p = params(path);
      p.mode = mode;
      Ssd t(p);
      CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains(by_child.c_str()), Error);
    }
    CHECK_THROWS_WITH_AS(Ssd::remove_files(path), doctest::Contains(by_child.c_str()), Error);
    c = 'x';
    REQUIRE(::write(done[1], &c, 1) == 1);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
    Ssd t(params(path));  // the child's exit let the lock go
    t.open({4096});
    CHECK(read_one(t, a, 4096) == page_bytes_of(4096, a));
  }
  SUBCASE("recreate deletes a store or an empty file, never anything else") {
    { std::ofstream(path) << "notes that are not a store"; }
    Ssd::Params p = params(path);
    p.mode = SsdOpen::recreate;
    {
      Ssd t(p);
      CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains((path + " is not a kvdrive store; it is not deleted").c_str()), Error);
    }
    CHECK_THROWS_WITH_AS(Ssd::remove_files(path), doctest::Contains("is not a kvdrive store"), Error);
    {
      std::ifstream f(path);
      std::string text;
      std::getline(f, text);
      CHECK(text == "notes that are not a store");
    }
    { std::ofstream(path, std::ios::trunc); }  // empty (a store whose creation was cut short): deleted
    {
      Ssd t(p);
      t.open({4096});
      t.write(a, page_bytes_of(4096, a).data());
    }
    {
      Ssd t(p);  // recreated: the page is gone
      t.open({4096});
      CHECK(t.stored_pages() == 0);
      t.write(b, page_bytes_of(4096, b).data());
    }
    Ssd t(params(path));  // reopened: what the recreated store holds
    t.open({4096});
    CHECK(t.stored_pages() == 1);
    CHECK(read_one(t, b, 4096) == page_bytes_of(4096, b));
  }
  SUBCASE("read-only opens share the store, read it, change nothing, and keep writers out") {
    {
      Ssd t(params(path));
      t.open({4096});
      t.write_batch(std::vector<WriteRequest>{{a, page_bytes_of(4096, a).data()}, {b, page_bytes_of(4096, b).data()}});
    }
    // A torn block at the log's end: a writer's recovery would cut it off, a reader leaves it.
    const auto log_size = std::filesystem::file_size(path + ".log");
    { std::ofstream(path + ".log", std::ios::app | std::ios::binary) << std::string(4096, 'z'); }
    Ssd::Params p = params(path);
    p.mode = SsdOpen::read_only;
    Ssd r1(p), r2(p);
    r1.open({4096});
    r2.open({4096});
    CHECK(r1.stored_pages() == 2);
    CHECK(read_one(r2, b, 4096) == page_bytes_of(4096, b));
    CHECK_THROWS_WITH_AS(r1.write(a, page_bytes_of(4096, a).data()), doctest::Contains("opened read-only"), Error);
    CHECK_THROWS_WITH_AS(r1.erase(a), doctest::Contains("opened read-only"), Error);
    CHECK_THROWS_WITH_AS(r1.sync(), doctest::Contains("opened read-only"), Error);
    CHECK(std::filesystem::file_size(path + ".log") == log_size + 4096);
    Ssd w(params(path));
    CHECK_THROWS_WITH_AS(w.open({4096}), doctest::Contains("in use by a read-only open"), Error);
    Ssd::Params none = p;
    none.path = dir.file("nothing");
    Ssd r3(none);
    CHECK_THROWS_WITH_AS(r3.open({4096}), doctest::Contains("no store there to open read-only"), Error);
    CHECK_FALSE(std::filesystem::exists(dir.file("nothing")));
  }
  SUBCASE("the store's files are made for their owner only (0600)") {
    Ssd t(params(path));
    t.open({4096});
    for (const std::string& name : {path, path + ".log", path + ".lock"}) {
      CAPTURE(name);
      struct stat st {};
      REQUIRE(::stat(name.c_str(), &st) == 0);
      CHECK((st.st_mode & 0777) == 0600);
    }
  }
}

TEST_CASE("SsdTier on a real full disk (a 1 MiB tmpfs): ENOSPC names the page, and the acknowledged pages stay, through a reopen") {
  // Not a simulated fault: the file system itself runs out of room. Mounting needs privileges
  // that containers often lack; then the test says so and skips.
  TempDir dir;
  const std::string mnt = dir.file("small");
  std::filesystem::create_directory(mnt);
  if (::mount("kvd-test", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    MESSAGE("skipped: a 1 MiB tmpfs cannot be mounted here (" << std::strerror(errno) << ")");
    return;
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string path = mnt + "/store";
  std::vector<PageKey> acked;
  std::string error;
  {
    Ssd t(params(path));
    t.open({4096});
    for (std::uint32_t i = 0; i < 1000 && error.empty(); ++i) {
      const PageKey k{1, 0, 0, i};
      try {
        t.write(k, page_bytes_of(4096, k).data());
        acked.push_back(k);
      } catch (const Error& e) {
        error = e.what();
      }
    }
    REQUIRE_MESSAGE(!error.empty(), "1000 pages fit in 1 MiB");
    CHECK(error.find(fmt::format("the disk is full (writing page (seq 1, layer 0, head 0, page {})", acked.size())) != std::string::npos);
    CHECK(acked.size() > 10);
    CHECK(t.stored_pages() == acked.size());
    for (const PageKey& k : acked) CHECK(read_one(t, k, 4096) == page_bytes_of(4096, k));
  }
  Ssd t(params(path));
  t.open({4096});
  CHECK(t.stored_pages() == acked.size());  // the failed page is not there, every acknowledged one is
  for (const PageKey& k : acked) CHECK(read_one(t, k, 4096) == page_bytes_of(4096, k));
  MESSAGE("full disk: " << acked.size() << " pages stored in a 1 MiB tmpfs before ENOSPC: " << error);
}

TEST_CASE("SsdTier over a failing File: each failed call is an error that names it, and stored pages stay readable") {
  using test::FileOp;
  TempDir dir;
  const std::string path = dir.file("store");
  const auto disk = std::make_shared<test::FaultDisk>();
  const auto make = [&](IoBackend io = IoBackend::automatic) { return test::store_over(params(path, io), test::FaultFile(disk)); };
  const PageKey a{1, 0, 0, 0}, b{1, 0, 0, 1};
  const auto bytes_a = page_bytes_of(4096, a), bytes_b = page_bytes_of(4096, b);
  const auto store_a = [&] {
    Ssd t(params(path));
    t.open({4096});
    t.write(a, bytes_a.data());
  };
  SUBCASE("a write is data, fdatasync, log, fdatasync") {
    auto t = make();
    t.open({4096});
    const std::uint64_t writes = disk->calls(FileOp::pwrite), syncs = disk->calls(FileOp::fdatasync);
    t.write(a, bytes_a.data());
    CHECK(disk->calls(FileOp::pwrite) - writes == 2);
    CHECK(disk->calls(FileOp::fdatasync) - syncs == 2);
  }
  SUBCASE("open") {
    disk->fail(FileOp::open);
    auto t = make();
    CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains("cannot open"), Error);
  }
  SUBCASE("access: an existing store taken for a new one is refused, not overwritten") {
    store_a();
    disk->fail(FileOp::access);
    auto t = make();
    CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains("File exists"), Error);
    Ssd again(params(path));
    again.open({4096});
    CHECK(read_one(again, a, 4096) == bytes_a);
  }
#ifdef STATX_DIOALIGN
  SUBCASE("statx: the alignment falls back to 4096") {
    SsdParams p = params(path);
    p.alignment = 0;
    disk->fail_always(FileOp::statx);
    auto t = test::store_over(p, test::FaultFile(disk));
    t.open({4096});
    CHECK(disk->calls(FileOp::statx) == 1);
    CHECK(t.alignment() == 4096);
  }
#endif
  SUBCASE("pwrite, fdatasync of the data, fdatasync of the log: the batch fails, the store goes on") {
    struct Fault {
      FileOp op;
      std::uint64_t nth;
      int error;
      const char* says;
    };
    for (const Fault& f : {Fault{FileOp::pwrite, 1, ENOSPC, "the disk is full (writing page (seq 1, layer 0, head 0, page 1)"},
                           Fault{FileOp::pwrite, 2, EIO, "write error at page (seq 1, layer 0, head 0, page 1)"},
                           Fault{FileOp::fdatasync, 1, EIO, "fdatasync failed"}, Fault{FileOp::fdatasync, 2, EIO, "fdatasync failed"}}) {
      CAPTURE(f.says);
      SsdTier::remove_files(path);
      {
        auto t = make();
        t.open({4096});
        t.write(a, bytes_a.data());
        disk->fail(f.op, f.nth, f.error);
        CHECK_THROWS_WITH_AS(t.write(b, bytes_b.data()), doctest::Contains(f.says), Error);
        CHECK(!t.contains(b));
        CHECK(read_one(t, a, 4096) == bytes_a);
        t.write(b, bytes_b.data());  // the store goes on
      }
      Ssd again(params(path));
      again.open({4096});
      CHECK(again.stored_pages() == 2);
      CHECK(read_one(again, b, 4096) == bytes_b);
    }
  }
  SUBCASE("a roll back that fails: the store refuses further calls") {
    {
      auto t = make();
      t.open({4096});
      t.write(a, bytes_a.data());
      disk->fail(FileOp::fdatasync, 2);
      disk->fail(FileOp::ftruncate);
      CHECK_THROWS_WITH_AS(t.write(b, bytes_b.data()), doctest::Contains("fdatasync failed"), Error);
      CHECK_THROWS_WITH_AS(t.write(b, bytes_b.data()), doctest::Contains("reopen the store"), Error);
    }  // closed, so the store can be reopened
    Ssd again(params(path));
    again.open({4096});
    CHECK(read_one(again, a, 4096) == bytes_a);
    if (again.contains(b)) CHECK(read_one(again, b, 4096) == bytes_b);  // its record may have landed
  }
  SUBCASE("pread (thread backend)") {
    auto t = make(IoBackend::threads);
    t.open({4096});
    t.write(a, bytes_a.data());
    disk->fail(FileOp::pread);
    CHECK_THROWS_WITH_AS(read_one(t, a, 4096), doctest::Contains("read error on page (seq 1, layer 0, head 0, page 0)"), Error);
    CHECK(read_one(t, a, 4096) == bytes_a);
  }
#if KVD_HAVE_LIBURING
  SUBCASE("io_uring: a completion's result, a submission, the setup, a registration") {
    auto t = make();
    t.open({4096});
    t.write(a, bytes_a.data());
    if (t.io_name() != std::string_view("io_uring")) {
      MESSAGE("io_uring is unavailable here: its failures are not exercised");
      return;
    }
    disk->fail(FileOp::uring_result);
    CHECK_THROWS_WITH_AS(read_one(t, a, 4096), doctest::Contains("read error on page (seq 1, layer 0, head 0, page 0)"), Error);
    CHECK(read_one(t, a, 4096) == bytes_a);
    disk->fail_always(FileOp::uring_register);
    std::vector<std::byte> mem(1 << 16);
    CHECK(!t.register_memory(mem.data(), mem.size()));
    CHECK(t.registered_bytes() == 0);
    disk->heal();
    disk->fail(FileOp::uring_submit);
    CHECK_THROWS_WITH_AS(read_one(t, a, 4096), doctest::Contains("io_uring submit failed"), Error);
    disk->fail(FileOp::uring_init);
    auto u = test::store_over(params(dir.file("other")), test::FaultFile(disk));
    u.open({4096});
    CHECK(u.io_name() == std::string_view("threads (pread)"));
    u.write(a, bytes_a.data());
    CHECK(read_one(u, a, 4096) == bytes_a);
  }
#endif
  SUBCASE("reopening: fstat, a read of the log, the cut of the log") {
    store_a();
    struct Fault {
      FileOp op;
      std::uint64_t nth;
      const char* says;
    };
    for (const Fault& f :
         {Fault{FileOp::fstat, 1, "stat failed"}, Fault{FileOp::pread, 4, "read error during recovery"},
          Fault{
              FileOp::ftruncate, 2,
              "cannot cut the log after recovery"}}) {  // pread 1: the data header checked before the log is opened; ftruncate 1: the lock file's pid
      CAPTURE(f.says);
      disk->fail(f.op, f.nth);
      auto t = make();
      CHECK_THROWS_WITH_AS(t.open({4096}), doctest::Contains(f.says), Error);
    }
    auto t = make();
    t.open({4096});
    CHECK(read_one(t, a, 4096) == bytes_a);
  }
}

namespace {

/// The small KV shape of the KvManager-over-SSD tests: 2 layers, 8 query / 2 KV heads, d = 64.
Config small_kv_config(double budget) {
  Config c;
  c.shape = {2, 8, 2, 64};
  c.page_tokens = 8;
  c.local_tokens = 16;
  c.dtype = DType::f16;
  c.budget = Budget::fraction(budget);
  return c;
}

/// One attend() of layer l at decode step `step` for sequence `id` alone, with seeded inputs.
template <class M>
std::vector<float> seeded_step(M& kv, SeqId id, int l, int step) {
  const int d = 64;
  const SeqId batch[] = {id};
  const auto q = test::random_floats(8 * d, 100 + step * 2 + l), k = test::random_floats(2 * d, 200 + step * 2 + l),
             v = test::random_floats(2 * d, 300 + step * 2 + l);
  std::vector<float> out(8 * d);
  kv.attend(l, batch, make_view(q, 1, 8, d), make_view(k, 1, 2, d), make_view(v, 1, 2, d), make_view(out, 1, 8, d));
  return out;
}

}  // namespace

TEST_CASE("SsdTier behind KvManager: the same output as host memory, misses read from the store") {
  TempDir dir;
  const Config c = small_kv_config(0.25);
  auto run = [&](auto& kv) {
    std::vector<float> outs;
    const int d = 64, prompt = 300;
    const SeqId id = kv.add_sequence();
    for (int l = 0; l < 2; ++l) {
      const auto k = test::random_floats(static_cast<std::size_t>(prompt) * 2 * d, 10 + l), v = test::random_floats(k.size(), 20 + l);
      kv.prefill(id, l, make_view(k, prompt, 2, d), make_view(v, prompt, 2, d));
    }
    for (int step = 0; step < 12; ++step)
      for (int l = 0; l < 2; ++l) {
        const std::vector<float> out = seeded_step(kv, id, l, step);
        outs.insert(outs.end(), out.begin(), out.end());
      }
    return outs;
  };
  KvManager<index::Quest, eviction::Lookahead> host(c);
  const auto expect = run(host);
  using SsdTiers = Tiers<HostTier, Ssd>;
  KvManager<index::Quest, eviction::Lookahead, SsdTiers> ssd(c, {}, {}, SsdTiers(HostTier{}, Ssd(params(dir.file("kv")))));
  CHECK(run(ssd) == expect);
  const Stats& s = ssd.total_stats();
  CHECK(s.misses > 0);
  CHECK(s.hits + s.misses == s.selected);
  CHECK(s.bytes_read[1] == s.misses * c.page_bytes());
  CHECK(ssd.tiers().get<1>().stored_pages() > 0);
}

TEST_CASE("semantic packing: after warm_up each cluster's pages sit in adjacent slots") {
  TempDir dir;
  const Config c = small_kv_config(0.125);
  const int d = 64, prompt = 1600, obs = 16;
  using SsdTiers = Tiers<HostTier, Ssd>;
  using M = KvManager<index::Hierarchical, eviction::Lookahead, SsdTiers>;
  auto prefill = [&](M& kv) {
    const SeqId id = kv.add_sequence();
    for (int l = 0; l < 2; ++l) {
      const auto k = test::random_floats(static_cast<std::size_t>(prompt) * 2 * d, 10 + l), v = test::random_floats(k.size(), 20 + l);
      kv.prefill(id, l, make_view(k, prompt, 2, d), make_view(v, prompt, 2, d));
      const auto q = test::random_floats(static_cast<std::size_t>(obs) * 8 * d, 30 + l);
      kv.warm_up(id, l, make_view(q, obs, 8, d));
    }
    return id;
  };
  // Of the pairs of pages that follow each other within a cluster (in page order), the share
  // whose slots are adjacent.
  auto adjacency = [&](M& kv, SeqId id) {
    std::size_t pairs = 0, adjacent = 0;
    const auto sealed = static_cast<std::uint32_t>(prompt / c.page_tokens);
    for (std::uint32_t l = 0; l < 2; ++l)
      for (std::uint32_t h = 0; h < 2; ++h) {
        const auto& state = kv.index_state(id, static_cast<int>(l), static_cast<int>(h));
        std::map<std::uint32_t, std::vector<std::uint32_t>> members;
        for (std::uint32_t p = 0; p < sealed; ++p) members[index::Hierarchical::cluster_of(state, p)].push_back(p);
        for (const auto& [cluster, pages] : members)
          for (std::size_t i = 1; i < pages.size(); ++i) {
            ++pairs;
            adjacent += kv.tiers().get<1>().slot_of({id, l, h, pages[i]}) == kv.tiers().get<1>().slot_of({id, l, h, pages[i - 1]}) + 1;
          }
      }
    REQUIRE(pairs > 0);
    return static_cast<double>(adjacent) / static_cast<double>(pairs);
  };
  M packed(c, {}, {}, SsdTiers(HostTier{}, Ssd(params(dir.file("packed")))));
  Config naive_config = c;
  naive_config.pack_by_cluster = false;
  M naive(naive_config, {}, {}, SsdTiers(HostTier{}, Ssd(params(dir.file("naive")))));
  const SeqId a = prefill(packed), b = prefill(naive);
  CHECK(packed.total_stats().packed > 0);
  CHECK(naive.total_stats().packed == 0);
  const double packed_adjacency = adjacency(packed, a), naive_adjacency = adjacency(naive, b);
  CAPTURE(packed_adjacency);
  CAPTURE(naive_adjacency);
  CHECK(packed_adjacency >= 0.9);  // breaks only where a cluster crosses an extent boundary
  CHECK(naive_adjacency < packed_adjacency);
  // The layout changes where pages sit, never what attention computes.
  for (int step = 0; step < 8; ++step)
    for (int l = 0; l < 2; ++l) CHECK(seeded_step(packed, a, l, step) == seeded_step(naive, b, l, step));
  CHECK(packed.total_stats().misses == naive.total_stats().misses);
  CHECK(packed.total_stats().misses > 0);
}

TEST_CASE("SsdTier kill test: acknowledged pages survive SIGKILL at any moment, recovery included, and nothing else appears") {
  // One store per seed through several kill -> reopen -> write cycles, so each child recovers
  // what the one before left. A child opens the store, says so on a pipe, then writes batches
  // of 1-4 fresh pages and acknowledges each batch on the pipe once write_batch returns; when it
  // has written them all it waits. The parent kills it with SIGKILL after a random delay (some
  // kills land in open(), during recovery), then reopens the store and checks, against the
  // acknowledgements: every acknowledged page of every cycle reads back exactly; this cycle's
  // pages form a prefix of its write order that ends inside the batch in flight (a batch is
  // one log block, all or nothing); no other page is there. Each planned kill must be a kill.
  constexpr std::uint32_t kOpened = 0xffffffffu;
  const int seeds = 10 * test::scale(), cycles = 4;
  std::size_t kills = 0, in_open = 0, least = SIZE_MAX, most = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    CAPTURE(seed);
    TempDir dir;
    const std::string path = dir.file("store");
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
    std::vector<std::vector<PageKey>> orders;  // per cycle, the child's write order
    std::vector<std::size_t> stored;           // per cycle, the pages the store holds after it
    for (int cycle = 0; cycle < cycles; ++cycle) {
      CAPTURE(cycle);
      std::vector<PageKey> order;
      for (std::uint32_t i = 0; i < 4000; ++i) order.push_back({static_cast<std::uint64_t>(cycle + 1), i % 3, (i / 3) % 2, i});
      int acks[2];
      REQUIRE(::pipe(acks) == 0);
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {
        ::close(acks[0]);
        try {
          Ssd t(params(path));
          t.open({4096});
          (void)!::write(acks[1], &kOpened, sizeof kOpened);
          std::mt19937_64 crng(static_cast<std::uint64_t>(seed * 77 + cycle));
          for (std::size_t i = 0; i < order.size();) {
            const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::size_t>(1 + crng() % 4, order.size() - i));
            std::vector<std::vector<std::byte>> bytes;
            std::vector<WriteRequest> batch;
            for (std::size_t j = 0; j < n; ++j) bytes.push_back(page_bytes_of(4096, order[i + j]));
            for (std::size_t j = 0; j < n; ++j) batch.push_back({order[i + j], bytes[j].data()});
            t.write_batch(batch);
            (void)!::write(acks[1], &n, sizeof n);  // acknowledged: durable from here on
            i += n;
          }
          for (;;) ::pause();  // every page written: wait for the kill
        } catch (...) {
          ::_exit(2);
        }
      }
      ::close(acks[1]);
      ::usleep(static_cast<useconds_t>(rng() % 30000));
      REQUIRE(::kill(child, SIGKILL) == 0);
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      CHECK_MESSAGE(killed, "the child ended by itself (status " << status << ")");
      kills += killed ? 1 : 0;
      bool opened = false;
      std::size_t acked = 0;
      std::uint32_t msg = 0;
      while (::read(acks[0], &msg, sizeof msg) == static_cast<ssize_t>(sizeof msg)) {
        if (msg == kOpened) opened = true;
        else acked += msg;
      }
      ::close(acks[0]);
      in_open += opened ? 0 : 1;
      Ssd t(params(path));
      t.open({4096});
      std::size_t present = 0;
      while (present < order.size() && t.contains(order[present])) ++present;
      CHECK(present >= acked);      // nothing acknowledged is lost
      CHECK(present <= acked + 4);  // nothing past the batch in flight
      for (std::size_t i = 0; i < present; ++i) CHECK(read_one(t, order[i], 4096) == page_bytes_of(4096, order[i]));
      orders.push_back(order);
      stored.push_back(present);
      std::size_t total = 0;  // the earlier cycles' pages are all still there, exact
      for (std::size_t c = 0; c < orders.size(); ++c) {
        total += stored[c];
        for (std::size_t i = 0; i < stored[c]; i += 7) CHECK(read_one(t, orders[c][i], 4096) == page_bytes_of(4096, orders[c][i]));
      }
      CHECK(t.stored_pages() == total);  // and no page that was never written
      least = std::min(least, present);
      most = std::max(most, present);
    }
  }
  CHECK(kills == static_cast<std::size_t>(seeds * cycles));
  MESSAGE("kill test: " << kills << " of " << seeds * cycles << " planned kills (" << seeds << " stores x " << cycles << " cycles), " << in_open
                        << " of them before open() returned; " << least << " to " << most << " pages survived a cycle");
}

TEST_CASE("SsdTier power-loss test: acknowledged pages survive, nothing else is wrong, torn blocks are caught") {
  // Batches of fresh pages and overwrites; the power goes at a random write or sync. Writes not
  // yet synced are lost and the last one is torn. Reopened, every page whose batch returned reads
  // back its latest acknowledged bytes (or the bytes of the batch in flight, if its log record
  // made it), and no other page is present.
  int lost_in_flight = 0;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    CAPTURE(seed);
    TempDir dir;
    const std::string path = dir.file("store");
    std::mt19937_64 rng(seed);
    std::map<std::uint32_t, int> acked;      // page -> version acknowledged
    std::map<std::uint32_t, int> in_flight;  // the batch the power cut
    const auto key = [&](std::uint32_t page) { return PageKey{seed + 1, page % 2, 0, page}; };
    {
      const auto disk = std::make_shared<test::FaultDisk>();
      auto t = test::store_over(params(path), test::FaultFile(disk));
      t.open({4096});
      disk->power_loss_after(1 + rng() % 60);
      std::uint32_t next_page = 0;
      for (int batch = 0; batch < 40; ++batch) {
        std::map<std::uint32_t, int> pages;
        const int n = 1 + static_cast<int>(rng() % 4);
        for (int j = 0; j < n; ++j) pages[next_page++] = 0;
        if (!acked.empty() && rng() % 2) {  // overwrite an acknowledged page with a new version
          const auto it = pick(acked, rng);
          pages[it->first] = it->second + 1;
        }
        const VersionBatch b(pages, key);
        try {
          t.write_batch(b.reqs);
        } catch (const Error& e) {
          REQUIRE(std::string(e.what()).find("simulated power loss") != std::string::npos);
          in_flight = pages;
          break;
        }
        for (const auto& [page, version] : pages) acked[page] = version;
      }
      REQUIRE(!in_flight.empty());  // the power went during the run
      REQUIRE(disk->power_out());
    }
    std::size_t present = acked.size();
    const PageKey extra{999, 0, 0, 0};
    {
      Ssd t(params(path));
      t.open({4096});
      for (const auto& [page, version] : acked) {
        CAPTURE(page);
        REQUIRE(t.contains(key(page)));
        const auto got = read_one(t, key(page), 4096);
        const auto f = in_flight.find(page);
        CHECK((got == page_bytes_of(4096, key(page), version) || (f != in_flight.end() && got == page_bytes_of(4096, key(page), f->second))));
      }
      for (const auto& [page, version] : in_flight)
        if (!acked.count(page) && t.contains(key(page))) {
          ++present;
          CHECK(read_one(t, key(page), 4096) == page_bytes_of(4096, key(page), version));
        }
      CHECK(t.stored_pages() == present);  // nothing that was never written
      bool any = false;
      for (const auto& [page, version] : in_flight) any = any || (!acked.count(page) && t.contains(key(page)));
      lost_in_flight += any ? 0 : 1;
      // A log block torn by the power loss is detected: the log ends before it, and a write
      // after reopening lands and survives another reopen.
      t.write(extra, page_bytes_of(4096, extra).data());
    }
    Ssd again(params(path));
    again.open({4096});
    CHECK(again.contains(extra));
    CHECK(again.stored_pages() == present + 1);
  }
  MESSAGE("power-loss test: 50 seeds; the batch in flight was lost in " << lost_in_flight << " of them");
}

namespace {

/// A seeded workload of puts, overwrites, erases and syncs over one store, with a model of what
/// each page may read back after a crash: allowed[page] holds its possible versions (-1: absent).
/// An acknowledged put or overwrite allows only its version; an erase allows absence at once and
/// only absence once a later write or sync() made it durable; the call the crash cut allows its
/// own outcome too.
struct CrashWorkload {
  std::uint64_t seed;
  std::map<std::uint32_t, std::set<int>> allowed;
  std::map<std::uint32_t, int> live;  // the version each live page holds, as the store sees it
  std::vector<std::uint32_t> pending_erases;
  std::uint32_t next_page = 0;
  std::size_t page_size = 4096;  ///< 1000: packed, four pages to a 4 KiB block

  PageKey key(std::uint32_t page) const { return PageKey{seed + 1, page % 3, 0, page}; }

  std::uint64_t failures = 0;  // calls that threw, with keep_going

  /// Runs up to `ops` operations; returns false if the power went (a "simulated power loss").
  /// With keep_going, a call that throws (an injected fault) is counted and the run goes on.
  template <class Store>
  bool run(Store& t, int ops, bool keep_going = false) {
    std::mt19937_64 rng(seed);
    for (int op = 0; op < ops; ++op) {
      const auto dice = rng() % 10;
      try {
        if (dice == 9 && !live.empty()) {  // read a live page back
          const auto it = pick(live, rng);
          const auto got = read_one(t, key(it->first), page_size);  // an injected read fault throws here
          CHECK(got == page_bytes_of(page_size, key(it->first), it->second));
          continue;
        }
        if (dice < 6 || live.empty()) {  // a batch of new pages, sometimes with an overwrite
          std::map<std::uint32_t, int> pages;
          for (int j = 0, n = 1 + static_cast<int>(rng() % 3); j < n; ++j) {
            allowed[next_page] = {-1};
            pages[next_page++] = 0;
          }
          if (!live.empty() && rng() % 2) {
            const auto it = pick(live, rng);
            pages[it->first] = it->second + 1;
          }
          const VersionBatch b(
              pages, [&](std::uint32_t page) { return key(page); }, page_size);
          try {
            t.write_batch(b.reqs);
          } catch (...) {
            for (const auto& [page, version] : pages) allowed[page].insert(version);
            throw;
          }
          durable_erases();
          for (const auto& [page, version] : pages) allowed[page] = {version}, live[page] = version;
        } else if (dice < 8) {  // erase a live page: durable at the next write or sync
          const auto it = pick(live, rng);
          t.erase(key(it->first));
          allowed[it->first].insert(-1);
          pending_erases.push_back(it->first);
          live.erase(it);
        } else {
          t.sync();
          durable_erases();
        }
      } catch (const Error& e) {
        if (keep_going) {
          ++failures;
          continue;
        }
        REQUIRE(std::string(e.what()).find("simulated power loss") != std::string::npos);
        return false;
      }
    }
    return true;
  }

  void durable_erases() {
    for (std::uint32_t page : pending_erases)
      if (!live.count(page)) allowed[page] = {-1};
    pending_erases.clear();
  }

  /// After a reopen: every page reads back an allowed version (never bytes not written to it),
  /// nothing else is stored, and no two pages share a slot. Returns the pages present.
  template <class Store>
  std::size_t check(Store& t) const {
    std::size_t present = 0;
    std::set<std::uint64_t> slots;
    for (const auto& [page, versions] : allowed) {
      CAPTURE(page);
      int got = -1;
      if (t.contains(key(page))) {
        ++present;
        slots.insert(t.slot_of(key(page)));
        const auto bytes = read_one(t, key(page), page_size);
        got = -2;  // bytes never written to this page
        for (int v : versions)
          if (v >= 0 && bytes == page_bytes_of(page_size, key(page), v)) got = v;
      }
      CHECK_MESSAGE(versions.count(got), "page " << page << " reads back " << (got == -2 ? "bytes never written to it" : std::to_string(got)));
    }
    CHECK(t.stored_pages() == present);
    CHECK(slots.size() == present);
    return present;
  }
};

}  // namespace

TEST_CASE("SsdTier crash sweep: power lost at every sync point, unsynced writes kept, dropped, torn at 512 or 4096, or garbage") {
  const int seeds = 3 * test::scale();
  constexpr int kOps = 24;
  std::uint64_t points = 0, dropped_records = 0, reports = 0;
  test::FaultDisk::Fates fates;
  std::uint64_t packed_points = 0;
  for (std::size_t page_size : {std::size_t{4096}, std::size_t{1000}})  // 1000: packed, so a torn block holds only the batch in flight
    for (std::uint64_t seed = 0; seed < static_cast<std::uint64_t>(seeds); ++seed) {
      for (std::uint64_t at = 1;; ++at) {
        CAPTURE(page_size);
        CAPTURE(seed);
        CAPTURE(at);
        TempDir dir;
        const std::string path = dir.file("store");
        CrashWorkload w{seed, {}, {}, {}, 0};
        w.page_size = page_size;
        bool finished = false;
        {
          const auto disk = std::make_shared<test::FaultDisk>();
          auto t = test::store_over(params(path), test::FaultFile(disk));
          t.open({page_size});
          disk->power_loss_at_sync(at, seed * 1000 + at);
          finished = w.run(t, kOps);
          const auto f = disk->fates();
          fates.kept += f.kept, fates.dropped += f.dropped, fates.torn_512 += f.torn_512, fates.torn_4096 += f.torn_4096, fates.garbage += f.garbage;
        }
        if (finished) break;  // the workload has fewer sync points than `at`
        ++points;
        packed_points += page_size < 2048;
        std::size_t present = 0;
        {
          Ssd t(params(path));
          t.open({page_size});
          const ssd::LogEnd r = t.recovery();
          reports += r.dropped_bytes > 0;
          dropped_records += r.dropped_records;
          present = w.check(t);
          // The store goes on: more pages, an erase, a sync, then another reopen.
          const PageKey more{999, 0, 0, static_cast<std::uint32_t>(at)};
          t.write(more, page_bytes_of(page_size, more).data());
          for (const auto& [page, versions] : w.allowed)
            if (t.contains(w.key(page))) {
              t.erase(w.key(page));
              w.allowed[page] = {-1};
              --present;
              break;
            }
          t.sync();
        }
        Ssd again(params(path));
        again.open({page_size});
        const PageKey more{999, 0, 0, static_cast<std::uint32_t>(at)};
        CHECK(again.contains(more));
        CHECK(read_one(again, more, page_size) == page_bytes_of(page_size, more));
        CHECK(again.stored_pages() == present + 1);
        CHECK(again.recovery().dropped_bytes == 0);
      }
    }
  CHECK(points >= static_cast<std::uint64_t>(seeds) * 20);
  CHECK(packed_points >= static_cast<std::uint64_t>(seeds) * 10);
  CHECK(fates.torn_512 > 0);
  CHECK(fates.torn_4096 > 0);
  CHECK(fates.garbage > 0);
  MESSAGE("crash sweep: " << points << " crash points (" << packed_points << " of them with 1000-byte pages, packed four to a block; every sync of "
                          << seeds << " workloads of " << kOps << " puts, overwrites, erases and syncs); unsynced writes kept " << fates.kept
                          << ", dropped " << fates.dropped << ", torn at 512 " << fates.torn_512 << ", torn at 4096 " << fates.torn_4096
                          << ", garbage " << fates.garbage << "; recovery cut a damaged log tail in " << reports << " (" << dropped_records
                          << " intact records after the cut)");
}

TEST_CASE("SsdTier fault sweep: an I/O fault at every operation index, then more work, then a reopen") {
  // Each run injects one fault: the n-th pwrite, fdatasync or read completion fails with EIO or
  // ENOSPC, or the n-th pwrite fails and so does the log's rollback (ftruncate), or the n-th pwrite
  // is cut short; the workload goes on after it. Reopened, every page reads back an allowed
  // version, nothing else is stored, no slot is used twice, and the store takes more work.
  using test::FileOp;
  struct Fault {
    const char* what;
    FileOp op;
    int error;  // 0: a short write
    bool rollback_fails;
    IoBackend io = IoBackend::automatic;
  };
  const std::vector<Fault> faults{{"pwrite EIO", FileOp::pwrite, EIO, false},
                                  {"pwrite ENOSPC", FileOp::pwrite, ENOSPC, false},
                                  {"fdatasync EIO", FileOp::fdatasync, EIO, false},
                                  {"fdatasync ENOSPC", FileOp::fdatasync, ENOSPC, false},
                                  {"pwrite EIO, rollback EIO", FileOp::pwrite, EIO, true},
                                  {"read EIO (io_uring completion)", FileOp::uring_result, EIO, false},
                                  {"read EIO (the thread pool's preadv)", FileOp::preadv, EIO, false, IoBackend::threads},
                                  {"short pwrite", FileOp::pwrite, 0, false}};
  const int seeds = test::scale();
  constexpr int kOps = 24;
  std::uint64_t runs = 0, failed_calls = 0;
  for (std::uint64_t seed = 0; seed < static_cast<std::uint64_t>(seeds); ++seed)
    for (const Fault& f : faults) {
      const std::string what = f.what;
      CAPTURE(what);
      CAPTURE(seed);
      // A run without faults counts the calls to sweep.
      std::uint64_t calls = 0;
      {
        TempDir dir;
        const auto disk = std::make_shared<test::FaultDisk>();
        auto t = test::store_over(params(dir.file("store"), f.io), test::FaultFile(disk));
        t.open({4096});
        const std::uint64_t before = disk->calls(f.op);
        CrashWorkload w{seed + 100, {}, {}, {}, 0};
        REQUIRE(w.run(t, kOps));
        calls = disk->calls(f.op) - before;
      }
      for (std::uint64_t n = 1; n <= calls; ++n) {
        CAPTURE(n);
        TempDir dir;
        const std::string path = dir.file("store");
        CrashWorkload w{seed + 100, {}, {}, {}, 0};
        {
          const auto disk = std::make_shared<test::FaultDisk>();
          auto t = test::store_over(params(path, f.io), test::FaultFile(disk));
          t.open({4096});
          if (f.error == 0) disk->short_write(n);
          else disk->fail(f.op, n, f.error);
          if (f.rollback_fails) disk->fail(FileOp::ftruncate, 1, EIO);
          w.run(t, kOps, true);
          CHECK(disk->injected() >= 1);
        }
        ++runs;
        failed_calls += w.failures;
        std::size_t present = 0;
        {
          Ssd t(params(path));
          t.open({4096});
          present = w.check(t);
          const PageKey more{999, 0, 0, 0};
          t.write(more, page_bytes_of(4096, more).data());
        }
        Ssd again(params(path));
        again.open({4096});
        CHECK(again.stored_pages() == present + 1);
        CHECK(read_one(again, PageKey{999, 0, 0, 0}, 4096) == page_bytes_of(4096, PageKey{999, 0, 0, 0}));
      }
    }
  CHECK(runs >= 100);
  MESSAGE("fault sweep: " << runs << " runs, one fault each at every index of its call (" << seeds << " workloads of " << kOps << " operations); "
                          << failed_calls << " calls failed in all");
}

TEST_CASE("faults under KvManager with an SSD store: clear errors naming the page, nothing lost, retry works") {
  TempDir dir;
  Config c;
  c.shape = {1, 4, 2, 64};
  c.page_tokens = 8;
  c.local_tokens = 16;
  c.budget = Budget::fraction(0.25);
  using Faulty = FaultTier<Ssd>;
  using T = Tiers<HostTier, Faulty>;
  KvManager<index::Quest, eviction::Lookahead, T> kv(c, {}, eviction::Lookahead{1}, T(HostTier{}, Faulty(Ssd(params(dir.file("kv"))))));
  auto& ssd = kv.tiers().get<1>();
  const int d = 64, prompt = 400;
  const auto k = test::random_floats(static_cast<std::size_t>(prompt) * 2 * d, 1), v = test::random_floats(k.size(), 2);
  const SeqId id = kv.add_sequence();
  // ENOSPC while prefill writes its pages: an error that says so; nothing is stored; a retry works.
  ssd.fail_writes_after(10, Faulty::WriteFault::no_space);
  CHECK_THROWS_WITH_AS(kv.prefill(id, 0, make_view(k, prompt, 2, d), make_view(v, prompt, 2, d)), doctest::Contains("no space left on device"),
                       Error);
  CHECK(ssd.inner().stored_pages() == 0);
  CHECK(kv.length(id, 0) == 0);
  ssd.heal();
  kv.prefill(id, 0, make_view(k, prompt, 2, d), make_view(v, prompt, 2, d));
  const std::size_t stored = ssd.inner().stored_pages();
  CHECK(stored > 0);
  const SeqId batch[] = {id};
  auto step = [&](int s) {
    const auto q = test::random_floats(4 * d, 100 + s), kn = test::random_floats(2 * d, 200 + s), vn = test::random_floats(2 * d, 300 + s);
    std::vector<float> out(4 * d);
    kv.attend(0, batch, make_view(q, 1, 4, d), make_view(kn, 1, 2, d), make_view(vn, 1, 2, d), make_view(out, 1, 4, d));
    return out;
  };
  // A short read and an EIO during a step name the page and change nothing; the retry gives the
  // output an undisturbed step gives.
  for (auto fault : {Faulty::ReadFault::short_read, Faulty::ReadFault::eio}) {
    ssd.fail_reads_after(0, fault);
    CHECK_THROWS_WITH_AS(step(0), doctest::Contains("page (seq 1, layer 0"), Error);
    CHECK_THROWS_WITH_AS(step(0), doctest::Contains(fault == Faulty::ReadFault::short_read ? "short read" : "EIO"), Error);
    ssd.heal();
    CHECK(kv.length(id, 0) == prompt);
  }
  const auto first = step(0);
  CHECK(kv.length(id, 0) == prompt + 1);
  // A bit flipped on the medium: a checksum error naming the page, never a wrong output.
  for (std::uint32_t page = 1; page < static_cast<std::uint32_t>(prompt / 8 - 2); ++page)
    if (ssd.contains({id, 0, 0, page})) test::flip_stored_bit(ssd.inner(), {id, 0, 0, page}, 77);
  bool caught = false;
  for (int s = 1; s < 6 && !caught; ++s) {
    try {
      step(s);
    } catch (const Error& e) {
      caught = std::string(e.what()).find("checksum mismatch on page (seq 1, layer 0, head 0") != std::string::npos;
      REQUIRE(caught);
    }
  }
  CHECK(caught);
  CHECK(ssd.inner().stored_pages() >= stored);  // nothing stored before was lost
  (void)first;
}

TEST_CASE("MmapTier, the strawman: pages round-trip, and a read loads its whole layer") {
  TempDir dir;
  MmapTier t(MmapTier::Params{dir.file("mm"), 64});
  t.open({4096});
  for (std::uint32_t layer = 0; layer < 2; ++layer)
    for (std::uint32_t page = 0; page < 20; ++page) t.write({1, layer, 0, page}, page_bytes_of(4096, {1, layer, 0, page}).data());
  t.drop_cache();
  std::vector<std::byte> a(4096), b(4096);
  const ReadRequest reads[] = {{{1, 1, 0, 3}, a.data()}, {{1, 1, 0, 17}, b.data()}};
  t.wait(t.submit(reads));
  CHECK(a == page_bytes_of(4096, {1, 1, 0, 3}));
  CHECK(b == page_bytes_of(4096, {1, 1, 0, 17}));
  CHECK(t.layer_loads() == 1);           // both pages are in layer 1: loaded once
  CHECK(t.bytes_loaded() == 20 * 4096);  // all of it
  CHECK(t.free_pages() == 24);
  for (std::uint32_t page = 0; page < 24; ++page) t.write({2, 0, 0, page}, a.data());
  CHECK_THROWS_WITH_AS(t.write({3, 0, 0, 0}, a.data()), doctest::Contains("full"), Error);
}

TEST_CASE("SsdTier: log blocks past a torn one are never replayed, and freed slots are reused") {
  TempDir dir;
  const std::string path = dir.file("store");
  const PageKey k{1, 0, 0, 100};
  {
    Ssd t(params(path));
    t.open({4096});
    t.write(k, page_bytes_of(4096, k, 1).data());  // acknowledged: k = v1
    std::vector<std::vector<std::byte>> bytes;
    std::vector<WriteRequest> reqs;
    for (std::uint32_t i = 0; i < 146; ++i) bytes.push_back(page_bytes_of(4096, {1, 0, 0, i}, i == 100 ? 2 : 0));
    for (std::uint32_t i = 0; i < 146; ++i) reqs.push_back({{1, 0, 0, i}, bytes[i].data()});
    t.write_batch(reqs);  // two log blocks (73 records each), at 8192 and 12288
  }
  // A crash in which the batch's second log block reached the medium and its first did not.
  {
    const int fd = ::open((path + ".log").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    std::vector<char> zero(4096, 0);
    REQUIRE(::pwrite(fd, zero.data(), zero.size(), 8192) == 4096);
    ::close(fd);
  }
  {
    Ssd t(params(path));
    t.open({4096});
    CHECK(read_one(t, k, 4096) == page_bytes_of(4096, k, 1));
    CHECK(t.stored_pages() == 1);
    // Dropped: the hole and the intact block after it, all 73 of whose records are whole.
    const auto r = t.recovery();
    CHECK(r.replayed_records == 1);
    CHECK(r.dropped_bytes == 8192);
    CHECK(r.dropped_records == 73);
    CHECK(r.why.find("an empty block") != std::string::npos);
    std::vector<std::vector<std::byte>> bytes;
    std::vector<WriteRequest> reqs;
    for (std::uint32_t i = 0; i < 73; ++i) bytes.push_back(page_bytes_of(4096, {2, 0, 0, i}));
    for (std::uint32_t i = 0; i < 73; ++i) reqs.push_back({{2, 0, 0, i}, bytes[i].data()});
    t.write_batch(reqs);  // exactly one block: the stale block after it must not come back
  }
  {
    Ssd t(params(path));
    t.open({4096});
    CHECK(read_one(t, k, 4096) == page_bytes_of(4096, k, 1));  // never the unacknowledged v2
    CHECK(t.stored_pages() == 74);
    CHECK(t.recovery().dropped_bytes == 0);  // the first recovery cut the stale block off
  }
  // Without a capacity, erased and overwritten slots are reused once durable: the file stays small.
  Ssd t(params(dir.file("reuse")));
  t.open({4096});
  for (std::uint32_t i = 0; i < 20; ++i) {
    t.write({1, 0, 0, 0}, page_bytes_of(4096, {1, 0, 0, 0}, static_cast<int>(i)).data());  // overwrites
    t.write({9, 0, 0, i}, page_bytes_of(4096, {9, 0, 0, i}).data());
    t.erase({9, 0, 0, i});
  }
  t.sync();
  CHECK(t.slot_of({1, 0, 0, 0}) < 8);  // within the first extent: old slots came back
  CHECK(std::filesystem::file_size(dir.file("reuse")) <= 4096 + 8 * 4096 * 2);
}
