// pipeline::Elastic against pipeline::Serial: bitwise the same outputs, statistics and memory for
// any batch, micro-batch size and policy mix; errors in any stage (thrown on the caller's thread
// or a stage thread) roll the step back, and a retried step gives the undisturbed result.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "fault_tier.hpp"
#include "support.hpp"
#include "workload.hpp"

using namespace kvdrive;
using namespace kvdrive::test;

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

/// Serial as it was before compute_ready: select, classify, fetch, compute, commit, with no
/// split attended early. Serial must give its bits.
struct PlainSerial {
  static constexpr std::string_view name() { return "plain-serial"; }
  template <pipeline::StepStages S>
  void run(S& s) const {
    const std::size_t n = s.streams();
    s.parallel_for(n, [&](std::size_t i) { s.select(i); });
    for (std::size_t i = 0; i < n; ++i) s.classify(i);
    for (std::size_t i = 0; i < n; ++i) s.fetch(i);
    s.compute(0, n);
    s.commit();
  }
};

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

TEST_CASE("Serial's early attention of resident splits gives the bits of attending everything after the fetch") {
  test::TempDir dir;
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 3 * test::scale(); ++trial) {
    const Workload w = random_workload(rng);
    CAPTURE(trial);
    using SsdTiers = Tiers<tier::HostTier, tier::SsdTier>;
    auto store = [&](const char* name) {
      tier::SsdTier::Params p;
      p.path = dir.file(name);
      tier::SsdTier::remove_files(p.path);
      return SsdTiers(tier::HostTier{}, tier::SsdTier(p));
    };
    KvManager<index::Quest, eviction::Lookahead, SsdTiers> serial(w.cfg, {}, eviction::Lookahead{1}, store("a"));
    KvManager<index::Quest, eviction::Lookahead, SsdTiers, PlainSerial> plain(w.cfg, {}, eviction::Lookahead{1}, store("b"));
    const auto a = prefill(serial, w), b = prefill(plain, w);
    for (int s = 0; s < w.steps; ++s)
      for (int l = 0; l < w.cfg.shape.layers; ++l) CHECK(same_bits(step(serial, w, a, l, s), step(plain, w, b, l, s)));
    CHECK(serial.total_stats().misses > 0);  // splits waited for reads
    CHECK(serial.total_stats().misses == plain.total_stats().misses);
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

namespace {

/// The share of the candidate tokens' attention mass on `pages`, for query head h, by brute force
/// over tokens (softmax over the candidate pages' tokens).
double brute_mass(const std::vector<float>& keys, const float* q, int d, int pt, float scale, std::int64_t first, std::int64_t end,
                  const std::vector<std::uint32_t>& pages) {
  std::vector<double> logits;
  for (std::int64_t t = first * pt; t < end * pt; ++t) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += static_cast<double>(q[j]) * keys[static_cast<std::size_t>(t) * d + j];
    logits.push_back(s * scale);
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  double all = 0, chosen = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double e = std::exp(logits[i] - top);
    all += e;
    const auto page = static_cast<std::uint32_t>(first + static_cast<std::int64_t>(i) / pt);
    if (std::find(pages.begin(), pages.end(), page) != pages.end()) chosen += e;
  }
  return chosen / all;
}

}  // namespace

TEST_CASE("candidate_mass_recall matches brute-force softmax over the candidate tokens") {
  const int d = 16, pt = 4, pages = 30, group = 2;
  const auto keys = test::random_floats(static_cast<std::size_t>(pages) * pt * d, 11);
  const auto q = test::random_floats(static_cast<std::size_t>(group) * d, 12, 2.0f);
  index::ClusterCalibration c;
  c.keys = index::PageKeys{keys.data(), 0, pages, pt, d, DType::f32};
  c.group = group;
  c.scale = 0.25f;
  c.first_candidate = 2;
  c.end_candidate = 27;
  const std::vector<std::uint32_t> some = {3, 7, 8, 20, 26};
  std::vector<std::uint32_t> all;
  for (std::uint32_t p = 2; p < 27; ++p) all.push_back(p);
  double expected = 0;
  for (int h = 0; h < group; ++h) expected += brute_mass(keys, q.data() + h * d, d, pt, c.scale, 2, 27, some) / group;
  CHECK(index::candidate_mass_recall(c, q.data(), some) == doctest::Approx(expected).epsilon(1e-9));
  CHECK(index::candidate_mass_recall(c, q.data(), all) == doctest::Approx(1.0).epsilon(1e-12));
  CHECK(index::candidate_mass_recall(c, q.data(), {}) == 0.0);
}

