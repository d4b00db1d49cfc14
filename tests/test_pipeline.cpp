// pipeline::Elastic against pipeline::Serial: bitwise the same outputs, statistics and memory for
// any batch, micro-batch size and policy mix; errors in any stage (thrown on the caller's thread
// or a stage thread) roll the step back, and a retried step gives the undisturbed result.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

/// Quest whose select() throws while `fail_selects` is positive (counting down).
struct FlakyQuest : index::Quest {
  static inline std::atomic<int> fail_selects{0};
  static constexpr std::string_view name() { return "flaky-quest"; }
  void select(const State& s, const index::IndexQuery& q, std::vector<std::uint32_t>& out) const {
    if (fail_selects.load() > 0 && fail_selects.fetch_sub(1) == 1) fail("injected select failure");
    index::Quest::select(s, q, out);
  }
};

/// A random workload: `batch` sequences of mixed prompt lengths, decoded for `steps` steps.
struct Workload {
  Config cfg;
  std::vector<int> prompt;
  int steps = 8;
  std::uint64_t seed = 1;

  std::vector<float> rows(int s, int l, int t0, int n, int heads, int salt) const {
    return test::random_floats(static_cast<std::size_t>(n) * heads * cfg.shape.head_dim,
                               seed * 1000003 + static_cast<std::uint64_t>(s) * 7919 + static_cast<std::uint64_t>(l) * 104729 +
                                   static_cast<std::uint64_t>(t0) * 31 + static_cast<std::uint64_t>(salt));
  }
};

template <class M>
std::vector<SeqId> prefill(M& kv, const Workload& w) {
  const auto& sh = w.cfg.shape;
  std::vector<SeqId> ids;
  for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) {
    ids.push_back(kv.add_sequence());
    for (int l = 0; l < sh.layers; ++l) {
      const auto k = w.rows(s, l, 0, w.prompt[s], sh.kv_heads, 1), v = w.rows(s, l, 0, w.prompt[s], sh.kv_heads, 2);
      kv.prefill(ids.back(), l, make_view(k, w.prompt[s], sh.kv_heads, sh.head_dim), make_view(v, w.prompt[s], sh.kv_heads, sh.head_dim));
    }
  }
  return ids;
}

/// One attend() of layer l at decode step `step` for the whole batch.
template <class M>
std::vector<float> step(M& kv, const Workload& w, const std::vector<SeqId>& ids, int l, int step) {
  const auto& sh = w.cfg.shape;
  const int b = static_cast<int>(ids.size()), d = sh.head_dim;
  std::vector<float> q, k, v;
  for (int s = 0; s < b; ++s) {
    const int t = w.prompt[s] + step;
    const auto qs = w.rows(s, l, t, 1, sh.q_heads, 3), ks = w.rows(s, l, t, 1, sh.kv_heads, 1), vs = w.rows(s, l, t, 1, sh.kv_heads, 2);
    q.insert(q.end(), qs.begin(), qs.end());
    k.insert(k.end(), ks.begin(), ks.end());
    v.insert(v.end(), vs.begin(), vs.end());
  }
  std::vector<float> out(q.size());
  kv.attend(l, ids, make_view(q, b, sh.q_heads, d), make_view(k, b, sh.kv_heads, d), make_view(v, b, sh.kv_heads, d),
            make_view(out, b, sh.q_heads, d));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Workload random_workload(std::mt19937_64& rng) {
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.sink_tokens = 4;
  w.cfg.local_tokens = 16;
  w.cfg.dtype = rng() % 2 ? DType::f16 : DType::f32;
  w.cfg.budget = Budget::fraction(0.125 + 0.125 * static_cast<double>(rng() % 3));
  const int batch = 1 + static_cast<int>(rng() % 5);
  for (int s = 0; s < batch; ++s) w.prompt.push_back(20 + static_cast<int>(rng() % 300));
  w.steps = 6 + static_cast<int>(rng() % 6);
  w.seed = rng();
  return w;
}

using Slow = tier::FaultTier<tier::HostTier>;
using TwoTiers = Tiers<tier::HostTier, Slow>;
using ThreeTiers = Tiers<tier::HostTier, Slow, Slow>;

}  // namespace

