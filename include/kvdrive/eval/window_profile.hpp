// Window profiles for the knapsack allocation (eviction/knapsack.hpp): for each stream of a
// calibration trace and each W in 0..max_window, the bytes per step an eviction policy saves
// (its hits, each a page not fetched) and the bytes its cache costs (W x the budget's pages).
// Run it on a trace of your own model (kvd-llama --record-trace) and the index you deploy:
//
//   eval::RecordedTrace calib("calib.trace", 64);
//   auto profile = eval::profile_windows(calib, index::Hierarchical{}, eviction::Lookahead{}, settings, {}, 8);
//   auto plan = eviction::plan_windows(profile, cache_bytes);   // then kv.set_window_plan(plan)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvdrive/eval/cache_replay.hpp"
#include "kvdrive/eval/evaluate.hpp"
#include "kvdrive/eviction/knapsack.hpp"
#include "kvdrive/tier/placement.hpp"

namespace kvdrive::eval {

/// The profile from recorded selections: logs[stream] (streams in [layer][kv_head] order) and,
/// with warm-up, each stream's placement ranking.
template <eviction::EvictionPolicy E>
eviction::WindowProfile profile_windows(const std::vector<SelectionLog>& logs, const std::vector<tier::PageRanking>* warm, int layers, int kv_heads,
                                        int max_window, std::size_t page_bytes, const E& policy, bool warm_up = false) {
  KVD_EXPECT(max_window >= 0 && max_window <= 1024, "window profile: max_window {} outside 0..1024", max_window);
  KVD_EXPECT(logs.size() == static_cast<std::size_t>(layers) * kv_heads, "window profile: {} logs for {} x {} streams", logs.size(), layers,
             kv_heads);
  KVD_EXPECT(!warm_up || (warm && warm->size() == logs.size()), "window profile: warm-up needs one placement ranking per stream");
  eviction::WindowProfile p;
  p.layers = layers;
  p.kv_heads = kv_heads;
  p.max_window = max_window;
  p.saved.resize(logs.size() * static_cast<std::size_t>(max_window + 1));
  p.cost.resize(p.saved.size());
  for (std::size_t s = 0; s < logs.size(); ++s)
    for (int w = 0; w <= max_window; ++w) {
      ReplaySettings r;
      r.window = w;
      r.warm_up = warm_up;
      const CacheTally t = replay_cache(policy, logs[s], r, warm_up ? &(*warm)[s] : nullptr);
      p.saved[p.at(s, w)] = t.steps ? static_cast<double>(t.hits) * static_cast<double>(page_bytes) / static_cast<double>(t.steps) : 0.0;
      const std::int64_t budget0 = logs[s].steps() ? logs[s].budget[0] : 0;
      p.cost[p.at(s, w)] = static_cast<std::int64_t>(w) * budget0 * static_cast<std::int64_t>(page_bytes);
    }
  return p;
}

/// The profile of every stream of `trace` (a SyntheticTrace or RecordedTrace) under `index`.
template <class Trace, index::IndexPolicy I, eviction::EvictionPolicy E>
eviction::WindowProfile profile_windows(const Trace& trace, const I& index, const E& policy, const EvalSettings& set,
                                        const tier::ImportanceGuided* warm_up, int max_window) {
  const ModelShape shape = trace.shape();
  std::vector<SelectionLog> logs(static_cast<std::size_t>(shape.layers) * shape.kv_heads);
  std::vector<tier::PageRanking> warm(logs.size());
  for (int l = 0; l < shape.layers; ++l)
    for (int h = 0; h < shape.kv_heads; ++h) {
      const std::size_t s = static_cast<std::size_t>(l) * shape.kv_heads + h;
      const StreamTrace tr = trace.stream(l, h);
      std::vector<std::unique_ptr<AnyIndex>> one;
      one.push_back(make_any_index(index));
      std::vector<SelectionLog> out;
      evaluate_stream(tr, one, set, &out);
      logs[s] = std::move(out[0]);
      if (warm_up) warm[s] = warm_ranking(tr, set, *warm_up);
    }
  const std::size_t page_bytes = 2 * static_cast<std::size_t>(set.page_tokens) * shape.head_dim * dtype_size(set.dtype);
  return profile_windows(logs, &warm, shape.layers, shape.kv_heads, max_window, page_bytes, policy, warm_up != nullptr);
}

}  // namespace kvdrive::eval
