// kvd-eval --eviction: each index's selections replayed through fast-tier caches (eviction
// policy x window plan, at equal cache bytes), against the clairvoyant Belady cache of the same
// capacity; --window knapsack gives each stream its own W, profiled on a calibration trace,
// within the bytes of the uniform plan.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "eval_options.hpp"
#include "kvdrive/eval/cache_study.hpp"
#include "kvdrive/research.hpp"

namespace kvdrive::kvd_eval {

inline double mib(std::size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

/// The fast-tier bytes of the cache comparison, worked out (and checked) before any work.
struct CacheBudget {
  std::size_t streams = 0, page_bytes = 0, step_bytes = 0;  ///< step_bytes: one step of window, per stream
  std::size_t resident = 0, total = 0, avail = 0;           ///< sink + local, everything, the caches
  int w_uniform = 0;                                        ///< the uniform plan's W
};

inline CacheBudget cache_budget(const ModelShape& shape, const eval::EvalSettings& set, std::int64_t context, std::size_t streams, const Options& o) {
  const Config c = manager_config(shape, set);
  CacheBudget b;
  b.streams = streams;
  b.page_bytes = c.page_bytes();
  b.step_bytes = eviction::window_step_bytes(c, context);
  b.resident = static_cast<std::size_t>(eviction::resident_pages(c, context)) * b.page_bytes * streams;
  // Equal bytes: --cache-bytes, else what uniform W (3 for knapsack) takes.
  const int w_given = o.window == "knapsack" ? 3 : std::stoi(o.window);
  b.total = o.cache_bytes > 0 ? static_cast<std::size_t>(o.cache_bytes) : b.resident + static_cast<std::size_t>(w_given) * b.step_bytes * streams;
  b.avail = eviction::cache_bytes_for(c, context, streams, b.total);
  // With --cache-bytes, the largest W that fits (at most --max-window); else the W asked for.
  b.w_uniform =
      o.cache_bytes > 0
          ? static_cast<int>(std::min<std::size_t>(b.step_bytes ? b.avail / (b.step_bytes * streams) : 0, static_cast<std::size_t>(o.max_window)))
          : w_given;
  return b;
}

/// The cache table: every index x eviction x window plan, replayed at equal cache bytes.
template <class Source>
void run_cache(const Source* calibration, const Options& o, const eval::EvalSettings& set, const CacheBudget& b,
               const std::vector<std::pair<int, int>>& list, const std::vector<std::unique_ptr<eval::AnyIndex>>& prototypes,
               const std::vector<eval::StreamSelections>& selections, ThreadPool& pool, nlohmann::json& out) {
  const std::vector<std::string> evictions = split_names(o.eviction, eval::eviction_names(), "--eviction");
  const bool knapsack = o.window == "knapsack", warm = o.warm_up == "on";
  const std::size_t n = b.streams, page_bytes = b.page_bytes, step_bytes = b.step_bytes, resident = b.resident, total = b.total, avail = b.avail;
  const int w_uniform = b.w_uniform;
  fmt::print(
      "\ncache: {} evaluated streams, fast-tier budget {:.2f} MiB ({:.2f} MiB resident sink + local, {:.2f} MiB for caches); "
      "one step of window = {} pages of {} bytes per stream; warm-up {}\n",
      n, mib(total), mib(resident), mib(avail), step_bytes / page_bytes, page_bytes, o.warm_up);
  std::vector<eval::StreamSelections> calib;
  if (knapsack) {
    calib = eval::record_selections(*calibration, list, prototypes, set, pool, warm);
    fmt::print("knapsack: profiled W = 0..{} on the calibration trace, {} solver\n", o.max_window, o.solver);
  }
  const auto solver = o.solver == "exact" ? eviction::KnapsackSolver::exact : eviction::KnapsackSolver::greedy;
  fmt::print("{:<16} {:<10} {:>8} {:>11} {:>9} {:>15} {:>22} {:>12}\n", "index", "eviction", "window", "cache_MiB", "hit_rate", "belady_hit_rate",
             "fetched_bytes_per_step", "vs_belady");
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t ix = 0; ix < prototypes.size(); ++ix) {
    for (const std::string& ev : evictions) {
      const int w = eval::window_for(ev, w_uniform);
      std::vector<std::pair<std::string, std::vector<int>>> plans{{std::to_string(w), std::vector<int>(n, w)}};
      if (knapsack && eval::window_for(ev, -1) < 0)  // fixed-window policies have no plan to choose
        plans.emplace_back("knapsack", eval::knapsack_windows(calib, ix, ev, o.max_window, page_bytes, step_bytes, avail, warm, solver, o.decay));
      for (const auto& [label, windows] : plans) {
        const eval::CacheRun run = eval::replay_streams(selections, ix, ev, windows, warm, o.decay);
        std::int64_t wsum = 0;
        for (int x : windows) wsum += x;
        const double used_mib = mib(resident + static_cast<std::size_t>(wsum) * step_bytes);
        const double fetched = static_cast<double>(run.policy.misses) * static_cast<double>(page_bytes) / static_cast<double>(o.steps);
        const double hr = run.policy.hit_rate(), br = run.belady.hit_rate();
        fmt::print("{:<16} {:<10} {:>8} {:>11.2f} {:>9.4f} {:>15.4f} {:>22.0f} {:>12.3f}\n", prototypes[ix]->name(), ev, label, used_mib, hr, br,
                   fetched, br > 0 ? hr / br : 1.0);
        rows.push_back({{"index", prototypes[ix]->name()},
                        {"eviction", ev},
                        {"window", label},
                        {"cache_bytes", used_mib * 1048576.0},
                        {"hit_rate", hr},
                        {"belady_hit_rate", br},
                        {"fetched_bytes_per_step", fetched},
                        {"windows", windows}});
      }
    }
  }
  out["cache"] = {{"total_bytes", total}, {"resident_bytes", resident}, {"warm_up", warm}, {"rows", rows}};
}

}  // namespace kvdrive::kvd_eval
