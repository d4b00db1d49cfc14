// Fast-tier cache policies, window plans and warm-up placement: each policy's keep/evict order
// against hand-worked cases, the replay invariants (hits + misses = selected, capacity, W = 0,
// unlimited capacity), causality, Belady as an upper bound, the knapsack solvers against brute
// force, bad plans, and SnapKV placement against a double-precision reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/research.hpp"
#include "fault_tier.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

/// Applies one update to a policy's state; returns the evicted pages.
template <class E>
std::vector<std::uint32_t> apply(const E& e, typename E::State& s, std::vector<std::uint32_t> pages, std::vector<float> scores, std::uint64_t step,
                                 int window, std::size_t capacity) {
  eviction::CacheUpdate u;
  u.pages = pages;
  u.scores = scores;
  u.step = step;
  u.window = window;
  u.capacity = capacity;
  std::vector<std::uint32_t> evicted;
  e.update(s, u, evicted);
  return evicted;
}

template <class E>
std::vector<std::uint32_t> cached(const E& e, const typename E::State& s, std::uint32_t pages = 64) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t p = 0; p < pages; ++p)
    if (e.contains(s, p)) out.push_back(p);
  return out;
}

/// A random selection log: `steps` steps of up to `budget` ascending pages out of `pages`,
/// drifting (each step keeps some of the last one's pages), with random masses.
eval::SelectionLog random_log(std::uint64_t seed, int steps, int pages, int budget) {
  std::mt19937_64 rng(seed);
  eval::SelectionLog log;
  std::set<std::uint32_t> current;
  for (int s = 0; s < steps; ++s) {
    std::set<std::uint32_t> next;
    for (std::uint32_t p : current)
      if (rng() % 3 != 0 && static_cast<int>(next.size()) < budget) next.insert(p);
    while (static_cast<int>(next.size()) < budget) next.insert(static_cast<std::uint32_t>(rng() % static_cast<std::uint64_t>(pages)));
    current = next;
    std::vector<std::uint32_t> sel(next.begin(), next.end());
    std::vector<float> mass;
    for (std::size_t i = 0; i < sel.size(); ++i) mass.push_back(static_cast<float>(rng() % 1000) / 1000.0f);
    log.add_step(sel, mass, budget);
  }
  return log;
}

template <class F>
void for_each_policy(F f) {
  f(eviction::Lookahead{});
  f(eviction::Lru{});
  f(eviction::Lfu{});
  f(eviction::LastStep{});
  f(eviction::None{});
}

}  // namespace

TEST_CASE("Lookahead keeps the window first, then the most attention") {
  eviction::Lookahead la{2, 1.0f};  // decay 1: a page's score is its mass, undecayed
  eviction::Lookahead::State s;
  apply(la, s, {1, 2, 3}, {0.9f, 0.1f, 0.5f}, 1, 2, 6);
  apply(la, s, {4, 5}, {0.2f, 0.3f}, 2, 2, 6);
  CHECK(cached(la, s) == std::vector<std::uint32_t>{1, 2, 3, 4, 5});
  // Step 3: pages 1-3 fall out of the window (selected 2 steps ago with W = 2), 6 and 7 enter.
  // Capacity 5 of 7: the window {4, 5, 6, 7} stays, then page 1 (0.9) beats 3 (0.5) and 2 (0.1).
  auto ev = apply(la, s, {6, 7}, {0.05f, 0.01f}, 3, 2, 5);
  CHECK(cached(la, s) == std::vector<std::uint32_t>{1, 4, 5, 6, 7});
  CHECK(ev == std::vector<std::uint32_t>{2, 3});
  // Over capacity inside the window: the lowest-scored window pages leave.
  ev = apply(la, s, {8}, {0.4f}, 4, 2, 2);
  CHECK(cached(la, s) == std::vector<std::uint32_t>{6, 8});  // window {6, 7, 8}: 7 has the least
  // W = 0, capacity 0: nothing stays.
  apply(la, s, {9}, {1.0f}, 5, 0, 0);
  CHECK(la.size(s) == 0);
}