TEST_CASE("tune_clusters() chooses by its rule and re-indexes the layer, reindex() another, as a fresh prefill at that size would") {
  Config cfg;
  cfg.shape = {2, 8, 4, 32};
  cfg.page_tokens = 8;
  cfg.sink_tokens = 8;
  cfg.local_tokens = 16;
  cfg.budget = Budget::fraction(0.125);
  const auto& sh = cfg.shape;
  const int tokens = 900, observed = 8;
  using M = KvManager<index::Hierarchical, eviction::Lookahead, TwoTiers>;
  M kv(cfg);
  const SeqId id = kv.add_sequence();
  auto keys_of = [&](int l) { return test::random_floats(static_cast<std::size_t>(tokens) * sh.kv_heads * sh.head_dim, 100 + l); };
  auto values_of = [&](int l) { return test::random_floats(static_cast<std::size_t>(tokens) * sh.kv_heads * sh.head_dim, 200 + l); };
  const auto k0 = keys_of(0), v0 = values_of(0), k1 = keys_of(1), v1 = values_of(1);
  kv.prefill(id, 0, make_view(k0, tokens, sh.kv_heads, sh.head_dim), make_view(v0, tokens, sh.kv_heads, sh.head_dim));
  kv.prefill(id, 1, make_view(k1, tokens, sh.kv_heads, sh.head_dim), make_view(v1, tokens, sh.kv_heads, sh.head_dim));
  const auto q_obs = test::random_floats(static_cast<std::size_t>(observed) * sh.q_heads * sh.head_dim, 300, 2.0f);
  const std::vector<int> sizes = {1, 4, 16, 64};

  // Bad input is refused, and changes nothing.
  CHECK_THROWS_AS(kv.tune_clusters(id, 0, make_view(q_obs, 0, sh.q_heads, sh.head_dim), sizes), Error);
  CHECK_THROWS_AS(kv.tune_clusters(id, 0, make_view(q_obs, observed, sh.q_heads, sh.head_dim), std::vector<int>{}), Error);
  CHECK_THROWS_AS(kv.tune_clusters(id, 0, make_view(q_obs, observed, sh.q_heads, sh.head_dim), std::vector<int>{4, 0}), Error);
  CHECK(kv.index_policy().params.pages_per_cluster == index::HierarchicalParams{}.pages_per_cluster);

  const auto choice = kv.tune_clusters(id, 0, make_view(q_obs, observed, sh.q_heads, sh.head_dim), sizes, 0.02);
  REQUIRE(choice.cases.size() == sizes.size());
  for (const auto& c : choice.cases)
    MESSAGE(fmt::format("cluster size {:3}: select {:7.1f} us, mass recall {:.4f}, index {} B", c.pages_per_cluster, c.select_us, c.mass_recall,
                        c.index_bytes));
  double best = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CHECK(choice.cases[i].pages_per_cluster == sizes[i]);
    CHECK(choice.cases[i].mass_recall > 0.0);
    CHECK(choice.cases[i].mass_recall <= 1.0 + 1e-9);
    CHECK(choice.cases[i].select_us > 0.0);
    best = std::max(best, choice.cases[i].mass_recall);
  }
  // Fewer, larger clusters make a smaller index.
  CHECK(choice.cases.back().index_bytes < choice.cases.front().index_bytes);
  // The rule: of the sizes within the tolerance of the best recall, the fastest, where times
  // within 10% tie and the largest tied size wins.
  const auto chosen =
      std::find_if(choice.cases.begin(), choice.cases.end(), [&](const auto& c) { return c.pages_per_cluster == choice.pages_per_cluster; });
  REQUIRE(chosen != choice.cases.end());
  CHECK(chosen->mass_recall >= best - 0.02);
  double fastest = 1e300;
  for (const auto& c : choice.cases)
    if (c.mass_recall >= best - 0.02) fastest = std::min(fastest, c.select_us);
  CHECK(chosen->select_us <= fastest * 1.1);
  for (const auto& c : choice.cases)
    if (c.mass_recall >= best - 0.02 && c.select_us <= fastest * 1.1) CHECK(c.pages_per_cluster <= chosen->pages_per_cluster);
  CHECK(kv.index_policy().params.pages_per_cluster == choice.pages_per_cluster);

  // A manager built with that size from the start: the same clusters for layer 0 (re-indexed by
  // tune_clusters) and layer 1 (by reindex), and the same decode outputs.
  kv.reindex(id, 1);
  index::HierarchicalParams p;
  p.pages_per_cluster = choice.pages_per_cluster;
  M fresh(cfg, index::Hierarchical{p});
  const SeqId fid = fresh.add_sequence();
  fresh.prefill(fid, 0, make_view(k0, tokens, sh.kv_heads, sh.head_dim), make_view(v0, tokens, sh.kv_heads, sh.head_dim));
  fresh.prefill(fid, 1, make_view(k1, tokens, sh.kv_heads, sh.head_dim), make_view(v1, tokens, sh.kv_heads, sh.head_dim));
  for (int l = 0; l < sh.layers; ++l)
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto& a = kv.index_state(id, l, h);
      const auto& b = fresh.index_state(fid, l, h);
      CHECK(a.cluster_of == b.cluster_of);
      CHECK(a.centroids == b.centroids);
    }
  for (int s = 0; s < 3; ++s)
    for (int l = 0; l < sh.layers; ++l) {
      const auto q = test::random_floats(static_cast<std::size_t>(sh.q_heads) * sh.head_dim, 400 + s * 10 + l);
      const auto k = test::random_floats(static_cast<std::size_t>(sh.kv_heads) * sh.head_dim, 500 + s * 10 + l);
      const auto v = test::random_floats(static_cast<std::size_t>(sh.kv_heads) * sh.head_dim, 600 + s * 10 + l);
      std::vector<float> oa(q.size()), ob(q.size());
      const SeqId ia[] = {id}, ib[] = {fid};
      kv.attend(l, ia, make_view(q, 1, sh.q_heads, sh.head_dim), make_view(k, 1, sh.kv_heads, sh.head_dim), make_view(v, 1, sh.kv_heads, sh.head_dim),
                make_view(oa, 1, sh.q_heads, sh.head_dim));
      fresh.attend(l, ib, make_view(q, 1, sh.q_heads, sh.head_dim), make_view(k, 1, sh.kv_heads, sh.head_dim),
                   make_view(v, 1, sh.kv_heads, sh.head_dim), make_view(ob, 1, sh.q_heads, sh.head_dim));
      CHECK(same_bits(oa, ob));
    }
  // After decoding, tuning is refused.
  CHECK_THROWS_WITH_AS(kv.tune_clusters(id, 0, make_view(q_obs, observed, sh.q_heads, sh.head_dim)), doctest::Contains("already decoded"), Error);
  CHECK_THROWS_WITH_AS(kv.reindex(id, 1), doctest::Contains("already decoded"), Error);
}

