// KvManager over a fast tier in device memory (tier::DeviceFastTier + backend::DeviceBackend),
// on the emulated device of device_emulation.hpp: the host never touches a slot's bytes (an
// access would fault), and the outputs are the host path's bits (Decision 2), with any
// pipeline, tiers, warm-up and cluster tuning; a failed step changes nothing.
#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "device_emulation.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "fault_tier.hpp"
#include "support.hpp"
#include "workload.hpp"

using namespace kvdrive;
using namespace kvdrive::test;

namespace {

using Slow = tier::FaultTier<tier::HostTier>;  // not addressable: read through fetches
using HostTiers = Tiers<tier::HostTier, Slow>;
using DeviceTiers = Tiers<EmulatedDeviceTier, Slow>;

template <class Index, class Pipeline = pipeline::Serial>
using OnDevice = KvManager<Index, eviction::Lookahead, DeviceTiers, Pipeline, EmulatedDeviceBackend>;

/// Quest with batch selection (index::BatchSelectIndex), as a GPU index has it: select_batch
/// selects each stream on the host, and counts its calls.
struct BatchQuest : index::Quest {
  static inline std::atomic<int> calls{0};
  static constexpr std::string_view name() { return "batch-quest"; }
  void select_batch(std::span<const State* const> states, std::span<const index::IndexQuery> queries,
                    std::span<std::vector<std::uint32_t>* const> outs) const {
    ++calls;
    for (std::size_t i = 0; i < states.size(); ++i) {
      outs[i]->clear();
      select(*states[i], queries[i], *outs[i]);
    }
  }
};
static_assert(index::BatchSelectIndex<BatchQuest> && !index::BatchSelectIndex<index::Quest>);

}  // namespace

TEST_CASE("The emulated device's addresses are not host addresses") {
  EmulatedDeviceTier t;
  t.open({64});
  const Slot s = t.allocate();
  std::vector<std::byte> in(64, std::byte{7}), out(64);
  t.upload(s, 0, in.data(), 64);
  t.download(s, out.data());
  CHECK(out == in);
  CHECK(to_host(t.slot_data(s)) != t.slot_data(s));
  CHECK(to_device(const_cast<std::byte*>(to_host(t.slot_data(s)))) == t.slot_data(s));
  CHECK_THROWS_AS(t.upload(s, 60, in.data(), 8), Error);
}

TEST_CASE("A device fast tier gives the host path's bits, under Serial and Elastic, and moves every page through upload") {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 4 * test::scale(); ++trial) {
    const Workload w = random_workload(rng);
    const int window = static_cast<int>(rng() % 4);
    const std::size_t micro = std::vector<std::size_t>{0, 1, 3}[rng() % 3];
    CAPTURE(trial);
    CAPTURE(window);
    CAPTURE(micro);
    KvManager<index::Quest, eviction::Lookahead, HostTiers> host(w.cfg, {}, eviction::Lookahead{window});
    OnDevice<index::Quest> serial(w.cfg, {}, eviction::Lookahead{window});
    OnDevice<index::Quest, pipeline::Elastic> elastic(w.cfg, {}, eviction::Lookahead{window}, {}, pipeline::Elastic({micro}));
    const auto a = prefill(host, w), b = prefill(serial, w), c = prefill(elastic, w);
    for (int s = 0; s < w.steps; ++s)
      for (int l = 0; l < w.cfg.shape.layers; ++l) {
        const auto expect = step(host, w, a, l, s);
        CHECK(same_bits(step(serial, w, b, l, s), expect));
        CHECK(same_bits(step(elastic, w, c, l, s), expect));
        CHECK(serial.staging_pages() == 0);
      }
    const Stats &h = host.total_stats(), &d = serial.total_stats(), &e = elastic.total_stats();
    // The same tier behind: the same hits and misses.
    CHECK(d.selected == h.selected);
    CHECK(d.hits == h.hits);
    CHECK(d.misses == h.misses);
    CHECK(e.misses == d.misses);
    CHECK(e.hits == d.hits);
    CHECK(serial.tiers().fast().used_pages() == elastic.tiers().fast().used_pages());
    const auto& counters = serial.tiers().fast().counters;
    CHECK(counters.uploaded >= d.misses * w.cfg.page_bytes());
    if (d.misses > 0) CHECK(counters.pinned > 0);  // the staging pool is pinned
  }
}