TEST_CASE("Lookahead accumulates attention with decay") {
  eviction::Lookahead la{1, 0.5f};
  eviction::Lookahead::State s;
  apply(la, s, {1, 2}, {0.4f, 0.5f}, 1, 1, 8);
  apply(la, s, {1}, {0.4f}, 2, 1, 8);  // page 1: 0.4 + 0.4 x 0.5 = 0.6
  const auto e = s.entries();
  REQUIRE(e.size() == 2);
  CHECK(e[0].page == 1);
  CHECK(e[0].score == doctest::Approx(0.6f));
  CHECK(e[0].uses == 2);
  // Step 3 selects page 3 with capacity 2: page 1 (0.6 x 0.5 = 0.3) stays over page 2
  // (0.5 x 0.25 = 0.125); both are outside the window, page 3 is in it.
  apply(la, s, {3}, {0.01f}, 3, 1, 2);
  CHECK(cached(la, s) == std::vector<std::uint32_t>{1, 3});
}

TEST_CASE("Lru, Lfu, LastStep and None keep what their definitions say") {
  SUBCASE("Lru: the least recently selected leave, ties the higher page") {
    eviction::Lru lru;
    eviction::Lru::State s;
    apply(lru, s, {1, 2, 3}, {1, 1, 1}, 1, 3, 5);
    apply(lru, s, {4, 5}, {0, 0}, 2, 3, 5);
    apply(lru, s, {1, 6}, {0, 0}, 3, 3, 5);  // 6 > 5: of step 1's 2 and 3, the higher page leaves
    CHECK(cached(lru, s) == std::vector<std::uint32_t>{1, 2, 4, 5, 6});
    apply(lru, s, {7}, {0}, 4, 3, 4);  // page 2 (step 1), then of step 2's 4 and 5, page 5
    CHECK(cached(lru, s) == std::vector<std::uint32_t>{1, 4, 6, 7});
  }
  SUBCASE("Lfu: the least often selected leave, ties the older, then the higher page") {
    eviction::Lfu lfu;
    eviction::Lfu::State s;
    apply(lfu, s, {1, 2}, {0, 0}, 1, 3, 8);
    apply(lfu, s, {1, 3}, {0, 0}, 2, 3, 8);
    apply(lfu, s, {1, 3, 4}, {0, 0, 0}, 3, 3, 2);  // uses: 1->3, 3->2, 2->1, 4->1
    CHECK(cached(lfu, s) == std::vector<std::uint32_t>{1, 3});
  }
  SUBCASE("LastStep: exactly the previous step's pages") {
    eviction::LastStep ls;
    eviction::LastStep::State s;
    apply(ls, s, {1, 2}, {0, 0}, 0, 1, 4);  // warm-up
    apply(ls, s, {2, 3}, {0, 0}, 1, 1, 4);
    CHECK(cached(ls, s) == std::vector<std::uint32_t>{2, 3});
  }
  SUBCASE("None: nothing stays") {
    eviction::None none;
    eviction::None::State s;
    const auto ev = apply(none, s, {1, 2}, {0, 0}, 1, 0, 0);
    CHECK(none.size(s) == 0);
    CHECK(ev == std::vector<std::uint32_t>{1, 2});
  }
}

