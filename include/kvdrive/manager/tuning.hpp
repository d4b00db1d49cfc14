// The manager's three tuners:
//   tune_micro_batch  the pipeline's micro-batch size, from dry steps (DryRun: every stage but
//                     the durable writes, then rolled back) of each candidate size
//   tune_clusters     the index's cluster size, from the prompt's keys and last queries
//                     (index/cluster_size.hpp), and reindex(), which rebuilds a layer's index
//   grow_window       one step of cache-size tuning during the first decode steps
// KvManager::tune, tune_clusters, reindex and grow_windows say what each does for a user.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/index/cluster_size.hpp"
#include "kvdrive/manager/checks.hpp"
#include "kvdrive/manager/prompt_keys.hpp"
#include "kvdrive/manager/step.hpp"
#include "kvdrive/pipeline/concept.hpp"

namespace kvdrive::manager {

/// What tune() measured: the step time of each micro-batch size tried, and the one chosen.
struct TuneReport {
  std::size_t micro_batch = 0;                          ///< chosen (streams)
  std::vector<std::pair<std::size_t, double>> step_ms;  ///< (micro-batch, median ms)
};

/// A step's stages with commit turned off: for calibration runs that are then rolled back.
template <class S>
struct DryRun {
  S& s;
  std::size_t streams() const { return s.streams(); }
  void select(std::size_t i) { s.select(i); }
  void select_range(std::size_t a, std::size_t b) { s.select_range(a, b); }
  void classify(std::size_t i) { s.classify(i); }
  void fetch(std::size_t i) { s.fetch(i); }
  void fetch_range(std::size_t a, std::size_t b) { s.fetch_range(a, b); }
  void fetch_start(std::size_t a, std::size_t b) { s.fetch_start(a, b); }
  void fetch_finish(std::size_t a, std::size_t b) { s.fetch_finish(a, b); }
  // No prepare_commit: its writes are durable and real; a dry step must not make them.
  void compute(std::size_t a, std::size_t b) { s.compute(a, b); }
  void compute_ready(std::size_t a, std::size_t b) { s.compute_ready(a, b); }
  void commit() {}
  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { s.parallel_for(n, fn); }
  StageTimes& times() { return s.times(); }
};

/// A dry run must offer every capability of the step but the durable one, or tune() would time
/// a different pipeline from the one attend() runs.
template <class S>
inline constexpr bool kDryRunMatches = pipeline::RangeSelect<DryRun<S>> == pipeline::RangeSelect<S>&& pipeline::RangeFetch<DryRun<S>> ==
                                           pipeline::RangeFetch<S>&& pipeline::AsyncFetch<DryRun<S>> ==
                                           pipeline::AsyncFetch<S>&& pipeline::EarlyCompute<DryRun<S>> == pipeline::EarlyCompute<S> &&
                                       !pipeline::PreparedCommit<DryRun<S>>;

/// The micro-batch sizes tune() tries for a step of `streams` streams: all, /2, /4, /8, 1.
inline std::vector<std::size_t> micro_batch_candidates(std::size_t streams) {
  std::vector<std::size_t> sizes;
  for (std::size_t div : {1, 2, 4, 8, 1 << 30}) {
    const std::size_t mb = std::max<std::size_t>(1, streams / std::min<std::size_t>(div, streams));
    if (std::find(sizes.begin(), sizes.end(), mb) == sizes.end()) sizes.push_back(mb);
  }
  return sizes;
}

/// The size with the fastest median; a split must beat the whole batch by 10% (dry steps are
/// noisy, and a needless split only adds hand-offs).
inline TuneReport choose_micro_batch(std::size_t streams, const std::vector<std::size_t>& sizes, std::vector<std::vector<double>>& ms) {
  TuneReport report;
  double whole = 0, best_split = std::numeric_limits<double>::infinity();
  std::size_t split = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    const double median = ms[i][ms[i].size() / 2];
    report.step_ms.emplace_back(sizes[i], median);
    if (sizes[i] == streams) {
      whole = median;
    } else if (median < best_split) {
      best_split = median;
      split = sizes[i];
    }
  }
  report.micro_batch = split != 0 && best_split < 0.90 * whole ? split : streams;
  return report;
}