TEST_CASE("Elastic equals Serial bitwise on random batches of mixed lengths, any micro-batch, any policy mix") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 6 * test::scale(); ++trial) {
    const Workload w = random_workload(rng);
    const int window = static_cast<int>(rng() % 4);
    const std::size_t micro = std::vector<std::size_t>{0, 1, 2, 3, 5, 100}[rng() % 6];
    const unsigned threads = 1 + static_cast<unsigned>(rng() % 3);
    const bool as_fetched = rng() % 2 == 0;
    CAPTURE(trial);
    CAPTURE(as_fetched);
    CAPTURE(w.prompt.size());
    CAPTURE(window);
    CAPTURE(micro);
    CAPTURE(threads);
    auto check = [&](auto& serial, auto& elastic) {
      const auto a = prefill(serial, w), b = prefill(elastic, w);
      for (int s = 0; s < w.steps; ++s)
        for (int l = 0; l < w.cfg.shape.layers; ++l) CHECK(same_bits(step(serial, w, a, l, s), step(elastic, w, b, l, s)));
      const Stats &x = serial.total_stats(), &y = elastic.total_stats();
      CHECK(x.hits == y.hits);
      CHECK(x.misses == y.misses);
      CHECK(x.evictions == y.evictions);
      CHECK(x.bytes_read == y.bytes_read);
      CHECK(x.bytes_written == y.bytes_written);
      CHECK(serial.tiers().fast().used_pages() == elastic.tiers().fast().used_pages());
      CHECK(y.time.overlap_ms > 0);
    };
    {
      KvManager<index::Quest, eviction::Lookahead, TwoTiers> serial(w.cfg, {}, eviction::Lookahead{window}, {}, {}, backend::Cpu({threads}));
      KvManager<index::Quest, eviction::Lookahead, TwoTiers, pipeline::Elastic> elastic(
          w.cfg, {}, eviction::Lookahead{window}, {}, pipeline::Elastic({micro, as_fetched}), backend::Cpu({threads}));
      check(serial, elastic);
    }
    {
      auto three = [] { return ThreeTiers(tier::HostTier{}, Slow(tier::HostTier({64, 64})), Slow(tier::HostTier{})); };
      KvManager<index::Hierarchical, eviction::Lru, ThreeTiers> serial(w.cfg, {}, eviction::Lru{window}, three(), {}, backend::Cpu({threads}));
      KvManager<index::Hierarchical, eviction::Lru, ThreeTiers, pipeline::Elastic> elastic(
          w.cfg, {}, eviction::Lru{window}, three(), pipeline::Elastic({micro, as_fetched}), backend::Cpu({threads}));
      check(serial, elastic);
    }
  }
}

TEST_CASE("Elastic under random faults in every stage: a failed step changes nothing, its retry gives the undisturbed result") {
  std::mt19937_64 rng(11);
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.budget = Budget::fraction(0.25);
  w.prompt = {300, 120, 41, 260};
  w.steps = 40 * test::scale();
  KvManager<FlakyQuest, eviction::Lookahead, ThreeTiers> reference(
      w.cfg, {}, {}, ThreeTiers(tier::HostTier{}, Slow(tier::HostTier({100, 64})), Slow(tier::HostTier{})));
  KvManager<FlakyQuest, eviction::Lookahead, ThreeTiers, pipeline::Elastic> kv(
      w.cfg, {}, {}, ThreeTiers(tier::HostTier{}, Slow(tier::HostTier({100, 64})), Slow(tier::HostTier{})), pipeline::Elastic({2}),
      backend::Cpu({2}));
  const auto ref_ids = prefill(reference, w), ids = prefill(kv, w);
  int failures = 0;
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < w.cfg.shape.layers; ++l) {
      const auto expect = step(reference, w, ref_ids, l, s);
      const std::size_t used = kv.tiers().fast().used_pages();
      const std::size_t middle = kv.tiers().get<1>().inner().stored_pages(), last = kv.tiers().get<2>().inner().stored_pages();
      // A fault in one stage, at a random point of it: a read (fetch, on the fetch thread), a
      // write of a sealed page (on the fetch thread, while compute runs), or a selection (on the
      // caller's thread).
      switch (rng() % 5) {
        case 0: kv.tiers().get<2>().fail_reads_after(rng() % 4); break;
        case 1: kv.tiers().get<1>().fail_writes_after(0); break;
        case 2: kv.tiers().get<2>().fail_writes_after(0); break;
        case 3: FlakyQuest::fail_selects = 1 + static_cast<int>(rng() % 8); break;
        default: break;
      }
      std::vector<float> got;
      try {
        got = step(kv, w, ids, l, s);
      } catch (const Error&) {
        ++failures;
        CHECK(kv.tiers().fast().used_pages() == used);
        CHECK(kv.tiers().get<1>().inner().stored_pages() == middle);
        CHECK(kv.tiers().get<2>().inner().stored_pages() == last);
        kv.tiers().get<1>().heal();
        kv.tiers().get<2>().heal();
        FlakyQuest::fail_selects = 0;
        got = step(kv, w, ids, l, s);  // the retry
      }
      kv.tiers().get<1>().heal();
      kv.tiers().get<2>().heal();
      FlakyQuest::fail_selects = 0;
      CHECK(same_bits(got, expect));
    }
  MESSAGE("Elastic fault stress: ", failures, " failed steps retried over ", w.steps * w.cfg.shape.layers, " layer steps");
  CHECK(failures > 0);
  CHECK(kv.total_stats().misses == reference.total_stats().misses);
  CHECK(kv.total_stats().hits == reference.total_stats().hits);
  CHECK(kv.tiers().fast().used_pages() == reference.tiers().fast().used_pages());
  for (SeqId id : ids) kv.release(id);
  CHECK(kv.tiers().fast().used_pages() == 0);
  CHECK(kv.tiers().get<1>().inner().stored_pages() == 0);
  CHECK(kv.tiers().get<2>().inner().stored_pages() == 0);
}

