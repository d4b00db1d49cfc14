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
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <charconv>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include <unistd.h>  // getpid
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/eval/cache_study.hpp"
#include "kvdrive/eval/layer_inputs.hpp"
#include "kvdrive/eval/recorded.hpp"
#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/eval/synthetic_spec.hpp"
#include "kvdrive/eval/trace_stats.hpp"
#include "kvdrive/index/product_quant.hpp"
#include "kvdrive/index/simhash.hpp"
#include "memcpy_rate.hpp"

using namespace kvdrive;

namespace {

struct Options {
  std::string trace = "synthetic:default";
  std::int64_t context = 32768;
  std::int64_t steps = 32;
  double budget = 0.0625;
  FocusCarry carry{.share = 0.0f};  ///< off unless asked: the tables are each index's own selection
  std::string indices = "all";
  int page_tokens = 8;
  int sink_tokens = 4, local_tokens = 64;
  std::string dtype = "f16";
  int streams = 0;
  unsigned threads = 0;
  std::string json;
  bool trace_stats = false;
  int cluster_pages = index::HierarchicalParams{}.pages_per_cluster;
  double expand = index::HierarchicalParams{}.expand;
  double min_scored = index::HierarchicalParams{}.min_scored;
  std::int64_t score_all_below = index::HierarchicalParams{}.score_all_below;
  float radius_weight = index::HierarchicalParams{}.radius_weight;
  int pair_radii = index::HierarchicalParams{}.pair_radii;
  float pair_weight = index::HierarchicalParams{}.pair_weight;
  index::TokenRescoreParams rescore;
  std::string rotary = "adjacent";  ///< adjacent (GGUF, llama2.c) or halves (Hugging Face): the keys' RoPE pairs
  // cache replay
  std::string eviction;           ///< empty: no cache evaluation
  std::string window = "3";       ///< W, or "knapsack"
  std::int64_t cache_bytes = 0;   ///< fast-tier bytes over the evaluated streams (0: what --window W needs)
  std::string warm_up = "on";
  int max_window = 8;
  std::string solver = "greedy";
  std::string calibration;        ///< knapsack profile trace (default: synthetic, next seed; recorded, the same file)
  float decay = eviction::Lookahead{}.decay;
  // pipeline replay
  std::string pipeline;           ///< empty: none; else a list of serial, elastic
  int pipeline_layers = 1;
  std::string store_dir;          ///< where the replay's SSD stores go (default: the temp directory)
};

double mib(std::size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

const std::vector<std::string>& all_index_names() {
  static const std::vector<std::string> names = {"oracle-mass", "oracle", "quest", "mean-key", "hierarchical",
                                                 "centroid", "simhash", "product-quant", "rescored-hierarchical",
                                                 "rescored-quest"};
  return names;
}

/// --calibration prompt[:N]: profile the knapsack on the scored trace's own prompt, its last N
/// tokens (32 by default) as decode steps; nullopt for any other value.
std::optional<std::int64_t> prompt_calibration(const std::string& c) {
  if (c != "prompt" && c.rfind("prompt:", 0) != 0) return std::nullopt;
  if (c == "prompt") return 32;
  std::int64_t n = 0;
  const char* first = c.data() + 7;
  const auto [end, ec] = std::from_chars(first, c.data() + c.size(), n);
  KVD_EXPECT(ec == std::errc{} && end == c.data() + c.size() && n >= 1, "--calibration '{}': expected prompt or prompt:N with N >= 1 tokens", c);
  return n;
}

/// Hierarchical's parameters from the options (the index table and the pipeline replay).
index::HierarchicalParams hierarchical_params(const Options& o) {
  index::HierarchicalParams p;
  p.pages_per_cluster = o.cluster_pages;
  p.expand = o.expand;
  p.min_scored = o.min_scored;
  p.score_all_below = o.score_all_below;
  p.radius_weight = o.radius_weight;
  p.pair_radii = o.pair_radii;
  p.pair_weight = o.pair_weight;
  p.rotary = o.rotary == "halves" ? index::RotaryPairs::halves : index::RotaryPairs::adjacent;
  return p;
}

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

std::vector<std::string> split_names(const std::string& list, const std::vector<std::string>& all = all_index_names(),
                                     const char* what = "--index") {
  if (list == "all") return all;
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    std::string name = list.substr(at, comma - at);
    KVD_EXPECT(!name.empty(), "{}: empty name in '{}'", what, list);
    KVD_EXPECT(std::find(out.begin(), out.end(), name) == out.end(), "{}: '{}' given twice", what, name);
    out.push_back(std::move(name));
    at = comma + 1;
  }
  return out;
}

using eval::SyntheticSpec;
std::optional<SyntheticSpec> parse_synthetic(const std::string& spec) { return eval::parse_synthetic_spec(spec, "--trace"); }

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  fail("--dtype: '{}' is not one of f32, f16, bf16", s);
}