/// Times `repeats` dry steps of each micro-batch size, the sizes taking turns round by round so
/// that drift in the machine's speed hits them alike, and sets the fastest. Nothing else changes.
template <class Core>
TuneReport tune_micro_batch(Core& c, PageStore<Core>& store, std::vector<PlanOf<Core>>& plans, const StepInputs& in, int repeats) {
  TuneReport report;
  if constexpr (requires(typename Core::Pipeline & p, std::size_t n) { p.set_micro_batch(n); }) {
    static_assert(kDryRunMatches<Step<Core>>, "DryRun must offer the step's capabilities (pipeline/concept.hpp)");
    const std::size_t streams = in.batch.size() * static_cast<std::size_t>(c.cfg.shape.kv_heads);
    const std::vector<std::size_t> sizes = micro_batch_candidates(streams);
    const typename Core::Pipeline saved = c.pipeline;
    std::vector<std::vector<double>> ms(sizes.size());
    try {
      for (int r = 0; r < repeats; ++r)
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          c.pipeline.set_micro_batch(sizes[i]);
          Step<Core> step(c, store, plans, in);
          DryRun<Step<Core>> dry{step};
          const auto t0 = std::chrono::steady_clock::now();
          try {
            c.pipeline.run(dry);
          } catch (...) {
            step.abort();
            throw;
          }
          ms[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          step.abort();
        }
    } catch (...) {
      c.pipeline = saved;
      throw;
    }
    report = choose_micro_batch(streams, sizes, ms);
    c.pipeline.set_micro_batch(report.micro_batch);
  }
  return report;
}

/// Index states built by `index` over each head's first `sealed` pages' keys (keys[head]).
template <class Core>
std::vector<typename Core::Index::State> build_indexes(const Core& c, const typename Core::Index& index, std::uint32_t sealed,
                                                       const std::vector<std::vector<float>>& keys) {
  std::vector<typename Core::Index::State> fresh(keys.size());
  if (sealed > 0)
    for (std::size_t h = 0; h < keys.size(); ++h) index.build(fresh[h], c.page_keys_view(0, sealed, keys[h]));
  return fresh;
}

/// Gives one layer's streams the states build_indexes() made, and counts the key reads.
template <class Core>
void install_indexes(Core& c, typename Core::SequenceT& seq, int layer, std::vector<typename Core::Index::State>& fresh,
                     const std::array<std::uint64_t, kMaxTiers>& key_bytes) noexcept {
  for (std::size_t h = 0; h < fresh.size(); ++h) c.stream(seq, layer, static_cast<int>(h)).index = std::move(fresh[h]);
  for (std::size_t i = 0; i < kMaxTiers; ++i) c.total.bytes_read[i] += key_bytes[i];
}

/// Every KV head's prompt keys of one undecoded layer, read back (`what` names the caller, `hint`
/// ends its error).
template <class Core>
std::vector<std::vector<float>> layer_prompt_keys(Core& c, PageStore<Core>& store, SeqId id, const typename Core::SequenceT& seq, int layer,
                                                  std::int64_t tokens, std::array<std::uint64_t, kMaxTiers>& key_bytes, const char* what,
                                                  const char* hint) {
  const int kvh = c.cfg.shape.kv_heads;
  std::vector<std::vector<float>> keys(static_cast<std::size_t>(kvh));
  std::vector<std::byte> scratch(store.page_bytes());
  for (int h = 0; h < kvh; ++h) {
    const auto& st = c.stream(seq, layer, h);
    KVD_EXPECT(st.steps == 0, "{}: sequence {} layer {} has already decoded{}", what, id, layer, hint);
    read_prompt_keys(store, c.cfg, st, tier::PageKey{id, static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), 0}, tokens,
                     keys[static_cast<std::size_t>(h)], scratch.data(), key_bytes, nullptr);
  }
  return keys;
}

/// Chooses the index's cluster size on one prefilled layer (KvManager::tune_clusters).
template <class Core>
index::ClusterSizeChoice tune_clusters(Core& c, PageStore<Core>& store, SeqId id, int layer, View<const float, 3> q_obs, std::span<const int> sizes,
                                       double tolerance) {
  c.check_layer(layer);
  auto& seq = c.sequences.usable(id);
  const int kvh = c.cfg.shape.kv_heads;
  const std::int64_t tokens = c.stream(seq, layer, 0).pages.tokens;
  check_observation(c.cfg, q_obs, tokens, "tune_clusters");
  const auto sealed = static_cast<std::uint32_t>(tokens / c.cfg.page_tokens);
  std::array<std::uint64_t, kMaxTiers> key_bytes{};
  std::vector<std::vector<float>> keys = layer_prompt_keys(c, store, id, seq, layer, tokens, key_bytes, "tune_clusters", "; tune after prefill");
  std::vector<std::vector<float>> queries(static_cast<std::size_t>(kvh));
  std::vector<index::ClusterCalibration> calibration;
  const PageRanges r = c.ranges(tokens + 1);
  for (int h = 0; h < kvh; ++h) {
    const auto hu = static_cast<std::size_t>(h);
    group_queries(c.cfg, q_obs, h, queries[hu]);
    index::ClusterCalibration cal;
    cal.keys = c.page_keys_view(0, sealed, keys[hu]);
    cal.queries = queries[hu];
    cal.group = c.cfg.group();
    cal.scale = c.cfg.scale();
    cal.first_candidate = r.sink_end;
    cal.end_candidate = std::min<std::int64_t>(r.local_begin, sealed);
    cal.budget_pages = c.cfg.budget.pages_for(r.candidates());
    if (cal.end_candidate > cal.first_candidate) calibration.push_back(cal);
  }
  KVD_EXPECT(!calibration.empty(), "tune_clusters: layer {} of sequence {} has no candidate pages to calibrate on ({} tokens)", layer, id, tokens);
  index::ClusterSizeChoice choice = index::choose_cluster_size(c.index, calibration, sizes, tolerance);
  typename Core::Index tuned = c.index;
  tuned.params.pages_per_cluster = choice.pages_per_cluster;
  std::vector<typename Core::Index::State> fresh = build_indexes(c, tuned, sealed, keys);
  // Commit (cannot fail): the new size, and this layer's streams on their new index.
  c.index = std::move(tuned);
  install_indexes(c, seq, layer, fresh, key_bytes);
  return choice;
}