TEST_CASE("cache replay invariants hold for every policy and window") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const eval::SelectionLog log = random_log(seed, 40, 60, 6);
    // Independent counts: pages selected at an earlier step (an unlimited cache hits them).
    std::uint64_t repeats = 0, selected = 0;
    std::set<std::uint32_t> seen;
    for (std::size_t s = 0; s < log.steps(); ++s)
      for (std::uint32_t p : log.step_pages(s)) {
        repeats += seen.count(p);
        ++selected;
        seen.insert(p);
      }
    for_each_policy([&](auto policy) {
      using E = decltype(policy);
      CAPTURE(E::name());
      for (int w : {0, 1, 2, 3, 5}) {
        CAPTURE(w);
        eval::ReplaySettings r;
        r.window = eviction::kHasFixedWindow<E> ? policy.default_window() : w;  // what replay_cache runs
        const eval::CacheTally t = eval::replay_cache(policy, log, r);
        CHECK(t.hits + t.misses == t.selected);
        CHECK(t.selected == selected);
        if (r.window == 0) {  // W = 0 (capacity 0): every selected page is a miss
          CHECK(t.hits == 0);
          CHECK(t.max_cached == 0);
        }
        CHECK(t.max_cached <= static_cast<std::uint64_t>(r.window) * 6);  // never above W x budget
        const eval::CacheTally b = eval::replay_belady(log, r);
        CHECK(b.hits >= t.hits);  // Belady is the upper bound at equal capacity
        CHECK(b.max_cached <= static_cast<std::uint64_t>(r.window) * 6);
      }
      if constexpr (!eviction::kHasFixedWindow<E>) {
        // Unlimited capacity and window: every page selected before is a hit.
        eval::ReplaySettings r;
        r.window = 1000;
        r.capacity_pages = 1 << 20;
        const eval::CacheTally t = eval::replay_cache(policy, log, r);
        CHECK(t.hits == repeats);
        CHECK(t.evictions == 0);
      }
    });
  }
}

TEST_CASE("a step's own pages stay cached while they fit") {
  // Lru and LastStep keep the step's pages whenever they fit; Lookahead keeps its whole window
  // (the last W steps' pages) while W x budget fits, so the next step can hit them.
  const eval::SelectionLog log = random_log(7, 30, 50, 5);
  auto check = [&](auto policy, int window, std::size_t capacity) {
    typename decltype(policy)::State s;
    for (std::size_t st = 0; st < log.steps(); ++st) {
      const auto pages = log.step_pages(st);
      const auto mass = log.step_mass(st);
      apply(policy, s, {pages.begin(), pages.end()}, {mass.begin(), mass.end()}, st + 1, window, capacity);
      for (std::size_t back = 0; back < static_cast<std::size_t>(window) && back <= st; ++back)
        for (std::uint32_t p : log.step_pages(st - back)) CHECK(policy.contains(s, p));
      CHECK(policy.size(s) <= capacity);
    }
  };
  check(eviction::Lookahead{}, 2, 10);
  check(eviction::Lookahead{}, 3, 15);
  check(eviction::Lru{}, 1, 7);
  check(eviction::LastStep{}, 1, 5);
}

TEST_CASE("causality: decisions up to step t do not depend on later steps") {
  const eval::SelectionLog a = random_log(11, 30, 80, 6);
  const std::size_t t = 14;
  eval::SelectionLog b;
  for (std::size_t s = 0; s < t + 1; ++s) b.add_step(a.step_pages(s), a.step_mass(s), a.budget[s]);
  const eval::SelectionLog tail = random_log(99, 15, 80, 6);  // a different future
  for (std::size_t s = 0; s < tail.steps(); ++s) b.add_step(tail.step_pages(s), tail.step_mass(s), tail.budget[s]);
  for_each_policy([&](auto policy) {
    CAPTURE(decltype(policy)::name());
    typename decltype(policy)::State sa, sb;
    for (std::size_t s = 0; s <= t; ++s) {
      std::uint64_t ha = 0, hb = 0;
      for (std::uint32_t p : a.step_pages(s)) ha += policy.contains(sa, p);
      for (std::uint32_t p : b.step_pages(s)) hb += policy.contains(sb, p);
      CHECK(ha == hb);
      const auto pa = a.step_pages(s), pb = b.step_pages(s);
      const auto ma = a.step_mass(s), mb = b.step_mass(s);
      apply(policy, sa, {pa.begin(), pa.end()}, {ma.begin(), ma.end()}, s + 1, 3, 18);
      apply(policy, sb, {pb.begin(), pb.end()}, {mb.begin(), mb.end()}, s + 1, 3, 18);
      CHECK(cached(policy, sa, 80) == cached(policy, sb, 80));
    }
  });
}

