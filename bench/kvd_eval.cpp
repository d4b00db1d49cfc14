// kvd-eval: compares index policies side by side on a trace (synthetic or recorded by
// kvd-llama --record-trace): per index, attention-mass recall (mean and minimum over query
// heads), top-k recall, output error against dense attention, index bytes per token, selection
// time, and the selection floor (index bytes / this machine's memcpy bandwidth, measured in the
// same run). --trace-stats prints the trace's own statistics instead (cross-step overlap, window
// coverage, attention entropy, top-token mass).
//
// With --eviction, each index's selections are also replayed through fast-tier caches (eviction
// policy x window plan, at equal cache bytes): hit_rate, the clairvoyant Belady cache's hit rate
// at the same capacity, and the bytes fetched per decode step. --window knapsack profiles every
// stream on a calibration trace (by default the same preset with the next seed) and gives each
// its own W within the bytes of the uniform plan; both are printed side by side.
//
// With --pipeline serial,elastic, the trace's first --pipeline-layers layers are also decoded
// through KvManager (hierarchical, Lookahead, DRAM cache + SsdTier) by each pipeline, and their
// stage statistics are printed: busy time per stage, the waits between stages, and the bubble
// fraction of each stage in the overlapped phase.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "eval_cache.hpp"
#include "eval_options.hpp"
#include "eval_pipeline.hpp"
#include "kvdrive/research.hpp"
#include "kvdrive/eval/cache_study.hpp"
#include "kvdrive/eval/recorded.hpp"
#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/eval/synthetic_spec.hpp"
#include "kvdrive/eval/trace_stats.hpp"
#include "kvdrive/index/product_quant.hpp"
#include "kvdrive/index/simhash.hpp"
#include "memcpy_rate.hpp"

using namespace kvdrive;
using namespace kvdrive::kvd_eval;

namespace {

std::unique_ptr<eval::AnyIndex> make_index(const std::string& name, const Options& o, int head_dim) {
  if (name == "oracle-mass") return eval::make_any_index(index::OracleMass{});
  if (name == "oracle") return eval::make_any_index(index::Oracle{});
  if (name == "dense") return eval::make_any_index(index::Dense{});
  if (name == "quest") return eval::make_any_index(index::Quest{});
  if (name == "mean-key") return eval::make_any_index(index::MeanKey{});
  if (name == "hierarchical") return eval::make_any_index(index::Hierarchical{hierarchical_params(o)});
  if (name == "rescored-hierarchical")
    return eval::make_any_index(index::TokenRescore<index::Hierarchical>{index::Hierarchical{hierarchical_params(o)}, o.rescore});
  if (name == "rescored-quest") return eval::make_any_index(index::TokenRescore<index::Quest>{index::Quest{}, o.rescore});
  if (name == "centroid") {
    index::CentroidParams p;
    p.pages_per_cluster = o.cluster_pages;
    p.segment_pages = std::max(p.segment_pages, o.cluster_pages);  // a segment holds at least one cluster
    return eval::make_any_index(index::Centroid{p});
  }
  if (name == "simhash") return eval::make_any_index(index::SimHash{});
  if (name == "product-quant") {
    // The default 16 subspaces where they divide head_dim; else the largest number that does
    // (head_dim 8, as stories260K's, gets 8 subspaces of one channel).
    index::ProductQuant::Params p;
    while (head_dim % p.M != 0) --p.M;
    return eval::make_any_index(index::ProductQuant{p}, p.M == index::ProductQuant::Params{}.M ? "" : fmt::format("product-quant/M{}", p.M));
  }
  std::string known = "dense";
  for (const auto& n : all_index_names()) known += ", " + n;
  fail("--index: unknown index '{}' (known: all, {})", name, known);
}

using eval::SyntheticSpec;
std::optional<SyntheticSpec> parse_synthetic(const std::string& spec) { return eval::parse_synthetic_spec(spec, "--trace"); }

/// --trace-stats: the trace's own statistics instead of the index table.
template <class Source>
int run_trace_stats(const Source& source, const Options& o, const std::string& label) {
  eval::TraceStatsOptions so;
  so.page_tokens = o.page_tokens;
  so.sink_tokens = o.sink_tokens;
  so.local_tokens = o.local_tokens;
  so.budget = o.budget;
  so.streams = o.streams;
  so.threads = static_cast<int>(o.threads);
  const eval::TraceStats st = eval::compute_trace_stats(source, so);
  fmt::print("trace {}\n", label);
  eval::print_trace_stats(st, stdout);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << eval::trace_stats_json(st) << "\n";
    KVD_EXPECT(f.good(), "--json {}: write failed", o.json);
  }
  return 0;
}

