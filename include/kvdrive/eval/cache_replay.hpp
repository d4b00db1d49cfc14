// Replays one stream's page selections through a fast-tier cache, the way KvManager drives an
// eviction policy, and counts what happened. evaluate_stream (eval/evaluate.hpp) records each
// index's selections once, as a SelectionLog (pages and attention mass per step, the mass taken
// from the sparse attention, exactly as the manager computes it); each eviction policy and
// window is then replayed on the same log, so they are compared on the same work.
//
// Per step s (the manager's step s + 1; step 0 is warm-up): hits are the selected pages already
// cached, misses the others (each a page fetched into the fast tier); then the policy's
// update() admits the step's pages and evicts. Only index-selected pages count (Decision 3):
// sink and local pages are resident and outside the cache. The capacity at each step is
// W x that step's budget pages unless ReplaySettings gives pages. With warm-up, the top of the
// placement ranking enters at step 0, up to the capacity.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/eviction/concept.hpp"
#include "kvdrive/tier/placement.hpp"

namespace kvdrive::eval {

/// One index's selections on one stream, step by step.
struct SelectionLog {
  std::vector<std::uint32_t> pages;   ///< each step's selected pages, ascending, concatenated
  std::vector<float> mass;            ///< attention mass of each, summed over the group
  std::vector<std::size_t> begin{0};  ///< step s holds [begin[s], begin[s + 1])
  std::vector<std::int64_t> budget;   ///< budget pages at each step

  std::size_t steps() const { return budget.size(); }
  std::span<const std::uint32_t> step_pages(std::size_t s) const { return {pages.data() + begin[s], begin[s + 1] - begin[s]}; }
  std::span<const float> step_mass(std::size_t s) const { return {mass.data() + begin[s], begin[s + 1] - begin[s]}; }

  void add_step(std::span<const std::uint32_t> selected, std::span<const float> selected_mass, std::int64_t budget_pages) {
    KVD_EXPECT(selected.size() == selected_mass.size(), "SelectionLog: {} pages but {} masses", selected.size(), selected_mass.size());
    for (std::size_t i = 1; i < selected.size(); ++i)
      KVD_EXPECT(selected[i] > selected[i - 1], "SelectionLog: pages must ascend (page {} after {})", selected[i], selected[i - 1]);
    pages.insert(pages.end(), selected.begin(), selected.end());
    mass.insert(mass.end(), selected_mass.begin(), selected_mass.end());
    begin.push_back(pages.size());
    budget.push_back(budget_pages);
  }
};

struct ReplaySettings {
  int window = 3;                    ///< W
  std::int64_t capacity_pages = -1;  ///< the cache's capacity; -1: W x each step's budget
  bool warm_up = false;              ///< admit the placement's top pages at step 0

  std::size_t capacity(std::int64_t budget_pages) const {
    if (capacity_pages >= 0) return static_cast<std::size_t>(capacity_pages);
    return static_cast<std::size_t>(std::max(0, window)) * static_cast<std::size_t>(std::max<std::int64_t>(0, budget_pages));
  }
  void validate() const {
    KVD_EXPECT(window >= 0, "cache replay: window {} is negative", window);
    KVD_EXPECT(capacity_pages >= -1, "cache replay: capacity {} pages is negative", capacity_pages);
  }
};

/// What a cache did over a replay (or a run: KvManager's Stats carry the same counts).
struct CacheTally {
  std::uint64_t steps = 0, selected = 0, hits = 0, misses = 0, evictions = 0;
  std::uint64_t warm_pages = 0;  ///< pages admitted at warm-up (fetched before step 1)
  std::uint64_t max_cached = 0;  ///< the most pages the cache held after any update

  double hit_rate() const { return selected ? static_cast<double>(hits) / static_cast<double>(selected) : 1.0; }
  double fetched_pages_per_step() const { return steps ? static_cast<double>(misses) / static_cast<double>(steps) : 0.0; }
  CacheTally& operator+=(const CacheTally& o) {
    steps += o.steps;
    selected += o.selected;
    hits += o.hits;
    misses += o.misses;
    evictions += o.evictions;
    warm_pages += o.warm_pages;
    max_cached = std::max(max_cached, o.max_cached);
    return *this;
  }
};

/// The first `capacity` pages of a placement ranking, ascending, with their scores.
inline void warm_pages(const tier::PageRanking& ranking, std::size_t capacity, std::vector<std::uint32_t>& pages, std::vector<float>& scores) {
  std::uint32_t end = 0;
  for (std::uint32_t p : ranking.pages) end = std::max(end, p + 1);
  ranking.check(0, end, "warm-up ranking");
  const std::size_t n = std::min(capacity, ranking.pages.size());
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ranking.pages[a] < ranking.pages[b]; });
  pages.clear();
  scores.clear();
  for (std::size_t i : order) {
    pages.push_back(ranking.pages[i]);
    scores.push_back(ranking.scores[i]);
  }
}

/// Replays `log` through `policy`; `warm` is the placement ranking (needed for warm-up).
/// Policies with a fixed window (None, LastStep) run at their own W, as in KvManager.
template <eviction::EvictionPolicy E>
CacheTally replay_cache(const E& policy, const SelectionLog& log, ReplaySettings set, const tier::PageRanking* warm = nullptr) {
  set.validate();
  if constexpr (eviction::kHasFixedWindow<E>) set.window = policy.default_window();
  KVD_EXPECT(!set.warm_up || warm != nullptr, "cache replay: warm-up asked without a placement ranking");
  typename E::State state{};
  CacheTally t;
  std::vector<std::uint32_t> evicted, pages;
  std::vector<float> scores;
  eviction::CacheUpdate u;
  u.window = set.window;
  if (set.warm_up && log.steps() > 0) {
    warm_pages(*warm, set.capacity(log.budget[0]), pages, scores);
    u.pages = pages;
    u.scores = scores;
    u.step = 0;
    u.capacity = set.capacity(log.budget[0]);
    policy.update(state, u, evicted);
    t.warm_pages = policy.size(state);
  }
  for (std::size_t s = 0; s < log.steps(); ++s) {
    const auto sel = log.step_pages(s);
    std::uint64_t hits = 0;
    for (std::uint32_t p : sel) hits += policy.contains(state, p) ? 1 : 0;
    t.selected += sel.size();
    t.hits += hits;
    t.misses += sel.size() - hits;
    u.pages = sel;
    u.scores = log.step_mass(s);
    u.step = s + 1;
    u.capacity = set.capacity(log.budget[s]);
    evicted.clear();
    policy.update(state, u, evicted);
    t.evictions += evicted.size();
    t.max_cached = std::max<std::uint64_t>(t.max_cached, policy.size(state));
    ++t.steps;
  }
  return t;
}

}  // namespace kvdrive::eval