TEST_CASE("A device attends nothing in place: pages of an addressable host tier are fetched, with the same bits") {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 2 * test::scale(); ++trial) {
    const Workload w = random_workload(rng);
    CAPTURE(trial);
    using HostDram = Tiers<tier::HostTier, tier::HostTier>;
    using DeviceDram = Tiers<EmulatedDeviceTier, tier::HostTier>;
    KvManager<index::Quest, eviction::Lookahead, HostDram> host(w.cfg, {}, eviction::Lookahead{2});
    KvManager<index::Quest, eviction::Lookahead, DeviceDram, pipeline::Serial, EmulatedDeviceBackend> device(w.cfg, {}, eviction::Lookahead{2});
    const auto a = prefill(host, w), b = prefill(device, w);
    for (int s = 0; s < w.steps; ++s)
      for (int l = 0; l < w.cfg.shape.layers; ++l) CHECK(same_bits(step(device, w, b, l, s), step(host, w, a, l, s)));
    const Stats &h = host.total_stats(), &d = device.total_stats();
    CHECK(d.selected == h.selected);
    if (h.selected > 0) CHECK(h.in_place > 0);  // the CPU attends its DRAM tier where it is
    CHECK(d.in_place == 0);                     // the device reads those pages up
    CHECK(d.hits + d.misses == d.selected);
    CHECK(d.misses > h.misses);
  }
}

TEST_CASE("A device fast tier alone keeps every page: no page without a backing copy is evicted, and the bits are the host path's") {
  // kvd-llama --device cuda --mode sparse|dense: Tiers<DeviceTier> alone, so every page lives in
  // its fast slot for good. The cache policy must never evict one (its bytes would be lost, and
  // a later selection would attend a stale slot); the first GPU run found exactly that.
  std::mt19937_64 rng(29);
  for (int trial = 0; trial < 3 * test::scale(); ++trial) {
    const Workload w = random_workload(rng);
    const int window = static_cast<int>(rng() % 3);  // W = 0 evicts every page after its step
    CAPTURE(trial);
    CAPTURE(window);
    KvManager<index::Quest, eviction::Lookahead, Tiers<tier::HostTier>> host(w.cfg, {}, eviction::Lookahead{window});
    KvManager<index::Quest, eviction::Lookahead, Tiers<EmulatedDeviceTier>, pipeline::Serial, EmulatedDeviceBackend> device(
        w.cfg, {}, eviction::Lookahead{window});
    const auto a = prefill(host, w), b = prefill(device, w);
    for (int s = 0; s < w.steps; ++s)
      for (int l = 0; l < w.cfg.shape.layers; ++l) CHECK(same_bits(step(device, w, b, l, s), step(host, w, a, l, s)));
    const Stats& d = device.total_stats();
    CHECK(d.misses == 0);
    CHECK(d.evictions == 0);
    CHECK(d.hits == d.selected);
  }
}

