// kvd-eval's command line: its options, their CLI11 definitions, and the checks made on them
// before any work (so a bad value fails at once, not after the evaluation), with what the tool's
// tables make of them: name lists, --calibration prompt[:N], Hierarchical's parameters, the
// evaluation's settings and a KvManager's Config.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "kvdrive/eval/cache_study.hpp"
#include "kvdrive/research.hpp"

namespace kvdrive::kvd_eval {

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
  std::string eviction;          ///< empty: no cache evaluation
  std::string window = "3";      ///< W, or "knapsack"
  std::int64_t cache_bytes = 0;  ///< fast-tier bytes over the evaluated streams (0: what --window W needs)
  std::string warm_up = "on";
  int max_window = 8;
  std::string solver = "greedy";
  std::string calibration;  ///< knapsack profile trace (default: synthetic, next seed; recorded, the same file)
  float decay = eviction::Lookahead{}.decay;
  // pipeline replay
  std::string pipeline;  ///< empty: none; else a list of serial, elastic
  int pipeline_layers = 1;
  std::string store_dir;  ///< where the replay's SSD stores go (default: the temp directory)
};

inline const std::vector<std::string>& all_index_names() {
  static const std::vector<std::string> names = {"oracle-mass",           "oracle",        "quest",   "mean-key",
                                                 "hierarchical",          "centroid",      "simhash", "product-quant",
                                                 "rescored-hierarchical", "rescored-quest"};
  return names;
}

/// --calibration prompt[:N]: profile the knapsack on the scored trace's own prompt, its last N
/// tokens (32 by default) as decode steps; nullopt for any other value.
inline std::optional<std::int64_t> prompt_calibration(const std::string& c) {
  if (c != "prompt" && c.rfind("prompt:", 0) != 0) return std::nullopt;
  if (c == "prompt") return 32;
  std::int64_t n = 0;
  const char* first = c.data() + 7;
  const auto [end, ec] = std::from_chars(first, c.data() + c.size(), n);
  KVD_EXPECT(ec == std::errc{} && end == c.data() + c.size() && n >= 1, "--calibration '{}': expected prompt or prompt:N with N >= 1 tokens", c);
  return n;
}

/// Hierarchical's parameters from the options (the index table and the pipeline replay).
inline index::HierarchicalParams hierarchical_params(const Options& o) {
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

inline std::vector<std::string> split_names(const std::string& list, const std::vector<std::string>& all = all_index_names(),
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

inline DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  fail("--dtype: '{}' is not one of f32, f16, bf16", s);
}

/// The evaluation's settings from the options (checked).
inline eval::EvalSettings eval_settings(const Options& o) {
  eval::EvalSettings set;
  set.page_tokens = o.page_tokens;
  set.sink_tokens = o.sink_tokens;
  set.local_tokens = o.local_tokens;
  set.budget = o.budget;
  set.carry = o.carry;
  set.dtype = parse_dtype(o.dtype);
  set.validate();
  return set;
}

/// A KvManager's Config for this shape with the evaluation's settings (the cache budget and the
/// pipeline replay).
inline Config manager_config(const ModelShape& shape, const eval::EvalSettings& set) {
  Config c;
  c.shape = shape;
  c.page_tokens = set.page_tokens;
  c.sink_tokens = set.sink_tokens;
  c.local_tokens = set.local_tokens;
  c.budget = Budget::fraction(set.budget);
  c.dtype = set.dtype;
  c.carry = set.carry;
  return c;
}

/// The index options' CLI11 definitions (Hierarchical's and TokenRescore's parameters).
inline void add_index_options(CLI::App& app, Options& o);
/// The cache and pipeline replays' CLI11 definitions.
inline void add_replay_options(CLI::App& app, Options& o);

/// The options' CLI11 definitions.
inline void add_options(CLI::App& app, Options& o) {
  app.add_option("--trace", o.trace, "synthetic:PRESET[:seed=N] or a file from kvd-llama --record-trace");
  app.add_option("--context", o.context, "synthetic traces: prompt tokens before the first step")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 26));
  app.add_option("--steps", o.steps, "decode steps (recorded traces: the last N positions)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--budget", o.budget, "fraction of the candidate pages selected, in (0, 1]");
  app.add_option("--carry-share", o.carry.share,
                 "focus carry (Config::carry): the budget's share that pages the last step "
                 "attended heavily may take, in [0, 1); 0 (the default here) scores each index's own selection");
  app.add_option("--carry-mass", o.carry.mass, "focus carry: a head's attention share that keeps a page selected, in (0, 1]");
  app.add_option("--index", o.indices,
                 "all, or a comma-separated list of: dense, oracle-mass, oracle, quest, mean-key, "
                 "hierarchical, centroid, simhash, product-quant, rescored-hierarchical, rescored-quest");
  app.add_option("--page-tokens", o.page_tokens, "tokens per page")->check(CLI::Range(1, 4096));
  app.add_option("--sink-tokens", o.sink_tokens, "always-attended first tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--local-tokens", o.local_tokens, "always-attended last tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--dtype", o.dtype, "KV dtype (and index data): f32, f16, bf16");
  app.add_option("--streams", o.streams, "evaluate a spread subset of this many streams (0 = all)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--threads", o.threads, "worker threads (0 = all cores)");
  add_index_options(app, o);
  app.add_option("--json", o.json, "also write the rows as JSON to this file");
  app.add_flag("--trace-stats", o.trace_stats, "print the trace's statistics instead of comparing indices");
  add_replay_options(app, o);
}