/// The index table (one row per index, over every evaluated stream) and its JSON rows; then,
/// where both were evaluated, hierarchical against quest.
nlohmann::json print_index_table(const std::vector<eval::IndexTally>& total, double bandwidth) {
  fmt::print("{:<16} {:>11} {:>15} {:>11} {:>8} {:>21} {:>10} {:>15}\n", "index", "mass_recall", "mass_recall_min", "topk_recall", "out_err",
             "index_bytes_per_token", "select_us", "select_floor_us");
  nlohmann::json rows = nlohmann::json::array();
  for (const eval::IndexTally& t : total) {
    const double floor_us = t.mean_bytes() / bandwidth * 1e6;
    fmt::print("{:<16} {:>11.4f} {:>15.4f} {:>11.4f} {:>8.4f} {:>21.2f} {:>10.1f} {:>15.1f}\n", t.name, t.mean(t.mass_recall),
               t.mean(t.mass_recall_min), t.mean(t.topk_recall), t.mean(t.out_err), t.bytes_per_token(), t.select_us(), floor_us);
    rows.push_back({{"index", t.name},
                    {"mass_recall", t.mean(t.mass_recall)},
                    {"mass_recall_min", t.mean(t.mass_recall_min)},
                    {"topk_recall", t.mean(t.topk_recall)},
                    {"out_err", t.mean(t.out_err)},
                    {"index_bytes_per_token", t.bytes_per_token()},
                    {"select_us", t.select_us()},
                    {"select_floor_us", floor_us}});
  }
  const auto find = [&](const char* n) -> const eval::IndexTally* {
    for (const auto& t : total)
      if (t.name == n) return &t;
    return nullptr;
  };
  if (const auto* h = find("hierarchical"), *q = find("quest"); h && q)
    fmt::print("hierarchical vs quest: mass recall {:+.4f}, index bytes {:.2f}x, selection time {:.2f}x\n",
               h->mean(h->mass_recall) - q->mean(q->mass_recall), h->bytes_per_token() / q->bytes_per_token(), h->select_us() / q->select_us());
  return rows;
}

template <class Source>
int run(const Source& source, const Source* calibration, const Options& o, const std::string& label, std::int64_t prefix) {
  const ModelShape shape = source.shape();
  if (o.trace_stats) return run_trace_stats(source, o, label);
  const eval::EvalSettings set = eval_settings(o);
  const std::vector<std::string> names = split_names(o.indices);
  std::vector<std::unique_ptr<eval::AnyIndex>> prototypes;
  for (const auto& n : names) prototypes.push_back(make_index(n, o, shape.head_dim));

  const double bandwidth = bench::memcpy_bytes_per_second();
  const auto list = eval::trace_stats_streams(shape, o.streams);
  std::vector<std::vector<eval::IndexTally>> per_stream;
  const bool cache = !o.eviction.empty();
  CacheBudget budget;
  if (cache) budget = cache_budget(shape, set, prefix, list.size(), o);  // a bad budget fails now
  const unsigned threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(static_cast<unsigned>(std::min<std::size_t>(threads, list.size())));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<eval::StreamSelections> selections =
      eval::record_selections(source, list, prototypes, set, pool, cache && o.warm_up == "on", &per_stream);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<eval::IndexTally> total(names.size());
  for (std::size_t j = 0; j < names.size(); ++j) total[j].name = prototypes[j]->name();
  for (const auto& s : per_stream)
    for (std::size_t j = 0; j < s.size(); ++j) total[j].add(s[j]);

  fmt::print("kvd-eval: trace {}, {} of {} streams ({} layers x {} KV heads, group {}, head_dim {}), context {}, {} steps\n", label, list.size(),
             shape.layers * shape.kv_heads, shape.layers, shape.kv_heads, shape.group(), shape.head_dim, prefix, o.steps);
  fmt::print(
      "pages of {} tokens, sink {} + local {} tokens, budget {:.4g}%, KV and index dtype {}; memcpy {:.1f} GB/s (one thread); "
      "{:.1f} s on {} threads\n",
      o.page_tokens, o.sink_tokens, o.local_tokens, 100 * o.budget, o.dtype, bandwidth / 1e9, seconds, pool.threads());
  const nlohmann::json rows = print_index_table(total, bandwidth);
  nlohmann::json cache_json, pipeline_json;
  if (cache) run_cache(calibration, o, set, budget, list, prototypes, selections, pool, cache_json);
  if (!o.pipeline.empty()) pipeline_json = run_pipelines(source, o, set);
  if (!o.json.empty()) {
    nlohmann::json j = {{"trace", label},
                        {"context", prefix},
                        {"steps", o.steps},
                        {"budget", o.budget},
                        {"page_tokens", o.page_tokens},
                        {"dtype", o.dtype},
                        {"streams", list.size()},
                        {"memcpy_bytes_per_second", bandwidth},
                        {"rows", rows}};
    if (cache) j["cache"] = cache_json["cache"];
    if (!o.pipeline.empty()) j["pipeline"] = pipeline_json;
    std::ofstream f(o.json);
    f << j.dump(2) << "\n";
    KVD_EXPECT(f.good(), "--json {}: write failed", o.json);
  }
  return 0;
}

