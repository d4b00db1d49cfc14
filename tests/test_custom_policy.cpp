// The policies of examples/custom_policy (docs/policies.md) against independent expectations:
// custom::FirstKey selects what a brute-force ranking of q . first key under the GQA rule
// selects; custom::Fifo keeps and evicts by admission order on a hand-worked sequence; and in a
// KvManager over DRAM + a backing tier, Fifo gives Lookahead's outputs bit for bit (Decision 2).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "fifo_eviction.hpp"
#include "first_key_index.hpp"
#include "kvdrive/kvdrive.hpp"
#include "fault_tier.hpp"
#include "support.hpp"
#include "workload.hpp"

using namespace kvdrive;

TEST_CASE("custom::FirstKey selects the pages whose first key scores best under the GQA rule") {
  std::mt19937 rng(4);
  const int pt = 8, d = 16, g = 3;
  for (int trial = 0; trial < 20; ++trial) {
    const int pages = 10 + static_cast<int>(rng() % 60);
    const auto keys = test::random_floats(static_cast<std::size_t>(pages) * pt * d, 100 + trial);
    const auto q = test::random_floats(static_cast<std::size_t>(g) * d, 200 + trial);
    custom::FirstKey ix;
    custom::FirstKey::State s;
    const int split = pages / 2;  // built from the first half, then appended page by page
    ix.build(s, index::PageKeys{keys.data(), 0, split, pt, d, DType::f32});
    for (int p = split; p < pages; ++p) ix.append(s, index::PageKeys{keys.data() + static_cast<std::size_t>(p) * pt * d, p, 1, pt, d, DType::f32});
    index::IndexQuery iq;
    iq.q = q.data();
    iq.group = g;
    iq.head_dim = d;
    iq.first_candidate = 1 + trial % 3;
    iq.end_candidate = pages - trial % 4;
    iq.budget_pages = 1 + static_cast<int>(rng() % static_cast<unsigned>(iq.candidates()));
    std::vector<std::uint32_t> got;
    ix.select(s, iq, got);

    // Brute force, in double: estimate per head, minus the head's best; the page's score is the
    // max over heads; the best budget pages, ties to the lower page.
    const auto n = static_cast<std::size_t>(iq.candidates());
    std::vector<double> est(static_cast<std::size_t>(g) * n), best(static_cast<std::size_t>(g), -1e300), score(n, -1e300);
    for (int h = 0; h < g; ++h)
      for (std::size_t i = 0; i < n; ++i) {
        const float* first_key = keys.data() + (static_cast<std::size_t>(iq.first_candidate) + i) * pt * d;  // row 0 of the page
        double dot = 0;
        for (int j = 0; j < d; ++j) dot += static_cast<double>(q[static_cast<std::size_t>(h) * d + j]) * first_key[j];
        est[h * n + i] = dot;
        best[static_cast<std::size_t>(h)] = std::max(best[static_cast<std::size_t>(h)], dot);
      }
    for (int h = 0; h < g; ++h)
      for (std::size_t i = 0; i < n; ++i) score[i] = std::max(score[i], est[h * n + i] - best[static_cast<std::size_t>(h)]);
    std::vector<std::uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return score[a] > score[b]; });
    std::vector<std::uint32_t> want;
    for (std::int64_t i = 0; i < iq.budget_pages; ++i)
      want.push_back(order[static_cast<std::size_t>(i)] + static_cast<std::uint32_t>(iq.first_candidate));
    std::sort(want.begin(), want.end());
    CAPTURE(trial);
    CHECK(got == want);
    CHECK(ix.bytes(s) >= static_cast<std::size_t>(pages) * d * sizeof(float));
  }
}

TEST_CASE("custom::Fifo keeps the pages admitted last and evicts the oldest admissions first") {
  custom::Fifo fifo;
  custom::Fifo::State s;
  std::vector<std::uint32_t> evicted;
  auto update = [&](std::vector<std::uint32_t> pages, std::uint64_t step) {
    evicted.clear();
    const std::vector<float> scores(pages.size(), 1.0f);
    fifo.update(s, eviction::CacheUpdate{pages, scores, step, 1, 3}, evicted);
  };
  update({1, 2}, 1);
  CHECK(evicted.empty());
  update({2, 5}, 2);  // 2 is a hit: its admission does not move
  CHECK(evicted.empty());
  update({7, 8}, 3);  // admitted 1, 2, 5, 7, 8: the first two leave
  CHECK(evicted == std::vector<std::uint32_t>{1, 2});
  CHECK(fifo.size(s) == 3);
  CHECK((fifo.contains(s, 5) && fifo.contains(s, 7) && fifo.contains(s, 8) && !fifo.contains(s, 1)));
  update({1, 7}, 4);  // 1 comes back at the end; 5 is now the oldest
  CHECK(evicted == std::vector<std::uint32_t>{5});
  update({20, 21, 22, 23}, 5);  // more than fit: some of this step's own pages leave too
  CHECK(evicted == std::vector<std::uint32_t>{7, 8, 1, 20});
  CHECK(fifo.size(s) == 3);
}

TEST_CASE("KvManager composed with custom::FirstKey and custom::Fifo gives Lookahead's outputs bit for bit") {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 3; ++trial) {
    const test::Workload w = test::random_workload(rng);
    using Two = Tiers<tier::HostTier, tier::FaultTier<tier::HostTier>>;
    KvManager<custom::FirstKey, custom::Fifo, Two> fifo(w.cfg, {}, custom::Fifo{2});
    KvManager<custom::FirstKey, eviction::Lookahead, Two> lookahead(w.cfg, {}, eviction::Lookahead{2});
    const auto a = test::prefill(fifo, w), b = test::prefill(lookahead, w);
    for (int s = 0; s < w.steps; ++s)
      for (int l = 0; l < w.cfg.shape.layers; ++l) CHECK(test::same_bits(test::step(fifo, w, a, l, s), test::step(lookahead, w, b, l, s)));
    CHECK(fifo.total_stats().selected == lookahead.total_stats().selected);
    CHECK(fifo.total_stats().hits + fifo.total_stats().misses == fifo.total_stats().selected);
  }
}