/// The fast-tier bytes of the cache comparison, worked out (and checked) before any work.
struct CacheBudget {
  std::size_t streams = 0, page_bytes = 0, step_bytes = 0;  ///< step_bytes: one step of window, per stream
  std::size_t resident = 0, total = 0, avail = 0;            ///< sink + local, everything, the caches
  int w_uniform = 0;                                         ///< the uniform plan's W
};

CacheBudget cache_budget(const ModelShape& shape, const eval::EvalSettings& set, std::int64_t context, std::size_t streams,
                         const Options& o) {
  Config c;
  c.shape = shape;
  c.page_tokens = set.page_tokens;
  c.sink_tokens = set.sink_tokens;
  c.local_tokens = set.local_tokens;
  c.budget = Budget::fraction(set.budget);
  c.dtype = set.dtype;
  c.carry = set.carry;
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
  b.w_uniform = o.cache_bytes > 0 ? static_cast<int>(std::min<std::size_t>(b.step_bytes ? b.avail / (b.step_bytes * streams) : 0,
                                                                           static_cast<std::size_t>(o.max_window)))
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
  const std::size_t n = b.streams, page_bytes = b.page_bytes, step_bytes = b.step_bytes, resident = b.resident, total = b.total,
                    avail = b.avail;
  const int w_uniform = b.w_uniform;
  fmt::print("\ncache: {} evaluated streams, fast-tier budget {:.2f} MiB ({:.2f} MiB resident sink + local, {:.2f} MiB for caches); "
             "one step of window = {} pages of {} bytes per stream; warm-up {}\n",
             n, mib(total), mib(resident), mib(avail), step_bytes / page_bytes, page_bytes, o.warm_up);
  std::vector<eval::StreamSelections> calib;
  if (knapsack) {
    calib = eval::record_selections(*calibration, list, prototypes, set, pool, warm);
    fmt::print("knapsack: profiled W = 0..{} on the calibration trace, {} solver\n", o.max_window, o.solver);
  }
  const auto solver = o.solver == "exact" ? eviction::KnapsackSolver::exact : eviction::KnapsackSolver::greedy;
  fmt::print("{:<16} {:<10} {:>8} {:>11} {:>9} {:>15} {:>22} {:>12}\n", "index", "eviction", "window", "cache_MiB", "hit_rate",
             "belady_hit_rate", "fetched_bytes_per_step", "vs_belady");
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
        fmt::print("{:<16} {:<10} {:>8} {:>11.2f} {:>9.4f} {:>15.4f} {:>22.0f} {:>12.3f}\n", prototypes[ix]->name(), ev, label, used_mib,
                   hr, br, fetched, br > 0 ? hr / br : 1.0);
        rows.push_back({{"index", prototypes[ix]->name()}, {"eviction", ev}, {"window", label}, {"cache_bytes", used_mib * 1048576.0},
                        {"hit_rate", hr}, {"belady_hit_rate", br}, {"fetched_bytes_per_step", fetched}, {"windows", windows}});
      }
    }
  }
  out["cache"] = {{"total_bytes", total}, {"resident_bytes", resident}, {"warm_up", warm}, {"rows", rows}};
}