/// Rebuilds one prefilled layer's index with the index policy's current parameters.
template <class Core>
void reindex(Core& c, PageStore<Core>& store, SeqId id, int layer) {
  c.check_layer(layer);
  auto& seq = c.sequences.usable(id);
  const std::int64_t tokens = c.stream(seq, layer, 0).pages.tokens;
  std::array<std::uint64_t, kMaxTiers> key_bytes{};
  std::vector<std::vector<float>> keys = layer_prompt_keys(c, store, id, seq, layer, tokens, key_bytes, "reindex", "");
  std::vector<typename Core::Index::State> fresh = build_indexes(c, c.index, static_cast<std::uint32_t>(tokens / c.cfg.page_tokens), keys);
  install_indexes(c, seq, layer, fresh, key_bytes);  // cannot fail
}

/// Whether the fast tier has room for one more step's budget of every stream of `layer`, on top
/// of what the caches not yet full to their W will take and a step's worth of staging for `batch`.
template <class Core>
bool room_to_grow(Core& c, int layer, std::span<const SeqId> batch) {
  const int kvh = c.cfg.shape.kv_heads;
  const auto budget_of = [&](const typename Core::StreamT& st) { return c.cache_capacity(1, c.ranges(st.pages.tokens + 1)); };
  // Room already promised: caches that have not yet filled to their W (they fill over the
  // next W steps, so free pages overstate what is left).
  std::size_t promised = 0, needed = 0, staging = 0;
  for (const auto& [id, seq] : c.sequences)
    for (std::size_t i = 0; i < seq.streams.size(); ++i) {
      const std::size_t cap = budget_of(seq.streams[i]) * static_cast<std::size_t>(c.plan->windows[i]);
      promised += cap - std::min(cap, c.eviction.size(seq.streams[i].cache));
    }
  for (int h = 0; h < kvh; ++h) {
    if (c.plan->window(layer, h) >= c.growth->max_window) continue;
    for (const auto& [id, seq] : c.sequences) needed += budget_of(seq.streams[static_cast<std::size_t>(layer) * kvh + h]);
  }
  for (SeqId id : batch)
    for (int h = 0; h < kvh; ++h) staging += budget_of(c.stream(c.sequences.find(id), layer, h));
  const std::size_t free = c.tiers.fast().free_pages();
  return free >= promised && free - promised >= needed && free - promised - needed >= staging;
}

/// One step of grow_windows(): after a step whose classify + fetch time exceeds its select time,
/// the layer's W grows by one for every KV head below max_window, if room_to_grow(). Runs after
/// the step applied, so it allocates nothing.
template <class Core>
void grow_window(Core& c, int layer, std::span<const SeqId> batch, const StageTimes& t) {
  int& seen = c.growth_steps[static_cast<std::size_t>(layer)];
  if (seen >= c.growth->steps) return;
  ++seen;
  if (!c.plan || t.classify_ms + t.fetch_ms <= t.select_ms) return;  // no plan: cleared by hand
  const int kvh = c.cfg.shape.kv_heads;
  bool can_grow = false;
  for (int h = 0; h < kvh; ++h) can_grow = can_grow || c.plan->window(layer, h) < c.growth->max_window;
  if (!can_grow || !room_to_grow(c, layer, batch)) return;
  for (int h = 0; h < kvh; ++h) {
    int& w = c.plan->windows[static_cast<std::size_t>(layer) * kvh + h];
    if (w < c.growth->max_window) ++w;  // a head planned above max_window keeps its W
  }
  ++c.growth_grown[static_cast<std::size_t>(layer)];
}

}  // namespace kvdrive::manager