/// A synthetic trace (and, with --window knapsack, its calibration trace: the next seed unless
/// --calibration names one).
int run_synthetic(const SyntheticSpec& spec, const Options& o) {
  const eval::SyntheticTrace source(eval::synthetic_preset(spec.preset), spec.seed, o.context, o.steps);
  std::optional<eval::SyntheticTrace> calib;
  if (o.window == "knapsack") {
    const SyntheticSpec cs =
        o.calibration.empty() ? SyntheticSpec{spec.preset, spec.seed + 1} : parse_synthetic(o.calibration).value_or(SyntheticSpec{});
    KVD_EXPECT(!cs.preset.empty(), "--calibration '{}': a synthetic trace is calibrated on a synthetic one (synthetic:PRESET[:seed=N])",
               o.calibration);
    calib.emplace(eval::synthetic_preset(cs.preset), cs.seed, o.context, o.steps);
    fmt::print("calibration trace: synthetic:{}:seed={}\n", cs.preset, cs.seed);
  }
  return run(source, calib ? &*calib : nullptr, o, fmt::format("synthetic:{}:seed={}", spec.preset, spec.seed), o.context);
}

/// A trace recorded by kvd-llama (and, with --window knapsack, its calibration: another recorded
/// trace, the trace itself, or its own prompt).
int run_recorded(const Options& o) {
  const eval::RecordedTrace source(o.trace, o.steps);
  std::optional<eval::RecordedTrace> calib;
  if (o.window == "knapsack") {
    if (const std::optional<std::int64_t> tail = prompt_calibration(o.calibration)) {
      // The request's own prompt: its last `tail` tokens stand for decode steps (and the
      // warm-up queries before them), nothing after the prompt is seen.
      const std::int64_t prompt = source.positions() - o.steps;
      calib.emplace(o.trace, *tail, prompt);
      fmt::print("calibration: the trace's own prompt, its last {} of {} tokens as decode steps\n", *tail, prompt);
    } else {
      calib.emplace(o.calibration.empty() ? o.trace : o.calibration, o.steps);
      fmt::print("calibration trace: {}{}\n", o.calibration.empty() ? o.trace : o.calibration,
                 o.calibration.empty() ? " (the scored trace itself: give --calibration for a held-out one)" : "");
    }
    KVD_EXPECT(calib->shape().layers == source.shape().layers && calib->shape().kv_heads == source.shape().kv_heads,
               "--calibration: its shape differs from the trace's");
  }
  return run(source, calib ? &*calib : nullptr, o, o.trace, source.positions() - o.steps);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvd-eval: index policies side by side on a synthetic or recorded trace"};
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    check_options(app, o);
    if (const auto spec = parse_synthetic(o.trace)) return run_synthetic(*spec, o);
    KVD_EXPECT(app.count("--context") == 0, "--context applies to synthetic traces; a recorded trace's context is its positions minus --steps");
    return run_recorded(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvd-eval: {}\n", e.what());
    return 1;
  }
}