/// One pipeline's replay: the trace's first layers decoded through a KvManager on DRAM cache +
/// SsdTier, step by step, with the pipeline's stage statistics.
template <class Pipeline, class Source>
nlohmann::json run_pipeline(const Source& source, const Options& o, const eval::EvalSettings& set, const std::string& dir) {
  using Ssd = Tiers<tier::HostTier, tier::SsdTier>;
  const ModelShape full = source.shape();
  Config c;
  c.shape = {o.pipeline_layers, full.q_heads, full.kv_heads, full.head_dim};
  c.page_tokens = set.page_tokens;
  c.sink_tokens = set.sink_tokens;
  c.local_tokens = set.local_tokens;
  c.budget = Budget::fraction(set.budget);
  c.dtype = set.dtype;
  c.carry = set.carry;
  tier::SsdTier::Params sp;
  sp.path = (std::filesystem::path(dir) / fmt::format("kvd-eval-{}-{}.store", Pipeline::name(), ::getpid())).string();
  sp.mode = tier::SsdOpen::recreate;
  sp.delete_on_close = true;
  const index::HierarchicalParams hp = hierarchical_params(o);
  const int w = o.window == "knapsack" ? 3 : std::stoi(o.window);
  KvManager<index::Hierarchical, eviction::Lookahead, Ssd, Pipeline> kv(c, index::Hierarchical{hp}, eviction::Lookahead{w},
                                                                      Ssd(tier::HostTier{}, tier::SsdTier(sp)));
  const SeqId id = kv.add_sequence();
  std::vector<eval::LayerInputs> layers;
  for (int l = 0; l < o.pipeline_layers; ++l) {
    eval::LayerInputs& in = layers.emplace_back(eval::layer_inputs(source, l));
    kv.prefill(id, l, in.prompt_k(), in.prompt_v());
    if (o.warm_up == "on" && in.observed > 0) kv.warm_up(id, l, in.observation_queries());
    in.k = {};
    in.v = {};
  }
  const int qh = full.q_heads, kvh = full.kv_heads, d = full.head_dim;
  std::vector<float> out(static_cast<std::size_t>(qh) * d);
  const SeqId batch[] = {id};
  std::size_t micro_batch = 0;
  std::vector<double> step_ms;
  for (std::int64_t s = 0; s < o.steps; ++s)
    for (int l = 0; l < o.pipeline_layers; ++l) {
      const eval::LayerInputs& in = layers[static_cast<std::size_t>(l)];
      const auto q = View<const float, 3>(make_view(in.q(s), 1, qh, d)), k = View<const float, 3>(make_view(in.k_new(s), 1, kvh, d)),
                 v = View<const float, 3>(make_view(in.v_new(s), 1, kvh, d));
      if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>)
        if (s == 0 && l == 0) micro_batch = kv.tune(l, batch, q, k, v, make_view(out, 1, qh, d)).micro_batch;
      const auto t0 = std::chrono::steady_clock::now();
      kv.attend(l, batch, q, k, v, make_view(out, 1, qh, d));
      step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  std::sort(step_ms.begin(), step_ms.end());
  const Stats& st = kv.total_stats();
  const StageTimes& t = st.time;
  const double n = static_cast<double>(std::max<std::uint64_t>(1, st.steps));
  const double median = step_ms.empty() ? 0.0 : step_ms[step_ms.size() / 2];
  fmt::print("{:<9} {:>6} {:>9.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>9.3f} {:>9.3f} {:>6.2f}/{:.2f}/{:.2f} {:>8.1f}%\n",
             Pipeline::name(), micro_batch ? std::to_string(micro_batch) : std::string("-"), median, t.select_ms / n, t.classify_ms / n,
             t.fetch_ms / n, t.compute_ms / n, t.commit_ms / n, t.classify_wait_ms / n, t.fetch_wait_ms / n, t.select_bubble(),
             t.classify_bubble(), t.fetch_bubble(), 100 * st.hit_rate());
  return {{"pipeline", Pipeline::name()},
          {"micro_batch", micro_batch},
          {"step_ms_median", median},
          {"select_ms", t.select_ms / n},
          {"classify_ms", t.classify_ms / n},
          {"fetch_ms", t.fetch_ms / n},
          {"compute_ms", t.compute_ms / n},
          {"commit_ms", t.commit_ms / n},
          {"classify_wait_ms", t.classify_wait_ms / n},
          {"fetch_wait_ms", t.fetch_wait_ms / n},
          {"overlap_ms", t.overlap_ms / n},
          {"bubble", {{"select", t.select_bubble()}, {"classify", t.classify_bubble()}, {"fetch", t.fetch_bubble()}}},
          {"hit_rate", st.hit_rate()}};
}

