// Index selection: every index policy x contexts {8K, 32K, 128K} x budgets {1.56%, 6.25%}.
// The timed loop is one select() for one stream (a GQA group of 4 query heads, head_dim 128,
// fp16 KV and index data, 8-token pages) of the synthetic `default` trace, cycling through the
// trace's decode-step queries. Next to the time, counters give the index's quality on the same
// trace (mass recall mean and minimum over heads, top-k recall, output error: eval::evaluate_stream
// over a few streams and steps) and its size, and floor_us = index bytes / the memcpy bandwidth
// measured in the same run (one thread, bytes copied per second). The index is warm in cache
// here (one stream); in a real decode it competes with every other stream's index.
// rescored-hierarchical is index::TokenRescore over Hierarchical at its default pool (the
// default index of kvd-llama: 8 budgets or half the candidates, whichever is more, by the key
// copies' own first look), rescored-hierarchical-inner the same pool taken by Hierarchical's
// member ranking (the default before 2026-12-06's third session), rescored-hierarchical-coarse
// as Hierarchical's best whole clusters, rescored-hierarchical-pool4 a pool of 4 budgets alone.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/eval/trace_stats.hpp"
#include "kvdrive/index/product_quant.hpp"
#include "kvdrive/index/simhash.hpp"
#include "kvdrive/research.hpp"
#include "memcpy_rate.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

constexpr int kSteps = 8;           // decode steps scored for the quality counters
constexpr int kQualityStreams = 4;  // streams (spread over layers) scored for them
const std::vector<std::int64_t> kContexts = {8192, 32768, 131072};
const std::vector<double> kBudgets = {0.015625, 0.0625};

std::vector<std::unique_ptr<eval::AnyIndex>> every_index() {
  std::vector<std::unique_ptr<eval::AnyIndex>> v;
  v.push_back(eval::make_any_index(index::OracleMass{}));
  v.push_back(eval::make_any_index(index::Oracle{}));
  v.push_back(eval::make_any_index(index::Quest{}));
  v.push_back(eval::make_any_index(index::MeanKey{}));
  v.push_back(eval::make_any_index(index::Hierarchical{}));
  v.push_back(eval::make_any_index(index::Centroid{}));
  v.push_back(eval::make_any_index(index::SimHash{}));
  v.push_back(eval::make_any_index(index::ProductQuant{}));
  v.push_back(eval::make_any_index(index::TokenRescore<index::Hierarchical>{}));
  v.push_back(
      eval::make_any_index(index::TokenRescore<index::Hierarchical>{index::Hierarchical{}, {.inner_pool = true}}, "rescored-hierarchical-inner"));
  v.push_back(eval::make_any_index(index::TokenRescore<index::Hierarchical>{index::Hierarchical{}, {.inner_pool = true, .coarse_pool = true}},
                                   "rescored-hierarchical-coarse"));
  v.push_back(eval::make_any_index(index::TokenRescore<index::Hierarchical>{index::Hierarchical{}, {.pool = 4, .pool_share = 0}},
                                   "rescored-hierarchical-pool4"));
  return v;
}

const eval::SyntheticTrace& trace(std::int64_t context) {
  static std::map<std::int64_t, std::unique_ptr<eval::SyntheticTrace>> traces;
  auto& t = traces[context];
  if (!t) t = std::make_unique<eval::SyntheticTrace>(eval::synthetic_preset("default"), 1, context, kSteps);
  return *t;
}

/// Quality of every index on (context, budget), computed once and kept.
const std::vector<eval::IndexTally>& quality(std::int64_t context, double budget) {
  static std::map<std::pair<std::int64_t, double>, std::vector<eval::IndexTally>> cache;
  auto it = cache.find({context, budget});
  if (it != cache.end()) return it->second;
  const eval::SyntheticTrace& tr = trace(context);
  eval::EvalSettings set;
  set.budget = budget;
  std::vector<eval::IndexTally> total;
  for (const auto& [layer, head] : eval::trace_stats_streams(tr.shape(), kQualityStreams)) {
    auto indices = every_index();
    auto t = eval::evaluate_stream(tr.stream(layer, head), indices, set);
    if (total.empty()) total = t;
    else
      for (std::size_t i = 0; i < t.size(); ++i) total[i].add(t[i]);
  }
  return cache[{context, budget}] = std::move(total);
}

double memcpy_rate() {
  static const double rate = bench::memcpy_bytes_per_second();
  return rate;
}

void BM_Select(benchmark::State& state, std::size_t which, std::int64_t context, double budget) {
  const eval::SyntheticTrace& tr = trace(context);
  const eval::StreamTrace s = tr.stream(0, 0);
  auto index = every_index()[which]->clone();
  const int pt = 8, d = s.head_dim;
  // The index over the prompt's sealed pages, as the manager hands them over (f16 precision).
  std::vector<float> keys(s.keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = to_float(half(s.keys[i]));
  const std::int64_t pages = s.prefix / pt;
  index->build({keys.data(), 0, pages, pt, d, DType::f16});
  const PageRanges r = page_ranges(s.prefix + 1, pt, 4, 64);
  index::IndexQuery q;
  q.group = s.group;
  q.head_dim = d;
  q.scale = 1.0f / std::sqrt(static_cast<float>(d));
  q.first_candidate = r.sink_end;
  q.end_candidate = r.local_begin;
  q.budget_pages = Budget::fraction(budget).pages_for(r.candidates());
  std::vector<std::uint32_t> out;
  std::int64_t step = 0;
  for (auto _ : state) {
    q.q = s.query(step++ % s.steps);
    out.clear();
    index->select(q, out);
    benchmark::DoNotOptimize(out.data());
  }
  const eval::IndexTally& t = quality(context, budget)[which];
  state.counters["mass_recall"] = t.mean(t.mass_recall);
  state.counters["mass_min"] = t.mean(t.mass_recall_min);
  state.counters["topk"] = t.mean(t.topk_recall);
  state.counters["out_err"] = t.mean(t.out_err);
  state.counters["B_per_token"] = static_cast<double>(index->bytes()) / static_cast<double>(pages * pt);
  state.counters["floor_us"] = static_cast<double>(index->bytes()) / memcpy_rate() * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  const auto names = [] {
    std::vector<std::string> n;
    for (const auto& ix : every_index()) n.push_back(ix->name());
    return n;
  }();
  for (std::int64_t context : kContexts)
    for (double budget : kBudgets)
      for (std::size_t i = 0; i < names.size(); ++i) {
        const std::string name =
            "BM_Select/" + names[i] + "/ctx:" + std::to_string(context / 1024) + "K/budget:" + (budget < 0.05 ? "1.56%" : "6.25%");
        benchmark::RegisterBenchmark(name.c_str(), BM_Select, i, context, budget)->Unit(benchmark::kMicrosecond);
      }
  benchmark::Initialize(&argc, argv);
  std::printf("memcpy (one thread, bytes copied per second): %.2f GB/s; floor_us = index bytes / that\n", memcpy_rate() / 1e9);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