TEST_CASE("grow_windows() grows W while the reads outlast selection, within max_window, steps and the fast tier's room") {
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.budget = Budget::fraction(0.25);
  w.prompt = {300, 260};
  w.steps = 8;
  const auto& sh = w.cfg.shape;
  KvManager<index::Quest, eviction::Lookahead, TwoTiers> reference(w.cfg, {}, eviction::Lookahead{1});
  KvManager<index::Quest, eviction::Lookahead, TwoTiers> kv(w.cfg, {}, eviction::Lookahead{1});
  const auto ref_ids = prefill(reference, w), ids = prefill(kv, w);
  CHECK_THROWS_AS(kv.grow_windows({-1, 4}), Error);
  KvManager<index::Quest, eviction::LastStep, TwoTiers> fixed(w.cfg);
  CHECK_THROWS_AS(fixed.grow_windows({}), Error);
  // Reads that take 20 ms a batch outlast any selection here: every step with misses grows W by
  // one, up to 3; growth only moves pages between hits and misses, never the outputs.
  kv.tiers().get<1>().delay_reads(std::chrono::milliseconds(20));
  kv.grow_windows({3, 6});
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < sh.layers; ++l) CHECK(same_bits(step(kv, w, ids, l, s), step(reference, w, ref_ids, l, s)));
  for (int l = 0; l < sh.layers; ++l) {
    CHECK(kv.window_grown()[static_cast<std::size_t>(l)] == 2);
    for (int h = 0; h < sh.kv_heads; ++h) CHECK(kv.window_of(l, h) == 3);
  }
  CHECK(kv.total_stats().hit_rate() > reference.total_stats().hit_rate());
  // steps bounds it: one step of growth per layer at most.
  KvManager<index::Quest, eviction::Lookahead, TwoTiers> once(w.cfg, {}, eviction::Lookahead{1});
  const auto once_ids = prefill(once, w);
  once.tiers().get<1>().delay_reads(std::chrono::milliseconds(20));
  once.grow_windows({8, 1});
  for (int s = 0; s < 3; ++s)
    for (int l = 0; l < sh.layers; ++l) step(once, w, once_ids, l, s);
  for (int l = 0; l < sh.layers; ++l) CHECK(once.window_of(l, 0) == 2);  // step 0 always misses (no warm-up)
}