/// The pipeline table: each pipeline's replay of the trace's first layers.
template <class Source>
nlohmann::json run_pipelines(const Source& source, const Options& o, const eval::EvalSettings& set) {
  KVD_EXPECT(o.pipeline_layers <= source.shape().layers, "--pipeline-layers {}: the trace has {} layers", o.pipeline_layers,
             source.shape().layers);
  const std::string dir = o.store_dir.empty() ? std::filesystem::temp_directory_path().string() : o.store_dir;
  fmt::print("\npipeline: layers 0..{} decoded through KvManager (hierarchical, Lookahead W={}, warm-up {}) on DRAM cache + SsdTier "
             "in {}; per layer step: median wall, stage busy ms and waits, bubbles of the overlapped phase\n",
             o.pipeline_layers - 1, o.window == "knapsack" ? 3 : std::stoi(o.window), o.warm_up, dir);
  fmt::print("{:<9} {:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>16} {:>9}\n", "pipeline", "micro", "step_ms", "select",
             "classify", "fetch", "compute", "commit", "cls_wait", "fet_wait", "bubble s/c/f", "hit_rate");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : split_names(o.pipeline, {"serial", "elastic"}, "--pipeline"))
    rows.push_back(name == "serial" ? run_pipeline<pipeline::Serial>(source, o, set, dir) : run_pipeline<pipeline::Elastic>(source, o, set, dir));
  return rows;
}

