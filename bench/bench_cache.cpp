// Fast-tier cache: hit rate and traffic of every eviction policy at W = 0..4, at budgets
// {1.56%, 6.25%}, on the synthetic `default` trace at 32K (seeds 1 and 2) and on a trace of the
// real stories260K model when the model is present (../shared/models). Each row is replayed at
// equal cache bytes (W x budget pages per stream) and compared with Belady's clairvoyant cache
// at the same bytes, and Lookahead with Lru; the knapsack plan (profiled on another seed, or on
// a sampled stories260K run) is compared with the uniform plan of the same bytes.
// Then Google Benchmark times one update() of each policy for a 32K stream at 6.25% (256
// selected pages, capacity 768): the per-stream CPU cost of the cache bookkeeping.
//
//   bench_cache [--streams N] [--sweep-only | --no-sweep] [Google Benchmark flags]
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "decoder/decoder.hpp"
#include "model/llama2c.hpp"
#include "decoder/sampler.hpp"
#include "kvdrive/eval/cache_study.hpp"
#include "kvdrive/eval/recorded.hpp"
#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/eval/trace_stats.hpp"
#include "kvdrive/research.hpp"

using namespace kvdrive;

namespace {

constexpr std::int64_t kContext = 32768;
constexpr std::int64_t kSteps = 32;
const std::vector<double> kBudgets = {0.015625, 0.0625};

std::vector<std::unique_ptr<eval::AnyIndex>> indices() {
  std::vector<std::unique_ptr<eval::AnyIndex>> v;
  v.push_back(eval::make_any_index(index::Quest{}));
  v.push_back(eval::make_any_index(index::Hierarchical{}));
  return v;
}

/// Records 512 positions of stories260K from BOS (greedy, or sampled at temperature 1).
bool record_stories(const std::string& model_path, const std::string& out, float temperature, std::uint64_t seed) {
  if (!std::filesystem::exists(model_path)) return false;
  ThreadPool pool(2);
  const llama::Model m = llama::load_llama2c(model_path);
  const auto& c = m.config;
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.budget = Budget::fraction(1.0);
  KvManager<index::Dense, eviction::None> kv(cfg);
  llama::Decoder dec(m, kv, pool, 64);
  eval::TraceWriter w(out, cfg.shape, cfg.dtype);
  dec.record(&w);
  const int bos[] = {1};
  const std::vector<float>* logits = &dec.prefill(bos);
  llama::Sampler sampler(temperature, 1.0f, seed);
  for (int s = 0; s < 511; ++s) logits = &dec.step(sampler.sample(*logits));
  w.close();
  return true;
}

/// The sweep on one trace: each index x budget x policy x W, plus knapsack at W = 3's bytes.
template <class Trace>
void sweep(const char* label, const Trace& trace, const Trace& calibration, int streams) {
  const auto list = eval::trace_stats_streams(trace.shape(), streams);
  const auto prototypes = indices();
  ThreadPool pool(2);
  for (double budget : kBudgets) {
    eval::EvalSettings set;
    set.budget = budget;
    const auto sel = eval::record_selections(trace, list, prototypes, set, pool, true);
    const auto cal = eval::record_selections(calibration, list, prototypes, set, pool, true);
    Config c;
    c.shape = trace.shape();
    c.budget = Budget::fraction(budget);
    const std::int64_t context = trace.stream(list[0].first, list[0].second).prefix;
    const std::size_t step_bytes = eviction::window_step_bytes(c, context), n = list.size();
    const double steps = static_cast<double>(sel[0].logs[0].steps());
    fmt::print("\n{}: {} streams, context {}, budget {:.4g}% ({} pages), warm-up on\n", label, n, context, 100 * budget, step_bytes / c.page_bytes());
    fmt::print("{:<13} {:>2} {:>10} {:>8} {:>8} {:>8} {:>9} {:>8} {:>12} {:>12} {:>11}\n", "index", "W", "lookahead", "lru", "lfu", "last-step",
               "none", "belady", "la/belady", "la-lru", "la_KiB/step");
    for (std::size_t ix = 0; ix < prototypes.size(); ++ix) {
      for (int w = 0; w <= 4; ++w) {
        const std::vector<int> windows(n, w);
        const auto la = eval::replay_streams(sel, ix, "lookahead", windows, true);
        const auto lru = eval::replay_streams(sel, ix, "lru", windows, true);
        const auto lfu = eval::replay_streams(sel, ix, "lfu", windows, true);
        const auto last = eval::replay_streams(sel, ix, "last-step", windows, true);
        const auto none = eval::replay_streams(sel, ix, "none", windows, true);
        fmt::print("{:<13} {:>2} {:>10.4f} {:>8.4f} {:>8.4f} {:>8} {:>9} {:>8.4f} {:>12.3f} {:>+12.4f} {:>11.1f}\n", prototypes[ix]->name(), w,
                   la.policy.hit_rate(), lru.policy.hit_rate(), lfu.policy.hit_rate(), w == 1 ? fmt::format("{:.4f}", last.policy.hit_rate()) : "-",
                   w == 0 ? fmt::format("{:.4f}", none.policy.hit_rate()) : "-", la.belady.hit_rate(),
                   la.belady.hit_rate() > 0 ? la.policy.hit_rate() / la.belady.hit_rate() : 1.0, la.policy.hit_rate() - lru.policy.hit_rate(),
                   static_cast<double>(la.policy.misses) * static_cast<double>(c.page_bytes()) / steps / 1024.0);
      }
      const std::size_t avail = 3 * step_bytes * n;
      const auto windows = eval::knapsack_windows(cal, ix, "lookahead", 8, c.page_bytes(), step_bytes, avail, true, eviction::KnapsackSolver::greedy);
      const auto knap = eval::replay_streams(sel, ix, "lookahead", windows, true);
      const auto uni = eval::replay_streams(sel, ix, "lookahead", std::vector<int>(n, 3), true);
      fmt::print("{:<13} knapsack at W=3's bytes: lookahead hit rate {:.4f} vs uniform {:.4f}; fetched bytes {:.3f}x uniform\n",
                 prototypes[ix]->name(), knap.policy.hit_rate(), uni.policy.hit_rate(),
                 static_cast<double>(knap.policy.misses) / static_cast<double>(std::max<std::uint64_t>(1, uni.policy.misses)));
    }
  }
}

/// One update() of a policy for a 32K stream at 6.25%: 256 selected pages drifting by ~20% a
/// step over 4096 candidates, capacity 3 x 256.
template <class E>
void BM_CacheUpdate(benchmark::State& state) {
  // 512 steps made up front (the timed loop cycles through them).
  std::mt19937_64 rng(1);
  std::vector<std::vector<std::uint32_t>> steps;
  std::vector<std::vector<float>> masses;
  std::set<std::uint32_t> current;
  for (int s = 0; s < 512; ++s) {
    std::set<std::uint32_t> next;
    for (std::uint32_t p : current)
      if (rng() % 5 != 0) next.insert(p);
    while (next.size() < 256) next.insert(static_cast<std::uint32_t>(rng() % 4096));
    current = next;
    steps.emplace_back(current.begin(), current.end());
    masses.emplace_back();
    for (std::size_t i = 0; i < 256; ++i) masses.back().push_back(static_cast<float>(rng() % 1000) / 1000.0f);
  }
  const E policy{};
  typename E::State cache{};
  std::vector<std::uint32_t> evicted;
  eviction::CacheUpdate u;
  u.window = 3;
  u.capacity = 768;
  std::uint64_t hits = 0, step = 0;
  for (auto _ : state) {
    const std::size_t i = step % steps.size();
    for (std::uint32_t p : steps[i]) hits += policy.contains(cache, p) ? 1 : 0;  // classify
    u.pages = steps[i];
    u.scores = masses[i];
    u.step = ++step;
    evicted.clear();
    policy.update(cache, u, evicted);  // commit
    benchmark::DoNotOptimize(evicted.data());
  }
  state.counters["hit_rate"] = static_cast<double>(hits) / static_cast<double>(256 * std::max<std::uint64_t>(1, step));
}

}  // namespace