TEST_CASE("Device fast tier: prefill in chunks that end mid-page and on page boundaries, with failed writes retried, gives the host path's bits") {
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.budget = Budget::fraction(0.25);
  w.prompt = {203};
  w.steps = 6;
  const auto& sh = w.cfg.shape;
  KvManager<index::Quest, eviction::Lookahead, HostTiers> host(w.cfg);
  OnDevice<index::Quest> device(w.cfg);
  const std::vector<SeqId> a{host.add_sequence()}, b{device.add_sequence()};
  int failures = 0;
  for (int l = 0; l < sh.layers; ++l) {
    const auto k = w.rows(0, l, 0, w.prompt[0], sh.kv_heads, 1), v = w.rows(0, l, 0, w.prompt[0], sh.kv_heads, 2);
    const std::size_t row = static_cast<std::size_t>(sh.kv_heads) * sh.head_dim;
    int at = 0;
    for (int chunk : {5, 3, 16, 27, 1, 151}) {  // ends at 5, 8, 24, 51, 52, 203
      const auto kv = make_view(k.data() + at * row, chunk, sh.kv_heads, sh.head_dim),
                 vv = make_view(v.data() + at * row, chunk, sh.kv_heads, sh.head_dim);
      host.prefill(a[0], l, kv, vv);
      if (chunk > 8) {
        device.tiers().get<1>().fail_writes_after(0);  // this chunk seals pages: its writes fail once
        const std::size_t used = device.tiers().fast().used_pages();
        CHECK_THROWS_AS(device.prefill(b[0], l, kv, vv), Error);
        CHECK(device.tiers().fast().used_pages() == used);
        CHECK(device.length(b[0], l) == at);
        device.tiers().get<1>().heal();
        ++failures;
      }
      device.prefill(b[0], l, kv, vv);
      at += chunk;
    }
  }
  CHECK(failures > 0);
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < sh.layers; ++l) CHECK(same_bits(step(device, w, b, l, s), step(host, w, a, l, s)));
  CHECK(device.tiers().fast().used_pages() == host.tiers().fast().used_pages());
}

TEST_CASE(
    "An index that selects a micro-batch in one call gets every stream with candidates, once per micro-batch (up to three rounds with the focus "
    "carry), with the same bits") {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 6 * test::scale(); ++trial) {
    Workload w = random_workload(rng);
    const bool carry = trial % 2 == 1;
    if (!carry) w.cfg.carry.share = 0.0f;
    const int rounds = carry ? 3 : 1;  // the carry may ask again, each time in one call (focus_carry.hpp)
    const std::size_t micro = std::vector<std::size_t>{1, 2, 100}[rng() % 3];
    CAPTURE(trial);
    CAPTURE(micro);
    OnDevice<index::Quest> reference(w.cfg);
    OnDevice<BatchQuest, pipeline::Elastic> batched(w.cfg, {}, {}, {}, pipeline::Elastic({micro}));
    KvManager<BatchQuest, eviction::Lookahead, HostTiers> on_host(w.cfg);  // the CPU path takes it too
    const auto a = prefill(reference, w), b = prefill(batched, w), c = prefill(on_host, w);
    int batched_calls = 0, host_calls = 0;
    for (int s = 0; s < w.steps; ++s)
      for (int l = 0; l < w.cfg.shape.layers; ++l) {
        const auto expect = step(reference, w, a, l, s);
        int before = BatchQuest::calls;
        CHECK(same_bits(step(batched, w, b, l, s), expect));
        const auto n = a.size() * static_cast<std::size_t>(w.cfg.shape.kv_heads), mb = batched.pipeline_policy().micro_batch_for(n);
        CHECK(BatchQuest::calls - before <= rounds * static_cast<int>((n + mb - 1) / mb));  // one call per micro-batch and round
        batched_calls += BatchQuest::calls - before;
        before = BatchQuest::calls;
        CHECK(same_bits(step(on_host, w, c, l, s), expect));
        CHECK(BatchQuest::calls - before <= rounds);  // Serial: the whole batch in one call a round
        host_calls += BatchQuest::calls - before;
      }
    CHECK(batched.total_stats().selected == reference.total_stats().selected);
    if (reference.total_stats().selected > 0) {
      CHECK(batched_calls > 0);
      CHECK(host_calls > 0);
    }
  }
}