TEST_CASE("Belady on a hand-worked sequence") {
  // Capacity 1 page; it keeps the page needed again soonest.
  eval::SelectionLog log;
  const std::vector<std::vector<std::uint32_t>> steps = {{1}, {2}, {1}, {1}, {2}};
  for (const auto& s : steps) log.add_step(s, std::vector<float>(s.size(), 0.5f), 1);
  eval::ReplaySettings r;
  r.window = 1;  // capacity 1 x budget 1
  const eval::CacheTally b = eval::replay_belady(log, r);
  // Step 1: miss, keep 1. Step 2: miss; 1 is needed at step 3, 2 at step 5: keep 1. Steps 3
  // and 4: hits (then 1 is never needed again). Step 5: miss. Hits: 2.
  CHECK(b.hits == 2);
  CHECK(eval::replay_cache(eviction::Lru{}, log, r).hits == 1);  // LRU keeps 2 after step 2
}

TEST_CASE("knapsack: exact matches brute force, greedy stays within one increment") {
  std::mt19937_64 rng(5);
  double worst_gap = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int classes = 1 + static_cast<int>(rng() % 6), items = 1 + static_cast<int>(rng() % 4);
    std::vector<eviction::KnapsackClass> cls(static_cast<std::size_t>(classes));
    double max_step = 0;
    for (auto& c : cls) {
      double b = 0;
      for (int i = 0; i < items; ++i) {
        b += static_cast<double>(rng() % 100);
        c.push_back({static_cast<std::int64_t>(i) * static_cast<std::int64_t>(1 + rng() % 3), b});
        max_step = std::max(max_step, b);
      }
    }
    const std::int64_t budget = static_cast<std::int64_t>(rng() % 12);
    // Brute force over every choice.
    double best = -1;
    std::vector<int> pick(static_cast<std::size_t>(classes), 0);
    std::function<void(std::size_t, std::int64_t, double)> rec = [&](std::size_t c, std::int64_t cost, double ben) {
      if (cost > budget) return;
      if (c == cls.size()) {
        best = std::max(best, ben);
        return;
      }
      for (const auto& it : cls[c]) rec(c + 1, cost + it.cost, ben + it.benefit);
    };
    rec(0, 0, 0);
    const auto exact = eviction::solve_exact(cls, budget);
    const auto greedy = eviction::solve_greedy(cls, budget);
    CHECK(exact.benefit == doctest::Approx(best));
    CHECK(exact.cost <= budget);
    CHECK(greedy.cost <= budget);
    CHECK(greedy.benefit <= exact.benefit + 1e-9);
    CHECK(greedy.benefit >= exact.benefit - max_step - 1e-9);
    worst_gap = std::max(worst_gap, best > 0 ? (best - greedy.benefit) / best : 0.0);
  }
  MESSAGE("knapsack: greedy's worst relative gap to the optimum over 300 random instances: " << worst_gap);
}

TEST_CASE("knapsack on window profiles: a few hundred classes, greedy close to exact") {
  // Concave profiles (diminishing returns in W), as measured ones are: greedy is near optimal.
  std::mt19937_64 rng(8);
  eviction::WindowProfile p;
  p.layers = 32;
  p.kv_heads = 8;
  p.max_window = 8;
  for (std::size_t s = 0; s < p.streams(); ++s) {
    const double scale = 1000.0 * static_cast<double>(1 + rng() % 100), rate = 0.2 + static_cast<double>(rng() % 100) / 100.0;
    for (int w = 0; w <= p.max_window; ++w) {
      p.saved.push_back(scale * (1.0 - std::exp(-rate * w)));
      p.cost.push_back(static_cast<std::int64_t>(w) * 262144);
    }
  }
  const std::int64_t budget = 3 * 262144 * static_cast<std::int64_t>(p.streams());
  const auto g = eviction::plan_windows(p, budget, eviction::KnapsackSolver::greedy);
  const auto e = eviction::plan_windows(p, budget, eviction::KnapsackSolver::exact);
  double bg = 0, be = 0, bu = 0;
  for (std::size_t s = 0; s < p.streams(); ++s) {
    bg += p.saved[p.at(s, g.windows[s])];
    be += p.saved[p.at(s, e.windows[s])];
    bu += p.saved[p.at(s, 3)];
  }
  CHECK(g.total_window() <= 3 * static_cast<std::int64_t>(p.streams()));
  CHECK(e.total_window() <= 3 * static_cast<std::int64_t>(p.streams()));
  CHECK(bg <= be + 1e-6);
  CHECK(bg >= bu);  // at least as good as the uniform plan of the same bytes
  MESSAGE("knapsack on 256 concave profiles: greedy " << bg / be << " of exact, uniform W=3 " << bu / be << " of exact");
}