TEST_CASE("Elastic over an SSD store: several micro-batches' reads in flight at once, the same bits as Serial, faults roll back") {
  test::TempDir dir;
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.budget = Budget::fraction(0.25);
  w.prompt = {300, 180, 250};
  w.steps = 12;
  using Ssd = tier::FaultTier<tier::SsdTier>;
  using SsdTiers = Tiers<tier::HostTier, Ssd>;
  auto store = [&](const char* name) {
    tier::SsdTier::Params p;
    p.path = dir.file(name);
    p.alignment = 4096;
    return SsdTiers(tier::HostTier{}, Ssd(tier::SsdTier(p)));
  };
  KvManager<index::Quest, eviction::Lookahead, SsdTiers> serial(w.cfg, {}, eviction::Lookahead{1}, store("serial"));
  KvManager<index::Quest, eviction::Lookahead, SsdTiers, pipeline::Elastic> elastic(w.cfg, {}, eviction::Lookahead{1}, store("elastic"),
                                                                                   pipeline::Elastic({1}), backend::Cpu({2}));
  const auto a = prefill(serial, w), b = prefill(elastic, w);
  std::mt19937_64 rng(5);
  int failures = 0;
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < w.cfg.shape.layers; ++l) {
      const auto expect = step(serial, w, a, l, s);
      const std::size_t used = elastic.tiers().fast().used_pages(), stored = elastic.tiers().get<1>().inner().stored_pages();
      if (rng() % 3 == 0) elastic.tiers().get<1>().fail_reads_after(rng() % 6);  // one micro-batch's reads fail, others in flight
      std::vector<float> got;
      try {
        got = step(elastic, w, b, l, s);
      } catch (const Error&) {
        ++failures;
        CHECK(elastic.tiers().fast().used_pages() == used);
        CHECK(elastic.tiers().get<1>().inner().stored_pages() == stored);
        elastic.tiers().get<1>().heal();
        got = step(elastic, w, b, l, s);
      }
      elastic.tiers().get<1>().heal();
      CHECK(same_bits(got, expect));
    }
  CHECK(failures > 0);
  CHECK(elastic.total_stats().misses == serial.total_stats().misses);
  CHECK(elastic.total_stats().misses > 0);
  CHECK(elastic.tiers().get<1>().inner().read_batches() > serial.tiers().get<1>().inner().read_batches());  // per micro-batch
}