int main(int argc, char** argv) {
  int streams = 0;
  bool sweep_on = true, bench_on = true;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--streams") == 0 && i + 1 < argc) streams = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--sweep-only") == 0) bench_on = false;
    else if (std::strcmp(argv[i], "--no-sweep") == 0) sweep_on = false;
    else rest.push_back(argv[i]);
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  try {
    if (sweep_on) {
      const auto preset = eval::synthetic_preset("default");
      const eval::SyntheticTrace seed1(preset, 1, kContext, kSteps), seed2(preset, 2, kContext, kSteps), seed3(preset, 3, kContext, kSteps);
      std::printf("Knapsack plans are profiled on seed 3 (synthetic) or on a sampled stories260K run, and scored on the trace named.\n");
      sweep("synthetic:default:seed=1", seed1, seed3, streams);
      sweep("synthetic:default:seed=2", seed2, seed3, streams);
      const std::string model = std::string(KVD_MODELS_DIR) + "/stories260K.bin";
      const auto dir = std::filesystem::temp_directory_path();
      const std::string greedy = (dir / "kvd_bench_cache_stories.trace").string(), sampled = (dir / "kvd_bench_cache_stories_t1.trace").string();
      if (record_stories(model, greedy, 0.0f, 1) && record_stories(model, sampled, 1.0f, 7)) {
        const eval::RecordedTrace real(greedy, 64), calib(sampled, 64);
        sweep("stories260K (greedy from BOS, 448 prompt + 64 steps)", real, calib, streams);
      } else {
        std::printf("\nstories260K: SKIPPED (%s is absent)\n", model.c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cache: %s\n", e.what());
    return 1;
  }
  if (bench_on) {
    benchmark::RegisterBenchmark("BM_CacheUpdate/lookahead", BM_CacheUpdate<eviction::Lookahead>);
    benchmark::RegisterBenchmark("BM_CacheUpdate/lru", BM_CacheUpdate<eviction::Lru>);
    benchmark::RegisterBenchmark("BM_CacheUpdate/lfu", BM_CacheUpdate<eviction::Lfu>);
    benchmark::RegisterBenchmark("BM_CacheUpdate/last-step", BM_CacheUpdate<eviction::LastStep>);
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  return 0;
}