TEST_CASE("bad plans and budgets give clear errors") {
  Config c;
  c.shape = {2, 8, 2, 64};
  CHECK_THROWS_WITH_AS(eviction::WindowPlan::uniform(c.shape, -1), doctest::Contains("negative"), Error);
  eviction::WindowPlan bad = eviction::WindowPlan::uniform(c.shape, 2);
  bad.windows[3] = -2;
  CHECK_THROWS_WITH_AS(bad.validate(c.shape), doctest::Contains("layer 1 head 1 is negative"), Error);
  KvManager<index::Oracle, eviction::Lookahead> kv(c);
  CHECK_THROWS_WITH_AS(kv.set_window_plan(bad), doctest::Contains("negative"), Error);
  CHECK_THROWS_WITH_AS(kv.set_window_plan(eviction::WindowPlan::uniform({3, 8, 2, 64}, 1)), doctest::Contains("do not match"), Error);
  KvManager<index::Oracle, eviction::None> none(c);
  CHECK_THROWS_WITH_AS(none.set_window_plan(eviction::WindowPlan::uniform(c.shape, 1)), doctest::Contains("fixed window"), Error);
  // 4 streams at 1000 tokens: 1 sink page + 9 local/tail pages of 1 KiB... below that: refused.
  const std::size_t resident = static_cast<std::size_t>(eviction::resident_pages(c, 1000)) * c.page_bytes() * 4;
  CHECK(eviction::cache_bytes_for(c, 1000, 4, resident + 10) == 10);
  CHECK_THROWS_WITH_AS(eviction::cache_bytes_for(c, 1000, 4, resident - 1), doctest::Contains("sink and local pages need"), Error);
  eval::ReplaySettings r;
  r.window = -1;
  CHECK_THROWS_WITH_AS(eval::replay_cache(eviction::Lru{}, eval::SelectionLog{}, r), doctest::Contains("negative"), Error);
  CHECK_THROWS_WITH_AS(eviction::solve_greedy({{{5, 1.0}}}, 4), doctest::Contains("over the budget"), Error);
}

TEST_CASE("ImportanceGuided scores pages by the observation queries' causal attention") {
  const int d = 16, g = 2, pt = 4, tokens = 64, obs = 8;
  auto keys = test::random_floats(static_cast<std::size_t>(tokens) * d, 3, 0.5f);
  auto q = test::random_floats(static_cast<std::size_t>(obs) * g * d, 4, 0.5f);
  // Page 5's keys align with every observation query: it must rank first.
  for (int t = 20; t < 24; ++t)
    for (int j = 0; j < d; ++j) keys[static_cast<std::size_t>(t) * d + j] = 3.0f * (j % 2 ? 1.0f : -1.0f);
  for (int i = 0; i < obs * g; ++i)
    for (int j = 0; j < d; ++j) q[static_cast<std::size_t>(i) * d + j] += j % 2 ? 1.0f : -1.0f;
  tier::PlacementInput in{keys.data(), tokens, q.data(), obs, g, d, pt, 1.0f / std::sqrt(static_cast<float>(d))};
  tier::ImportanceGuided ig;
  ig.observation = obs;
  const std::vector<float> imp = ig.token_importance(in);
  // Reference in double: each query attends causally to [0, its position].
  std::vector<double> ref(tokens, 0.0);
  for (int i = 0; i < obs; ++i)
    for (int h = 0; h < g; ++h) {
      const int pos = tokens - obs + i;
      std::vector<const float*> kp, vp;
      for (int t = 0; t <= pos; ++t) kp.push_back(keys.data() + static_cast<std::size_t>(t) * d);
      double lse = 0;
      test::reference_attention(q.data() + (static_cast<std::size_t>(i) * g + h) * d, kp, kp, d, in.scale, &lse);
      for (int t = 0; t <= pos; ++t) {
        double dot = 0;
        for (int j = 0; j < d; ++j)
          dot += static_cast<double>(q[(static_cast<std::size_t>(i) * g + h) * d + j]) * keys[static_cast<std::size_t>(t) * d + j];
        ref[static_cast<std::size_t>(t)] += std::exp(dot * in.scale - lse) / obs;
      }
    }
  double total = 0;
  for (int t = 0; t < tokens; ++t) {
    CHECK(imp[static_cast<std::size_t>(t)] == doctest::Approx(ref[static_cast<std::size_t>(t)]).epsilon(1e-4));
    total += imp[static_cast<std::size_t>(t)];
  }
  CHECK(total == doctest::Approx(g).epsilon(1e-4));  // each query's weights sum to 1, summed over the group
  const tier::PageRanking r = ig.rank(in, 1, 14);
  REQUIRE(r.pages.size() == 13);
  CHECK(r.pages.front() == 5);
  CHECK(std::is_sorted(r.pages.begin(), r.pages.end()) == false);
  CHECK(r.scores.front() == doctest::Approx(ref[20] + ref[21] + ref[22] + ref[23]).epsilon(1e-4));
  ig.pool_kernel = 4;
  CHECK_THROWS_WITH_AS(ig.rank(in, 1, 14), doctest::Contains("odd"), Error);
}

