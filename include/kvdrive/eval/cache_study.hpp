// Cache studies for tools (kvd-eval --eviction, bench_cache): eviction policies chosen by name
// at run time, every stream's selections recorded once per index, and knapsack window plans
// profiled on a calibration trace, all at equal cache bytes.
//
//   auto sel = eval::record_selections(trace, streams, indices, settings, pool, true);
//   auto t = eval::replay_by_name("lookahead", sel[s].logs[i], {.window = 3, .warm_up = true}, &sel[s].warm);
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/eval/belady.hpp"
#include "kvdrive/eval/cache_replay.hpp"
#include "kvdrive/eval/evaluate.hpp"
#include "kvdrive/eval/window_profile.hpp"
#include "kvdrive/eviction/knapsack.hpp"
#include "kvdrive/eviction/last_step.hpp"
#include "kvdrive/eviction/lfu.hpp"
#include "kvdrive/eviction/lookahead.hpp"
#include "kvdrive/eviction/lru.hpp"
#include "kvdrive/eviction/none.hpp"
#include "kvdrive/tier/placement.hpp"

namespace kvdrive::eval {

inline const std::vector<std::string>& eviction_names() {
  static const std::vector<std::string> names = {"lookahead", "lru", "lfu", "last-step", "none"};
  return names;
}

/// The W a named policy runs at: its own for fixed-window ones (0 for none, 1 for last-step),
/// else `window`.
inline int window_for(const std::string& name, int window) {
  return name == "none" ? eviction::None::kFixedWindow : name == "last-step" ? eviction::LastStep::kFixedWindow : window;
}

/// Calls f with the named policy (Lookahead with the given decay).
template <class F>
decltype(auto) with_eviction(const std::string& name, float decay, F&& f) {
  if (name == "lookahead") return f(eviction::Lookahead{3, decay});
  if (name == "lru") return f(eviction::Lru{});
  if (name == "lfu") return f(eviction::Lfu{});
  if (name == "last-step") return f(eviction::LastStep{});
  if (name == "none") return f(eviction::None{});
  std::string known;
  for (const auto& n : eviction_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown eviction policy '{}' (known: {})", name, known);
}

inline CacheTally replay_by_name(const std::string& name, const SelectionLog& log, const ReplaySettings& r, const tier::PageRanking* warm,
                                 float decay = eviction::Lookahead{}.decay) {
  return with_eviction(name, decay, [&](const auto& policy) { return replay_cache(policy, log, r, warm); });
}

/// One stream's selections under every index, and its warm-up ranking.
struct StreamSelections {
  std::vector<SelectionLog> logs;  ///< [index]
  tier::PageRanking warm;
};

/// Replays the streams `list` ((layer, kv_head) pairs) of `trace` against clones of
/// `indices`, on the pool's threads; with `tallies`, also returns each stream's index figures.
template <class Trace>
std::vector<StreamSelections> record_selections(const Trace& trace, const std::vector<std::pair<int, int>>& list,
                                                const std::vector<std::unique_ptr<AnyIndex>>& indices, const EvalSettings& set, ThreadPool& pool,
                                                bool warm_up, std::vector<std::vector<IndexTally>>* tallies = nullptr) {
  std::vector<StreamSelections> out(list.size());
  if (tallies) tallies->assign(list.size(), {});
  pool.parallel_for(list.size(), [&](std::size_t i) {
    const StreamTrace tr = trace.stream(list[i].first, list[i].second);
    std::vector<std::unique_ptr<AnyIndex>> mine;
    for (const auto& p : indices) mine.push_back(p->clone());
    auto t = evaluate_stream(tr, mine, set, &out[i].logs);
    if (tallies) (*tallies)[i] = std::move(t);
    if (warm_up) out[i].warm = warm_ranking(tr, set, tier::ImportanceGuided{});
  });
  return out;
}

/// Knapsack windows for index `ix` and a named policy: profiled on `calibration` (the same
/// streams, another trace), W = 0..max_window each costing W x `step_bytes`, within `cache_bytes`.
inline std::vector<int> knapsack_windows(const std::vector<StreamSelections>& calibration, std::size_t ix, const std::string& name, int max_window,
                                         std::size_t page_bytes, std::size_t step_bytes, std::size_t cache_bytes, bool warm_up,
                                         eviction::KnapsackSolver solver, float decay = eviction::Lookahead{}.decay) {
  std::vector<SelectionLog> logs;
  std::vector<tier::PageRanking> warm;
  for (const StreamSelections& s : calibration) {
    KVD_EXPECT(ix < s.logs.size(), "knapsack_windows: index {} of {}", ix, s.logs.size());
    logs.push_back(s.logs[ix]);
    warm.push_back(s.warm);
  }
  eviction::WindowProfile prof = with_eviction(name, decay, [&](const auto& policy) {
    return profile_windows(logs, &warm, 1, static_cast<int>(logs.size()), max_window, page_bytes, policy, warm_up);
  });
  // Costs at the scored trace's budget (the calibration trace may differ in length).
  for (std::size_t s = 0; s < prof.streams(); ++s)
    for (int w = 0; w <= max_window; ++w) prof.cost[prof.at(s, w)] = static_cast<std::int64_t>(w) * static_cast<std::int64_t>(step_bytes);
  return eviction::plan_windows(prof, static_cast<std::int64_t>(cache_bytes), solver).windows;
}

/// A named policy and Belady replayed over streams with per-stream windows.
struct CacheRun {
  CacheTally policy, belady;
};
inline CacheRun replay_streams(const std::vector<StreamSelections>& streams, std::size_t ix, const std::string& name, const std::vector<int>& windows,
                               bool warm_up, float decay = eviction::Lookahead{}.decay) {
  KVD_EXPECT(windows.size() == streams.size(), "replay_streams: {} windows for {} streams", windows.size(), streams.size());
  CacheRun run;
  for (std::size_t s = 0; s < streams.size(); ++s) {
    ReplaySettings r;
    r.window = window_for(name, windows[s]);
    r.warm_up = warm_up;
    run.policy += replay_by_name(name, streams[s].logs[ix], r, warm_up ? &streams[s].warm : nullptr, decay);
    run.belady += replay_belady(streams[s].logs[ix], r);
  }
  return run;
}

}  // namespace kvdrive::eval