TEST_CASE("Device fast tier over an SSD store: warm-up, cluster tuning and decode give the host path's bits and statistics") {
  TempDir dir;
  Workload w;
  w.cfg.shape = {2, 8, 2, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.dtype = DType::f16;
  w.cfg.budget = Budget::fraction(0.125);
  w.prompt = {400, 230};
  w.steps = 10;
  using HostSsd = Tiers<tier::HostTier, tier::SsdTier>;
  using DeviceSsd = Tiers<EmulatedDeviceTier, tier::SsdTier>;
  auto ssd = [&](const char* name) {
    tier::SsdTier::Params p;
    p.path = dir.file(name);
    return tier::SsdTier(p);
  };
  KvManager<index::Hierarchical, eviction::Lookahead, HostSsd> host(w.cfg, {}, eviction::Lookahead{2}, HostSsd(tier::HostTier{}, ssd("h")));
  KvManager<index::Hierarchical, eviction::Lookahead, DeviceSsd, pipeline::Elastic, EmulatedDeviceBackend> device(
      w.cfg, {}, eviction::Lookahead{2}, DeviceSsd(EmulatedDeviceTier{}, ssd("d")), pipeline::Elastic({1}));
  const auto& sh = w.cfg.shape;
  const auto a = prefill(host, w), b = prefill(device, w);
  // The prompt's last 16 queries of each sequence, for tuning and placement.
  for (std::size_t s = 0; s < w.prompt.size(); ++s)
    for (int l = 0; l < sh.layers; ++l) {
      const int obs = 16;
      const auto q = w.rows(static_cast<int>(s), l, w.prompt[s] - obs, obs, sh.q_heads, 3);
      const auto view = make_view(q, obs, sh.q_heads, sh.head_dim);
      if (s == 0 && l == 0) {
        // One size, so that timing cannot make the two choose differently.
        const std::vector<int> sizes{16};
        const auto x = host.tune_clusters(a[s], l, view, sizes), y = device.tune_clusters(b[s], l, view, sizes);
        CHECK(x.cases.at(0).mass_recall == y.cases.at(0).mass_recall);  // the same keys, downloaded from the device
      } else {
        host.reindex(a[s], l);
        device.reindex(b[s], l);
      }
      CHECK(host.warm_up(a[s], l, view) == device.warm_up(b[s], l, view));
    }
  CHECK(device.staging_pages() == 0);
  CHECK(device.tiers().fast().counters.downloaded > 0);  // keys of resident pages came back for tuning
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < sh.layers; ++l) CHECK(same_bits(step(device, w, b, l, s), step(host, w, a, l, s)));
  const Stats &h = host.total_stats(), &d = device.total_stats();
  CHECK(d.misses > 0);
  CHECK(d.misses == h.misses);  // the SSD is not attended in place by either
  CHECK(d.hits == h.hits);
  CHECK(d.bytes_read == h.bytes_read);
  CHECK(d.bytes_written == h.bytes_written);
  CHECK(device.tiers().fast().used_pages() == host.tiers().fast().used_pages());
  CHECK(device.staging_pages() == 0);
}

TEST_CASE("Device fast tier: a failed read or write changes nothing, frees its staging pages, and the retry gives the reference bits") {
  std::mt19937_64 rng(3);
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.budget = Budget::fraction(0.25);
  w.prompt = {300, 120, 260};
  w.steps = 16 * test::scale();
  KvManager<index::Quest, eviction::Lookahead, HostTiers> reference(w.cfg);
  OnDevice<index::Quest, pipeline::Elastic> kv(w.cfg, {}, {}, {}, pipeline::Elastic({2}));
  const auto ref_ids = prefill(reference, w), ids = prefill(kv, w);
  int failures = 0;
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < w.cfg.shape.layers; ++l) {
      const auto expect = step(reference, w, ref_ids, l, s);
      const std::size_t used = kv.tiers().fast().used_pages(), stored = kv.tiers().get<1>().inner().stored_pages();
      switch (rng() % 3) {
        case 0: kv.tiers().get<1>().fail_reads_after(rng() % 4); break;
        case 1: kv.tiers().get<1>().fail_writes_after(0); break;
        default: break;
      }
      std::vector<float> got;
      try {
        got = step(kv, w, ids, l, s);
      } catch (const Error&) {
        ++failures;
        CHECK(kv.tiers().fast().used_pages() == used);
        CHECK(kv.tiers().get<1>().inner().stored_pages() == stored);
        CHECK(kv.staging_pages() == 0);
        kv.tiers().get<1>().heal();
        got = step(kv, w, ids, l, s);
      }
      kv.tiers().get<1>().heal();
      CHECK(same_bits(got, expect));
    }
  CHECK(failures > 0);
  for (SeqId id : ids) kv.release(id);
  CHECK(kv.tiers().fast().used_pages() == 0);
  CHECK(kv.staging_pages() == 0);
}