TEST_CASE("grow_windows() does not grow W past the fast tier's room") {
  // One short sequence decodes beside an idle long one: growing W for the layer needs a step's
  // budget for the long one's streams too (4 heads x ~124 pages), which a fast tier of 220 pages
  // does not have; without a bound it grows.
  Workload w;
  w.cfg.shape = {1, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.local_tokens = 16;
  w.cfg.budget = Budget::fraction(0.25);
  w.prompt = {200, 4000};
  w.steps = 4;
  const auto& sh = w.cfg.shape;
  auto run = [&](std::size_t capacity) {
    tier::HostTier::Params fast;
    fast.capacity_pages = capacity;
    KvManager<index::Quest, eviction::Lookahead, TwoTiers> kv(w.cfg, {}, eviction::Lookahead{1}, TwoTiers(tier::HostTier(fast), Slow{}));
    std::vector<SeqId> ids;
    for (int s = 0; s < 2; ++s) {  // in chunks of 64 tokens: prefill holds a chunk's pages in the fast tier
      ids.push_back(kv.add_sequence());
      for (int t0 = 0; t0 < w.prompt[s]; t0 += 64) {
        const int n = std::min(64, w.prompt[s] - t0);
        const auto k = w.rows(s, 0, t0, n, sh.kv_heads, 1), v = w.rows(s, 0, t0, n, sh.kv_heads, 2);
        kv.prefill(ids.back(), 0, make_view(k, n, sh.kv_heads, sh.head_dim), make_view(v, n, sh.kv_heads, sh.head_dim));
      }
    }
    Workload short_only = w;
    short_only.prompt = {200};
    kv.tiers().get<1>().delay_reads(std::chrono::milliseconds(10));
    kv.grow_windows({4, w.steps});
    for (int s = 0; s < w.steps; ++s) step(kv, short_only, {ids[0]}, 0, s);
    return kv.window_of(0, 0);
  };
  CHECK(run(220) == 1);
  CHECK(run(0) > 1);
}
