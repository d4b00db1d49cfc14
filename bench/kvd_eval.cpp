// kvd-eval: compares index policies side by side on a trace (synthetic or recorded by
// kvd-llama --record-trace): per index, attention-mass recall (mean and minimum over query
// heads), top-k recall, output error against dense attention, index bytes per token, selection
// time, and the selection floor (index bytes / this machine's memcpy bandwidth, measured in the
// same run). --trace-stats prints the trace's own statistics instead (cross-step overlap, window
// coverage, attention entropy, top-token mass).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/eval/recorded.hpp"
#include "kvdrive/eval/synthetic.hpp"
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
  float radius_weight = index::HierarchicalParams{}.radius_weight;
};

const std::vector<std::string>& all_index_names() {
  static const std::vector<std::string> names = {"oracle-mass", "oracle", "quest", "mean-key", "hierarchical",
                                                 "centroid", "simhash", "product-quant"};
  return names;
}

std::unique_ptr<eval::AnyIndex> make_index(const std::string& name, const Options& o, int head_dim) {
  if (name == "oracle-mass") return eval::make_any_index(index::OracleMass{});
  if (name == "oracle") return eval::make_any_index(index::Oracle{});
  if (name == "dense") return eval::make_any_index(index::Dense{});
  if (name == "quest") return eval::make_any_index(index::Quest{});
  if (name == "mean-key") return eval::make_any_index(index::MeanKey{});
  if (name == "hierarchical") {
    index::HierarchicalParams p;
    p.pages_per_cluster = o.cluster_pages;
    p.expand = o.expand;
    p.radius_weight = o.radius_weight;
    return eval::make_any_index(index::Hierarchical{p});
  }
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

std::vector<std::string> split_names(const std::string& list) {
  if (list == "all") return all_index_names();
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    std::string name = list.substr(at, comma - at);
    KVD_EXPECT(!name.empty(), "--index: empty name in '{}'", list);
    KVD_EXPECT(std::find(out.begin(), out.end(), name) == out.end(), "--index: '{}' given twice", name);
    out.push_back(std::move(name));
    at = comma + 1;
  }
  return out;
}

/// "synthetic:PRESET[:seed=N]" -> (preset, seed); nullopt for anything else (a file path).
struct SyntheticSpec {
  std::string preset;
  std::uint64_t seed = 1;
};
std::optional<SyntheticSpec> parse_synthetic(const std::string& spec) {
  const std::string prefix = "synthetic:";
  if (spec.rfind(prefix, 0) != 0) return std::nullopt;
  SyntheticSpec s;
  std::string rest = spec.substr(prefix.size());
  const std::size_t colon = rest.find(':');
  s.preset = rest.substr(0, colon);
  KVD_EXPECT(!s.preset.empty(), "--trace '{}': no preset name after 'synthetic:'", spec);
  if (colon != std::string::npos) {
    const std::string opt = rest.substr(colon + 1);
    KVD_EXPECT(opt.rfind("seed=", 0) == 0, "--trace '{}': expected ':seed=N' after the preset, got ':{}'", spec, opt);
    const std::string num = opt.substr(5);
    KVD_EXPECT(!num.empty() && num.size() <= 19 && num.find_first_not_of("0123456789") == std::string::npos,
               "--trace '{}': seed '{}' is not a non-negative integer", spec, num);
    s.seed = std::stoull(num);
  }
  return s;
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  fail("--dtype: '{}' is not one of f32, f16, bf16", s);
}

template <class Source>
int run(const Source& source, const Options& o, const std::string& label, std::int64_t prefix) {
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
  set.dtype = parse_dtype(o.dtype);
  set.validate();
  const std::vector<std::string> names = split_names(o.indices);
  std::vector<std::unique_ptr<eval::AnyIndex>> prototypes;
  for (const auto& n : names) prototypes.push_back(make_index(n, o, shape.head_dim));

  const double bandwidth = bench::memcpy_bytes_per_second();
  const auto list = eval::trace_stats_streams(shape, o.streams);
  std::vector<std::vector<eval::IndexTally>> per_stream(list.size());
  const unsigned threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(static_cast<unsigned>(std::min<std::size_t>(threads, list.size())));
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(list.size(), [&](std::size_t i) {
    const eval::StreamTrace tr = source.stream(list[i].first, list[i].second);
    std::vector<std::unique_ptr<eval::AnyIndex>> mine;
    for (const auto& p : prototypes) mine.push_back(p->clone());
    per_stream[i] = eval::evaluate_stream(tr, mine, set);
  });
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
  app.add_option("--index", o.indices, "all, or a comma-separated list of: dense, oracle-mass, oracle, quest, mean-key, "
                                       "hierarchical, centroid, simhash, product-quant");
  app.add_option("--page-tokens", o.page_tokens, "tokens per page")->check(CLI::Range(1, 4096));
  app.add_option("--sink-tokens", o.sink_tokens, "always-attended first tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--local-tokens", o.local_tokens, "always-attended last tokens")->check(CLI::Range(0, 1 << 20));
  app.add_option("--dtype", o.dtype, "KV dtype (and index data): f32, f16, bf16");
  app.add_option("--streams", o.streams, "evaluate a spread subset of this many streams (0 = all)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--threads", o.threads, "worker threads (0 = all cores)");
  app.add_option("--cluster-pages", o.cluster_pages, "hierarchical and centroid: pages per cluster")->check(CLI::Range(1, 1 << 20));
  app.add_option("--expand", o.expand, "hierarchical: expand clusters until they hold this many times the budget");
  app.add_option("--radius-weight", o.radius_weight, "hierarchical: weight of |q| x cluster radius in a centroid's score");
  app.add_option("--json", o.json, "also write the rows as JSON to this file");
  app.add_flag("--trace-stats", o.trace_stats, "print the trace's statistics instead of comparing indices");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!o.json.empty()) {  // a bad path fails now, not after the run
      std::ofstream probe(o.json, std::ios::app);
      KVD_EXPECT(probe.good(), "--json {}: cannot write there", o.json);
    }
    if (const auto spec = parse_synthetic(o.trace)) {
      const eval::SyntheticTrace source(eval::synthetic_preset(spec->preset), spec->seed, o.context, o.steps);
      return run(source, o, fmt::format("synthetic:{}:seed={}", spec->preset, spec->seed), o.context);
    }
    KVD_EXPECT(app.count("--context") == 0,
               "--context applies to synthetic traces; a recorded trace's context is its positions minus --steps");
    const eval::RecordedTrace source(o.trace, o.steps);
    return run(source, o, o.trace, source.positions() - o.steps);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvd-eval: {}\n", e.what());
    return 1;
  }
}