inline void add_index_options(CLI::App& app, Options& o) {
  app.add_option("--cluster-pages", o.cluster_pages, "hierarchical and centroid: pages per cluster")->check(CLI::Range(1, 1 << 20));
  app.add_option("--expand", o.expand, "hierarchical: expand clusters until they hold this many times the budget");
  app.add_option("--min-scored", o.min_scored, "hierarchical: ... and at least this fraction of the candidates")->check(CLI::Range(0.0, 1.0));
  app.add_option("--score-all-below", o.score_all_below, "hierarchical: with fewer candidate pages, score every one (no cluster pruning)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--radius-weight", o.radius_weight, "hierarchical: weight of |q| x cluster radius in a centroid's score");
  app.add_option("--pair-radii", o.pair_radii, "hierarchical: rotary-pair radii per page in a member's score (0: its mean alone)")
      ->check(CLI::Range(0, 128));
  app.add_option("--pair-weight", o.pair_weight, "hierarchical: weight of the pair radii in a member's score");
  app.add_option("--rescore-pool", o.rescore.pool,
                 "rescored-*: a first look (or the inner index, --rescore-inner 1) proposes this many times the budget, rescored token by token")
      ->check(CLI::Range(1.0, 1e9));
  app.add_option("--rescore-share", o.rescore.pool_share, "rescored-*: ... and at least this share of the candidates")->check(CLI::Range(0.0, 1.0));
  app.add_option("--rescore-inner", o.rescore.inner_pool,
                 "rescored-*: pool the inner index's selection (1) or the key copies' first look (0, the default)");
  app.add_option("--rescore-coarse", o.rescore.coarse_pool,
                 "rescored-hierarchical with --rescore-inner 1: pool the best whole clusters (1) or the best pages by their members' estimates (0, "
                 "the default)");
  app.add_option(
         "--rotary", o.rotary,
         "hierarchical: the channel pairs RoPE rotated in the trace's keys: adjacent (GGUF and llama2.c models) or halves (Hugging Face models)")
      ->check(CLI::IsMember({"adjacent", "halves"}));
}

inline void add_replay_options(CLI::App& app, Options& o) {
  app.add_option("--eviction", o.eviction, "also replay fast-tier caches: all, or a list of: lookahead, lru, lfu, last-step, none");
  app.add_option("--window", o.window,
                 "cache window: W (uniform) or knapsack (one W per stream, within the bytes of W = 3 "
                 "or --cache-bytes)");
  app.add_option("--cache-bytes", o.cache_bytes, "fast-tier bytes over the evaluated streams, sink and local included (0: what --window W needs)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 50));
  app.add_option("--warm-up", o.warm_up, "on: importance-guided placement fills the caches at step 0; off")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--max-window", o.max_window, "knapsack and --cache-bytes: the largest W considered")->check(CLI::Range(0, 64));
  app.add_option("--solver", o.solver, "knapsack solver: greedy or exact")->check(CLI::IsMember({"greedy", "exact"}));
  app.add_option("--calibration", o.calibration,
                 "knapsack profile trace (default: synthetic traces, the next seed; recorded, the same file), or prompt[:N]: a recorded trace's own "
                 "prompt, its last N tokens (32) as decode steps");
  app.add_option("--decay", o.decay, "lookahead: per-step decay of a page's accumulated attention, in [0, 1]")->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--pipeline", o.pipeline,
                 "also decode the trace's first layers through KvManager on DRAM cache + SSD and print "
                 "each pipeline's stage statistics: all, or a list of: serial, elastic");
  app.add_option("--pipeline-layers", o.pipeline_layers, "--pipeline: how many of the trace's layers (from layer 0)")->check(CLI::Range(1, 1024));
  app.add_option("--store-dir", o.store_dir, "--pipeline: the folder for the SSD stores (default: the temporary directory)");
}

/// The checks that need no trace: every option's value, and the options that need another.
inline void check_options(const CLI::App& app, const Options& o) {
  if (!o.json.empty()) {  // a bad path fails now, not after the run
    std::ofstream probe(o.json, std::ios::app);
    KVD_EXPECT(probe.good(), "--json {}: cannot write there", o.json);
  }
  KVD_EXPECT(!o.eviction.empty() || (app.count("--window") + app.count("--cache-bytes") + app.count("--warm-up") + app.count("--solver") +
                                     app.count("--calibration") + app.count("--decay")) == 0,
             "--window, --cache-bytes, --warm-up, --solver, --calibration and --decay need --eviction");
  KVD_EXPECT(o.window == "knapsack" || (o.window.find_first_not_of("0123456789") == std::string::npos && !o.window.empty() && o.window.size() <= 2 &&
                                        std::stoi(o.window) <= 64),
             "--window '{}': expected a window 0..64 or 'knapsack'", o.window);
  KVD_EXPECT(o.window == "knapsack" || app.count("--cache-bytes") == 0 || app.count("--window") == 0,
             "give --window W or --cache-bytes, not both (--cache-bytes sets the uniform W)");
  KVD_EXPECT(!o.pipeline.empty() || (app.count("--pipeline-layers") + app.count("--store-dir")) == 0,
             "--pipeline-layers and --store-dir need --pipeline");
  if (!o.pipeline.empty())  // names checked up front, not after the evaluation
    for (const std::string& name : split_names(o.pipeline, {"serial", "elastic"}, "--pipeline"))
      KVD_EXPECT(name == "serial" || name == "elastic", "--pipeline: unknown pipeline '{}' (known: all, serial, elastic)", name);
  if (!o.eviction.empty())  // names checked up front, not after the evaluation
    for (const std::string& name : split_names(o.eviction, eval::eviction_names(), "--eviction"))
      eval::with_eviction(name, o.decay, [](const auto&) { return 0; });
}

}  // namespace kvdrive::kvd_eval