template <class Source>
int run(const Source& source, const Source* calibration, const Options& o, const std::string& label, std::int64_t prefix) {
  const ModelShape shape = source.shape();
  if (o.trace_stats) {
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
  eval::EvalSettings set;
  set.page_tokens = o.page_tokens;
  set.sink_tokens = o.sink_tokens;
  set.local_tokens = o.local_tokens;
  set.budget = o.budget;
  set.carry = o.carry;
  set.dtype = parse_dtype(o.dtype);
  set.validate();
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

  fmt::print("kvd-eval: trace {}, {} of {} streams ({} layers x {} KV heads, group {}, head_dim {}), context {}, {} steps\n",
             label, list.size(), shape.layers * shape.kv_heads, shape.layers, shape.kv_heads, shape.group(), shape.head_dim,
             prefix, o.steps);
  fmt::print("pages of {} tokens, sink {} + local {} tokens, budget {:.4g}%, KV and index dtype {}; memcpy {:.1f} GB/s (one thread); "
             "{:.1f} s on {} threads\n",
             o.page_tokens, o.sink_tokens, o.local_tokens, 100 * o.budget, o.dtype, bandwidth / 1e9, seconds, pool.threads());
  fmt::print("{:<16} {:>11} {:>15} {:>11} {:>8} {:>21} {:>10} {:>15}\n", "index", "mass_recall", "mass_recall_min", "topk_recall",
             "out_err", "index_bytes_per_token", "select_us", "select_floor_us");
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
  if (const auto *h = find("hierarchical"), *q = find("quest"); h && q)
    fmt::print("hierarchical vs quest: mass recall {:+.4f}, index bytes {:.2f}x, selection time {:.2f}x\n",
               h->mean(h->mass_recall) - q->mean(q->mass_recall), h->bytes_per_token() / q->bytes_per_token(),
               h->select_us() / q->select_us());
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

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvd-eval: index policies side by side on a synthetic or recorded trace"};
  app.add_option("--trace", o.trace, "synthetic:PRESET[:seed=N] or a file from kvd-llama --record-trace");
  app.add_option("--context", o.context, "synthetic traces: prompt tokens before the first step")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 26));
  app.add_option("--steps", o.steps, "decode steps (recorded traces: the last N positions)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--budget", o.budget, "fraction of the candidate pages selected, in (0, 1]");
  app.add_option("--carry-share", o.carry.share, "focus carry (Config::carry): the budget's share that pages the last step "
                 "attended heavily may take, in [0, 1); 0 (the default here) scores each index's own selection");
  app.add_option("--carry-mass", o.carry.mass, "focus carry: a head's attention share that keeps a page selected, in (0, 1]");
  app.add_option("--index", o.indices, "all, or a comma-separated list of: dense, oracle-mass, oracle, quest, mean-key, "
                                       "hierarchical, centroid, simhash, product-quant, rescored-hierarchical, rescored-quest");
  app.add_option("--page-tokens", o.page_tokens, "tokens per page")->check(CLI::Range(1, 4096));
  app.add_option("--sink-tokens", o.sink_tokens, "always-attended first tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--local-tokens", o.local_tokens, "always-attended last tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--dtype", o.dtype, "KV dtype (and index data): f32, f16, bf16");
  app.add_option("--streams", o.streams, "evaluate a spread subset of this many streams (0 = all)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--threads", o.threads, "worker threads (0 = all cores)");
  app.add_option("--cluster-pages", o.cluster_pages, "hierarchical and centroid: pages per cluster")->check(CLI::Range(1, 1 << 20));
  app.add_option("--expand", o.expand, "hierarchical: expand clusters until they hold this many times the budget");
  app.add_option("--min-scored", o.min_scored, "hierarchical: ... and at least this fraction of the candidates")->check(CLI::Range(0.0, 1.0));
  app.add_option("--score-all-below", o.score_all_below, "hierarchical: with fewer candidate pages, score every one (no cluster pruning)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--radius-weight", o.radius_weight, "hierarchical: weight of |q| x cluster radius in a centroid's score");
  app.add_option("--pair-radii", o.pair_radii, "hierarchical: rotary-pair radii per page in a member's score (0: its mean alone)")
      ->check(CLI::Range(0, 128));
  app.add_option("--pair-weight", o.pair_weight, "hierarchical: weight of the pair radii in a member's score");
  app.add_option("--rescore-pool", o.rescore.pool, "rescored-*: a first look (or the inner index, --rescore-inner 1) proposes this many times the budget, rescored token by token")
      ->check(CLI::Range(1.0, 1e9));
  app.add_option("--rescore-share", o.rescore.pool_share, "rescored-*: ... and at least this share of the candidates")->check(CLI::Range(0.0, 1.0));
  app.add_option("--rescore-inner", o.rescore.inner_pool, "rescored-*: pool the inner index's selection (1) or the key copies' first look (0, the default)");
  app.add_option("--rescore-coarse", o.rescore.coarse_pool, "rescored-hierarchical with --rescore-inner 1: pool the best whole clusters (1) or the best pages by their members' estimates (0, the default)");
  app.add_option("--rotary", o.rotary, "hierarchical: the channel pairs RoPE rotated in the trace's keys: adjacent (GGUF and llama2.c models) or halves (Hugging Face models)")
      ->check(CLI::IsMember({"adjacent", "halves"}));
  app.add_option("--json", o.json, "also write the rows as JSON to this file");
  app.add_flag("--trace-stats", o.trace_stats, "print the trace's statistics instead of comparing indices");
  app.add_option("--eviction", o.eviction, "also replay fast-tier caches: all, or a list of: lookahead, lru, lfu, last-step, none");
  app.add_option("--window", o.window, "cache window: W (uniform) or knapsack (one W per stream, within the bytes of W = 3 "
                                       "or --cache-bytes)");
  app.add_option("--cache-bytes", o.cache_bytes, "fast-tier bytes over the evaluated streams, sink and local included (0: what --window W needs)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 50));
  app.add_option("--warm-up", o.warm_up, "on: importance-guided placement fills the caches at step 0; off")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--max-window", o.max_window, "knapsack and --cache-bytes: the largest W considered")->check(CLI::Range(0, 64));
  app.add_option("--solver", o.solver, "knapsack solver: greedy or exact")->check(CLI::IsMember({"greedy", "exact"}));
  app.add_option("--calibration", o.calibration,
                 "knapsack profile trace (default: synthetic traces, the next seed; recorded, the same file), or prompt[:N]: a recorded trace's own prompt, its last N tokens (32) as decode steps");
  app.add_option("--decay", o.decay, "lookahead: per-step decay of a page's accumulated attention, in [0, 1]")->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--pipeline", o.pipeline, "also decode the trace's first layers through KvManager on DRAM cache + SSD and print "
                 "each pipeline's stage statistics: all, or a list of: serial, elastic");
  app.add_option("--pipeline-layers", o.pipeline_layers, "--pipeline: how many of the trace's layers (from layer 0)")->check(CLI::Range(1, 1024));
  app.add_option("--store-dir", o.store_dir, "--pipeline: the folder for the SSD stores (default: the temporary directory)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!o.json.empty()) {  // a bad path fails now, not after the run
      std::ofstream probe(o.json, std::ios::app);
      KVD_EXPECT(probe.good(), "--json {}: cannot write there", o.json);
    }
    KVD_EXPECT(!o.eviction.empty() || (app.count("--window") + app.count("--cache-bytes") + app.count("--warm-up") +
                                         app.count("--solver") + app.count("--calibration") + app.count("--decay")) == 0,
               "--window, --cache-bytes, --warm-up, --solver, --calibration and --decay need --eviction");
    KVD_EXPECT(o.window == "knapsack" || (o.window.find_first_not_of("0123456789") == std::string::npos && !o.window.empty() &&
                                          o.window.size() <= 2 && std::stoi(o.window) <= 64),
               "--window '{}': expected a window 0..64 or 'knapsack'", o.window);
    KVD_EXPECT(o.window == "knapsack" || app.count("--cache-bytes") == 0 || app.count("--window") == 0,
               "give --window W or --cache-bytes, not both (--cache-bytes sets the uniform W)");
    const bool knapsack = o.window == "knapsack";
    KVD_EXPECT(!o.pipeline.empty() || (app.count("--pipeline-layers") + app.count("--store-dir")) == 0,
               "--pipeline-layers and --store-dir need --pipeline");
    if (!o.pipeline.empty())  // names checked up front, not after the evaluation
      for (const std::string& name : split_names(o.pipeline, {"serial", "elastic"}, "--pipeline"))
        KVD_EXPECT(name == "serial" || name == "elastic", "--pipeline: unknown pipeline '{}' (known: all, serial, elastic)", name);
    if (!o.eviction.empty())  // names checked up front, not after the evaluation
      for (const std::string& name : split_names(o.eviction, eval::eviction_names(), "--eviction"))
        eval::with_eviction(name, o.decay, [](const auto&) { return 0; });
    if (const auto spec = parse_synthetic(o.trace)) {
      const eval::SyntheticTrace source(eval::synthetic_preset(spec->preset), spec->seed, o.context, o.steps);
      std::optional<eval::SyntheticTrace> calib;
      if (knapsack) {
        const SyntheticSpec cs = o.calibration.empty() ? SyntheticSpec{spec->preset, spec->seed + 1} : parse_synthetic(o.calibration).value_or(SyntheticSpec{});
        KVD_EXPECT(!cs.preset.empty(), "--calibration '{}': a synthetic trace is calibrated on a synthetic one (synthetic:PRESET[:seed=N])", o.calibration);
        calib.emplace(eval::synthetic_preset(cs.preset), cs.seed, o.context, o.steps);
        fmt::print("calibration trace: synthetic:{}:seed={}\n", cs.preset, cs.seed);
      }
      return run(source, calib ? &*calib : nullptr, o, fmt::format("synthetic:{}:seed={}", spec->preset, spec->seed), o.context);
    }
    KVD_EXPECT(app.count("--context") == 0,
               "--context applies to synthetic traces; a recorded trace's context is its positions minus --steps");
    const eval::RecordedTrace source(o.trace, o.steps);
    std::optional<eval::RecordedTrace> calib;
    if (knapsack) {
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
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvd-eval: {}\n", e.what());
    return 1;
  }
}
