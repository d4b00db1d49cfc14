// Storage tiers: the host page pool and tier, and the fault-injection wrapper.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "fault_tier.hpp"

using namespace kvdrive;
using namespace kvdrive::tier;

namespace {
std::vector<std::byte> page_of(std::size_t bytes, int fill) {
  std::vector<std::byte> p(bytes);
  for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>((fill * 31 + static_cast<int>(i)) & 0xff);
  return p;
}
}  // namespace

TEST_CASE("PagePool: aligned, distinct slots up to the capacity; reuse after release") {
  PagePool pool;
  pool.open(1000, 4096, 2000);
  std::set<std::byte*> seen;
  std::vector<PagePool::Slot> slots;
  for (int i = 0; i < 2000; ++i) {
    slots.push_back(pool.allocate());
    std::byte* p = pool.data(slots.back());
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
    CHECK(seen.insert(p).second);
  }
  CHECK(pool.free_pages() == 0);
  CHECK_THROWS_WITH_AS(pool.allocate(), doctest::Contains("all 2000 pages in use"), Error);
  pool.release(slots[17]);
  CHECK(pool.allocate() == slots[17]);
  CHECK(pool.used() == 2000);
}

TEST_CASE("HostTier: write, read back, address in place, erase, capacity") {
  HostTier t({3, 64});
  t.open({4096});
  const auto a = page_of(4096, 1), b = page_of(4096, 2);
  t.write({1, 0, 0, 0}, a.data());
  t.write({1, 0, 1, 0}, b.data());
  CHECK(t.contains({1, 0, 0, 0}));
  CHECK_FALSE(t.contains({1, 0, 0, 1}));
  CHECK(std::memcmp(t.address({1, 0, 1, 0}), b.data(), 4096) == 0);
  std::vector<std::byte> dst(2 * 4096);
  const ReadRequest reads[] = {{{1, 0, 0, 0}, dst.data()}, {{1, 0, 1, 0}, dst.data() + 4096}};
  t.wait(t.submit(reads));
  CHECK(std::memcmp(dst.data(), a.data(), 4096) == 0);
  CHECK(std::memcmp(dst.data() + 4096, b.data(), 4096) == 0);
  t.write({1, 0, 0, 0}, b.data());  // overwrite keeps one slot
  CHECK(t.stored_pages() == 2);
  CHECK(std::memcmp(t.address({1, 0, 0, 0}), b.data(), 4096) == 0);
  t.write({2, 0, 0, 0}, a.data());
  CHECK(t.free_pages() == 0);
  CHECK_THROWS_AS(t.write({3, 0, 0, 0}, a.data()), Error);
  t.erase({2, 0, 0, 0});
  CHECK(t.free_pages() == 1);
  CHECK_THROWS_WITH_AS(t.address({2, 0, 0, 0}), doctest::Contains("no page (seq 2, layer 0, head 0, page 0)"), Error);
}

TEST_CASE("HostTier: a page smaller than the alignment takes its own size, not a whole 4 KiB slot; whole multiples stay aligned") {
  // A 2 KiB page (8 tokens x 64 dims x f16, K and V) under the default 4096-byte alignment: no
  // tier reads it in place, so its slot is its size (the KV cache half what it was), 64-aligned.
  HostTier small;
  small.open({2048});
  CHECK(small.slot_stride() == 2048);
  std::set<const std::byte*> seen;
  for (std::uint32_t p = 0; p < 5; ++p) small.write({1, 0, 0, p}, page_of(2048, static_cast<int>(p)).data());
  for (std::uint32_t p = 0; p < 5; ++p) {  // neighbours do not overlap: each reads back its own bytes
    const std::byte* at = small.address({1, 0, 0, p});
    CHECK(reinterpret_cast<std::uintptr_t>(at) % 64 == 0);
    CHECK(seen.insert(at).second);
    CHECK(std::memcmp(at, page_of(2048, static_cast<int>(p)).data(), 2048) == 0);
  }
  HostTier odd;  // 6 KiB: not a whole number of 4 KiB blocks either
  odd.open({6144});
  CHECK(odd.slot_stride() == 6144);
  HostTier whole;  // 8 KiB: direct I/O may read it in place, so every slot is 4096-aligned
  whole.open({8192});
  CHECK(whole.slot_stride() == 8192);
  for (std::uint32_t p = 0; p < 3; ++p) whole.write({1, 0, 0, p}, page_of(8192, 1).data());
  for (std::uint32_t p = 0; p < 3; ++p) CHECK(reinterpret_cast<std::uintptr_t>(whole.address({1, 0, 0, p})) % 4096 == 0);
  HostTier coded({0, 64});  // a 64-byte alignment asked (a host tier of coded pages) is kept
  coded.open({100});
  CHECK(coded.slot_stride() == 128);
}

TEST_CASE("FaultTier: injects read and write errors on schedule, then heals") {
  FaultTier<HostTier> t;
  t.open({256});
  const auto a = page_of(256, 3);
  for (std::uint32_t p = 0; p < 4; ++p) t.write({1, 0, 0, p}, a.data());
  t.fail_reads_after(3);
  std::vector<std::byte> dst(4 * 256);
  std::vector<ReadRequest> two{{{1, 0, 0, 0}, dst.data()}, {{1, 0, 0, 1}, dst.data() + 256}};
  CHECK_NOTHROW(t.wait(t.submit(two)));
  CHECK(std::memcmp(dst.data() + 256, a.data(), 256) == 0);
  CHECK_THROWS_WITH_AS(t.wait(t.submit(two)), doctest::Contains("injected read error"), Error);
  t.heal();
  CHECK_NOTHROW(t.wait(t.submit(two)));
  t.fail_writes_after(1);
  CHECK_NOTHROW(t.write({1, 0, 0, 9}, a.data()));
  CHECK_THROWS_WITH_AS(t.write({1, 0, 0, 10}, a.data()), doctest::Contains("injected write error"), Error);
  CHECK_FALSE(t.contains({1, 0, 0, 10}));
  CHECK(t.injected_errors() == 2);
  CHECK(t.reads() == 6);
}

TEST_CASE("HostTier: each new block of memory goes through the pinning hook; a failing hook fails the allocation") {
  std::vector<std::pair<std::byte*, std::size_t>> blocks;
  HostTier::Params p;
  p.on_new_block = [&](std::byte* at, std::size_t bytes) { blocks.emplace_back(at, bytes); };
  HostTier t(p);
  t.open({4096});
  std::vector<Slot> slots;
  for (int i = 0; i < 3000; ++i) slots.push_back(t.allocate());  // ~4 MiB blocks of 1024 pages
  REQUIRE(blocks.size() == 3);
  for (Slot s : slots) {
    const std::byte* d = t.slot_data(s);
    bool inside = false;
    for (const auto& [at, bytes] : blocks) inside = inside || (d >= at && d + 4096 <= at + bytes);
    CHECK(inside);
  }
  HostTier::Params bad;
  bad.on_new_block = [](std::byte*, std::size_t) { throw Error("cannot pin"); };
  HostTier u(bad);
  u.open({4096});
  CHECK_THROWS_WITH_AS(u.allocate(), doctest::Contains("cannot pin"), Error);
  CHECK(u.used_pages() == 0);
}