TEST_CASE("Elastic's micro-batches and stage statistics") {
  pipeline::Elastic auto_size, fixed({3});
  CHECK(auto_size.micro_batch_for(1) == 1);
  CHECK(auto_size.micro_batch_for(8) == 2);
  CHECK(auto_size.micro_batch_for(9) == 3);
  CHECK(fixed.micro_batch_for(2) == 2);
  CHECK(fixed.micro_batch_for(10) == 3);
  pipeline::Elastic copy = fixed;  // a copy has its own stage threads, and the same size
  CHECK(copy.micro_batch_for(10) == 3);

  StageTimes t;
  t.select_ms = 2;
  t.classify_ms = 1;
  t.fetch_ms = 3;
  t.overlap_ms = 4;
  CHECK(t.select_bubble() == doctest::Approx(0.5));
  CHECK(t.classify_bubble() == doctest::Approx(0.75));
  CHECK(t.fetch_bubble() == doctest::Approx(0.25));
  CHECK(StageTimes{}.fetch_bubble() == 0.0);
}

TEST_CASE("tune() picks a micro-batch size from dry steps and changes nothing else") {
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.budget = Budget::fraction(0.25);
  w.prompt = {300, 120, 260};
  w.steps = 4;
  KvManager<index::Quest, eviction::Lookahead, TwoTiers> reference(w.cfg);
  KvManager<index::Quest, eviction::Lookahead, TwoTiers, pipeline::Elastic> kv(w.cfg);
  const auto ref_ids = prefill(reference, w), ids = prefill(kv, w);
  const auto& sh = w.cfg.shape;
  const std::size_t used = kv.tiers().fast().used_pages(), slow = kv.tiers().get<1>().inner().stored_pages();
  std::vector<float> q = w.rows(0, 0, 999, 3, sh.q_heads, 5), k = w.rows(0, 0, 999, 3, sh.kv_heads, 6), v = w.rows(0, 0, 999, 3, sh.kv_heads, 7);
  std::vector<float> out(q.size());
  const auto report = kv.tune(0, ids, make_view(q, 3, sh.q_heads, sh.head_dim), make_view(k, 3, sh.kv_heads, sh.head_dim),
                              make_view(v, 3, sh.kv_heads, sh.head_dim), make_view(out, 3, sh.q_heads, sh.head_dim));
  // 3 sequences x 4 KV heads = 12 streams: sizes 12, 6, 3, 1 (12 / 8 rounds down to 1).
  REQUIRE(report.step_ms.size() == 4);
  CHECK(report.step_ms[0].first == 12);
  CHECK(report.step_ms[3].first == 1);
  CHECK(kv.pipeline_policy().micro_batch_for(12) == report.micro_batch);
  bool listed = false;
  for (const auto& [mb, ms] : report.step_ms) {
    CHECK(ms > 0);
    listed = listed || mb == report.micro_batch;
  }
  CHECK(listed);
  // Nothing changed: no step counted, no page kept, and the next steps equal the reference's.
  CHECK(kv.total_stats().steps == 0);
  CHECK(kv.tiers().fast().used_pages() == used);
  CHECK(kv.tiers().get<1>().inner().stored_pages() == slow);
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < sh.layers; ++l) CHECK(same_bits(step(kv, w, ids, l, s), step(reference, w, ref_ids, l, s)));
  const std::size_t used_after = kv.tiers().fast().used_pages();
  // A read failing during calibration: the error reaches the caller, nothing changes.
  kv.tiers().get<1>().fail_reads_after(1);
  CHECK_THROWS_WITH_AS(kv.tune(0, ids, make_view(q, 3, sh.q_heads, sh.head_dim), make_view(k, 3, sh.kv_heads, sh.head_dim),
                               make_view(v, 3, sh.kv_heads, sh.head_dim), make_view(out, 3, sh.q_heads, sh.head_dim)),
                       doctest::Contains("injected"), Error);
  kv.tiers().get<1>().heal();
  CHECK(kv.tiers().fast().used_pages() == used_after);
  CHECK(kv.total_stats().steps == static_cast<std::uint64_t>(w.steps * sh.layers));
  // Bad input is refused before anything runs.
  CHECK_THROWS_AS(kv.tune(0, ids, make_view(q, 3, sh.q_heads, sh.head_dim), make_view(k, 3, sh.kv_heads, sh.head_dim),
                          make_view(v, 3, sh.kv_heads, sh.head_dim), make_view(out, 3, sh.q_heads, sh.head_dim), 0),
                  Error);
}