TEST_CASE("warm-up helps: the placement's pages are hit at the first steps") {
  // On a synthetic stream, replaying with warm-up hits at least as often over the first steps,
  // and the warm pages never exceed the capacity.
  eval::SyntheticTrace trace(eval::synthetic_preset("tiny"), 1, 2048, 6);
  const eval::StreamTrace tr = trace.stream(0, 0);
  CHECK(tr.observed == std::min<std::int64_t>(eval::SyntheticTrace::kObservedQueries, 2048));
  eval::EvalSettings set;
  set.page_tokens = 8;
  std::vector<std::unique_ptr<eval::AnyIndex>> ix;
  ix.push_back(eval::make_any_index(index::Quest{}));
  std::vector<eval::SelectionLog> logs;
  eval::evaluate_stream(tr, ix, set, &logs);
  const tier::PageRanking warm = eval::warm_ranking(tr, set, tier::ImportanceGuided{});
  eval::ReplaySettings r;
  r.window = 3;
  const auto cold = eval::replay_cache(eviction::Lookahead{}, logs[0], r);
  r.warm_up = true;
  const auto hot = eval::replay_cache(eviction::Lookahead{}, logs[0], r, &warm);
  CHECK(hot.warm_pages == std::min<std::uint64_t>(warm.pages.size(), 3 * static_cast<std::uint64_t>(logs[0].budget[0])));
  CHECK(hot.hits > cold.hits);
  CHECK(cold.hits + cold.misses == hot.hits + hot.misses);
}

namespace {
/// An eviction policy that records every update KvManager makes, then acts as Lookahead.
struct Spy {
  struct Record {
    std::uint64_t step;
    std::vector<std::uint32_t> pages;
    std::vector<float> scores;
  };
  std::shared_ptr<std::vector<Record>> seen = std::make_shared<std::vector<Record>>();
  eviction::Lookahead inner;
  using State = eviction::Lookahead::State;
  static constexpr std::string_view name() { return "spy"; }
  int default_window() const { return inner.default_window(); }
  bool contains(const State& s, std::uint32_t p) const { return inner.contains(s, p); }
  std::size_t size(const State& s) const { return inner.size(s); }
  void update(State& s, const eviction::CacheUpdate& u, std::vector<std::uint32_t>& evicted) const {
    seen->push_back({u.step, {u.pages.begin(), u.pages.end()}, {u.scores.begin(), u.scores.end()}});
    inner.update(s, u, evicted);
  }
};
static_assert(eviction::EvictionPolicy<Spy>);
}  // namespace

TEST_CASE("the replays see what KvManager's eviction sees: pages, masses, warm-up, hits, with and without the focus carry") {
  const eval::SyntheticTrace trace(eval::synthetic_preset("tiny"), 3, 1500, 12);
  const eval::StreamTrace tr = trace.stream(0, 0);
  const int d = tr.head_dim, g = tr.group;
  eval::EvalSettings set;  // 8-token pages, sink 4, local 64, 6.25%, f16
  set.budget = 0.05;
  Config c;
  c.shape = {1, g, 1, d};
  c.budget = Budget::fraction(set.budget);
  std::vector<std::vector<std::uint32_t>> selections[2];  // without and with the carry
  for (int carry = 0; carry < 2; ++carry)
    for (bool warm : {false, true}) {
      CAPTURE(carry);
      CAPTURE(warm);
      c.carry = set.carry = FocusCarry{.mass = 0.02f, .share = carry ? 0.5f : 0.0f};
      Spy spy;
      KvManager<index::MeanKey, Spy, Tiers<tier::HostTier, tier::FaultTier<tier::HostTier>>> kv(c, {}, spy);
      const SeqId id = kv.add_sequence();
      kv.prefill(id, 0, make_view(tr.keys.data(), tr.prefix, 1, d), make_view(tr.values.data(), tr.prefix, 1, d));
      if (warm) kv.warm_up(id, 0, make_view(tr.observed_queries.data(), tr.observed, g, d));
      std::vector<float> out(static_cast<std::size_t>(g) * d);
      const SeqId batch[] = {id};
      for (std::int64_t s = 0; s < tr.steps; ++s)
        kv.attend(0, batch, make_view(tr.query(s), 1, g, d), make_view(tr.key(tr.prefix + s), 1, 1, d), make_view(tr.value(tr.prefix + s), 1, 1, d),
                  make_view(out.data(), 1, g, d));

      std::vector<std::unique_ptr<eval::AnyIndex>> ix;
      ix.push_back(eval::make_any_index(index::MeanKey{}));
      std::vector<eval::SelectionLog> logs;
      eval::evaluate_stream(tr, ix, set, &logs);
      const auto& log = logs[0];
      if (!warm)
        for (std::size_t st = 0; st < log.steps(); ++st) selections[carry].emplace_back(log.step_pages(st).begin(), log.step_pages(st).end());
      const auto& seen = *spy.seen;
      REQUIRE(seen.size() == log.steps() + (warm ? 1 : 0));
      const std::size_t first = warm ? 1 : 0;
      for (std::size_t s = 0; s < log.steps(); ++s) {
        CAPTURE(s);
        const auto& rec = seen[first + s];
        CHECK(rec.step == s + 1);
        const auto pages = log.step_pages(s);
        CHECK(rec.pages == std::vector<std::uint32_t>(pages.begin(), pages.end()));
        const auto mass = log.step_mass(s);
        REQUIRE(rec.scores.size() == mass.size());
        for (std::size_t i = 0; i < mass.size(); ++i) CHECK(rec.scores[i] == doctest::Approx(mass[i]).epsilon(1e-5));
      }
      eval::ReplaySettings r;
      r.window = 3;
      r.warm_up = warm;
      tier::PageRanking ranking;
      if (warm) {
        ranking = eval::warm_ranking(tr, set, tier::ImportanceGuided{});
        std::vector<std::uint32_t> pages;
        std::vector<float> scores;
        eval::warm_pages(ranking, 3 * static_cast<std::size_t>(log.budget[0]), pages, scores);
        CHECK(seen[0].step == 0);
        CHECK(seen[0].pages == pages);  // the manager warms the pages the replay warms
      }
      const eval::CacheTally t = eval::replay_cache(eviction::Lookahead{}, log, r, warm ? &ranking : nullptr);
      CHECK(kv.total_stats().hits == t.hits);
      CHECK(kv.total_stats().misses == t.misses);
      CHECK(kv.total_stats().evictions == t.evictions);
    }
  CHECK(selections[0] != selections[1]);  // the carry did change some selection: the comparison covered it
}
