// Statistics of a Q/K trace that say how much a sparse index and a step-window cache can gain on
// it: how the exact critical pages overlap from step to step, how concentrated and how spread
// attention is. Works on any source with shape() and stream(layer, kv_head) -> StreamTrace
// (SyntheticTrace, recorded traces), so synthetic and real traces are compared on equal terms.
// The figures are defined, and computed for one stream, in eval/stream_stats.hpp; here they are
// gathered over a source's streams, printed and written as JSON.
//
// Per-stream figures are means over steps; layer and overall figures are means over the
// measured streams (each stream weighs the same). Streams run in parallel on a thread pool;
// each stream's arithmetic is sequential in a fixed order, so results do not depend on threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/eval/stream_stats.hpp"
#include "kvdrive/eval/stream_trace.hpp"

namespace kvdrive::eval {

/// Anything that yields streams: SyntheticTrace, a recorded trace adapter.
template <class S>
concept StreamSource = requires(const S& s, int layer, int kv_head) {
  { s.shape() } -> std::convertible_to<ModelShape>;
  { s.stream(layer, kv_head) } -> std::convertible_to<StreamTrace>;
};

/// Means over a set of streams (a layer, or all).
struct TraceStatsGroup {
  int layer = -1;  ///< -1 for all layers
  int streams = 0;
  double jaccard = 0;
  std::vector<double> coverage;                          ///< [max_window]
  double entropy = 0, entropy_min = 0, entropy_max = 0;  ///< over query heads
  double entropy_norm = 0, top_mass = 0, sink_mass = 0, local_mass = 0, critical_mass = 0;
};

/// Per query head (q_head numbered across the layer: kv_head x group + g).
struct TraceStatsHead {
  int layer = 0, q_head = 0;
  double entropy = 0, entropy_norm = 0, top_mass = 0, sink_mass = 0, local_mass = 0, critical_mass = 0;
};

struct TraceStats {
  ModelShape shape;
  TraceStatsOptions options;
  std::int64_t prefix = 0, steps = 0;
  std::int64_t candidate_pages = 0, budget_pages = 0;  ///< at step 0
  TraceStatsGroup all;
  std::vector<TraceStatsGroup> layers;  ///< layers with at least one measured stream
  std::vector<TraceStatsHead> heads;
  std::vector<StreamStats> streams;
};

/// The streams compute_trace_stats measures: all (layer-major) when count is 0 or covers them,
/// else `count` spread evenly over the layer-major order (so every layer gets its share and the
/// heads picked differ between layers).
inline std::vector<std::pair<int, int>> trace_stats_streams(const ModelShape& shape, int count) {
  const std::int64_t total = static_cast<std::int64_t>(shape.layers) * shape.kv_heads;
  std::vector<std::pair<int, int>> out;
  if (count <= 0 || count >= total) {
    for (int l = 0; l < shape.layers; ++l)
      for (int h = 0; h < shape.kv_heads; ++h) out.emplace_back(l, h);
    return out;
  }
  for (int i = 0; i < count; ++i) {
    const std::int64_t j = (2 * static_cast<std::int64_t>(i) + 1) * total / (2 * static_cast<std::int64_t>(count));
    out.emplace_back(static_cast<int>(j / shape.kv_heads), static_cast<int>(j % shape.kv_heads));
  }
  return out;
}

namespace trace_stats_detail {

inline double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : s / static_cast<double>(v.size());
}

inline TraceStatsGroup summarize(const std::vector<const StreamStats*>& ss, int layer, int windows) {
  TraceStatsGroup g;
  g.layer = layer;
  g.streams = static_cast<int>(ss.size());
  std::vector<double> jac, ent, entn, top, sink, local, crit;
  std::vector<std::vector<double>> cov(static_cast<std::size_t>(windows));
  for (const StreamStats* s : ss) {
    jac.push_back(s->jaccard);
    for (int w = 0; w < windows; ++w) cov[static_cast<std::size_t>(w)].push_back(s->coverage[static_cast<std::size_t>(w)]);
    for (int h = 0; h < s->group; ++h) {
      const auto hh = static_cast<std::size_t>(h);
      ent.push_back(s->entropy[hh]);
      entn.push_back(s->entropy_norm[hh]);
      top.push_back(s->top_mass[hh]);
      sink.push_back(s->sink_mass[hh]);
      local.push_back(s->local_mass[hh]);
      crit.push_back(s->critical_mass[hh]);
    }
  }
  g.jaccard = mean(jac);
  for (auto& c : cov) g.coverage.push_back(mean(c));
  g.entropy = mean(ent);
  g.entropy_min = ent.empty() ? 0 : *std::min_element(ent.begin(), ent.end());
  g.entropy_max = ent.empty() ? 0 : *std::max_element(ent.begin(), ent.end());
  g.entropy_norm = mean(entn);
  g.top_mass = mean(top);
  g.sink_mass = mean(sink);
  g.local_mass = mean(local);
  g.critical_mass = mean(crit);
  return g;
}

}  // namespace trace_stats_detail

/// Statistics over the streams of `source` chosen by options.streams; see the top of this file.
template <StreamSource Source>
TraceStats compute_trace_stats(const Source& source, const TraceStatsOptions& options = {}) {
  options.validate();
  const ModelShape shape = source.shape();
  shape.validate();
  const auto list = trace_stats_streams(shape, options.streams);
  TraceStats out;
  out.shape = shape;
  out.options = options;
  out.streams.resize(list.size());
  ThreadPool pool(static_cast<unsigned>(std::min<std::size_t>(
      options.threads > 0 ? static_cast<std::size_t>(options.threads) : std::max(1u, std::thread::hardware_concurrency()), list.size())));
  pool.parallel_for(list.size(), [&](std::size_t i) {
    const StreamTrace tr = source.stream(list[i].first, list[i].second);
    KVD_EXPECT(tr.group == shape.group() && tr.head_dim == shape.head_dim,
               "trace stats: stream ({}, {}) has group {} head_dim {}, the shape says {} and {}", list[i].first, list[i].second, tr.group,
               tr.head_dim, shape.group(), shape.head_dim);
    out.streams[i] = stream_stats(tr, options);
  });
  const StreamStats& first = out.streams.front();
  for (const StreamStats& s : out.streams)
    KVD_EXPECT(s.prefix == first.prefix && s.steps == first.steps,
               "trace stats: stream ({}, {}) has prefix {} and {} steps, stream ({}, {}) {} and {}", s.layer, s.kv_head, s.prefix, s.steps,
               first.layer, first.kv_head, first.prefix, first.steps);
  out.prefix = first.prefix;
  out.steps = first.steps;
  out.candidate_pages = first.candidate_pages;
  out.budget_pages = first.budget_pages;

  std::vector<const StreamStats*> all;
  for (const StreamStats& s : out.streams) all.push_back(&s);
  out.all = trace_stats_detail::summarize(all, -1, options.max_window);
  for (int l = 0; l < shape.layers; ++l) {
    std::vector<const StreamStats*> in;
    for (const StreamStats& s : out.streams)
      if (s.layer == l) in.push_back(&s);
    if (!in.empty()) out.layers.push_back(trace_stats_detail::summarize(in, l, options.max_window));
  }
  for (const StreamStats& s : out.streams)
    for (int g = 0; g < s.group; ++g) {
      const auto gg = static_cast<std::size_t>(g);
      out.heads.push_back({s.layer, s.kv_head * s.group + g, s.entropy[gg], s.entropy_norm[gg], s.top_mass[gg], s.sink_mass[gg], s.local_mass[gg],
                           s.critical_mass[gg]});
    }
  return out;
}

/// The table kvd-eval --trace-stats prints: one row per measured layer and one for all.
inline void print_trace_stats(const TraceStats& st, std::FILE* f) {
  const TraceStatsOptions& o = st.options;
  const auto num = [](double x, int prec) { return std::isnan(x) ? std::string("-") : fmt::format("{:.{}f}", x, prec); };
  fmt::print(f, "trace stats: {} layers x {} KV heads ({} query heads, head_dim {}); prefix {} tokens, {} decode steps; {} of {} streams\n",
             st.shape.layers, st.shape.kv_heads, st.shape.q_heads, st.shape.head_dim, st.prefix, st.steps, st.all.streams,
             st.shape.layers * st.shape.kv_heads);
  fmt::print(f, "pages of {} tokens, sink {} and local {} tokens, budget {:.2f}% = {} of {} candidate pages at step 0\n", o.page_tokens,
             o.sink_tokens, o.local_tokens, 100.0 * o.budget, st.budget_pages, st.candidate_pages);
  std::string head = fmt::format("{:>5} {:>7} {:>7}", "layer", "streams", "jaccard");
  for (int w = 1; w <= o.max_window; ++w) head += fmt::format(" {:>6}", fmt::format("cov W{}", w));
  head += fmt::format(" {:>7} {:>13} {:>6} {:>7} {:>6} {:>6} {:>6}\n", "entropy", "(min-max)", "H/ln n", fmt::format("top{:.4g}%", 100.0 * o.budget),
                      "sink", "local", "crit");
  fmt::print(f, "{}", head);
  const auto row = [&](const TraceStatsGroup& g) {
    std::string line = fmt::format("{:>5} {:>7} {:>7}", g.layer < 0 ? std::string("all") : std::to_string(g.layer), g.streams, num(g.jaccard, 3));
    for (double c : g.coverage) line += fmt::format(" {:>6}", num(c, 3));
    line += fmt::format(" {:>7} {:>13} {:>6} {:>7} {:>6} {:>6} {:>6}\n", num(g.entropy, 2),
                        fmt::format("({}-{})", num(g.entropy_min, 2), num(g.entropy_max, 2)), num(g.entropy_norm, 3), num(g.top_mass, 3),
                        num(g.sink_mass, 3), num(g.local_mass, 3), num(g.critical_mass, 3));
    fmt::print(f, "{}", line);
  };
  for (const TraceStatsGroup& g : st.layers) row(g);
  row(st.all);
  fmt::print(f,
             "cov WN: share of a step's critical pages that were critical in one of the N steps before; entropy in nats per query "
             "head;\nsink/local/crit: attention mass on the sink pages, the local pages and the critical pages (crit = OracleMass)\n");
}

/// The same figures as JSON (NaN as null), per layer, per query head and per stream.
inline std::string trace_stats_json(const TraceStats& st) {
  using nlohmann::json;
  const auto group = [](const TraceStatsGroup& g) {
    json j = {{"streams", g.streams},         {"jaccard", g.jaccard},         {"coverage", g.coverage},          {"entropy", g.entropy},
              {"entropy_min", g.entropy_min}, {"entropy_max", g.entropy_max}, {"entropy_norm", g.entropy_norm},  {"top_mass", g.top_mass},
              {"sink_mass", g.sink_mass},     {"local_mass", g.local_mass},   {"critical_mass", g.critical_mass}};
    if (g.layer >= 0) j["layer"] = g.layer;
    return j;
  };
  const TraceStatsOptions& o = st.options;
  json j;
  j["shape"] = {{"layers", st.shape.layers}, {"q_heads", st.shape.q_heads}, {"kv_heads", st.shape.kv_heads}, {"head_dim", st.shape.head_dim}};
  j["options"] = {{"page_tokens", o.page_tokens}, {"sink_tokens", o.sink_tokens}, {"local_tokens", o.local_tokens},
                  {"budget", o.budget},           {"max_window", o.max_window},   {"streams", o.streams}};
  j["prefix"] = st.prefix;
  j["steps"] = st.steps;
  j["candidate_pages"] = st.candidate_pages;
  j["budget_pages"] = st.budget_pages;
  j["all"] = group(st.all);
  j["layers"] = json::array();
  for (const auto& g : st.layers) j["layers"].push_back(group(g));
  j["heads"] = json::array();
  for (const auto& h : st.heads)
    j["heads"].push_back({{"layer", h.layer},
                          {"q_head", h.q_head},
                          {"entropy", h.entropy},
                          {"entropy_norm", h.entropy_norm},
                          {"top_mass", h.top_mass},
                          {"sink_mass", h.sink_mass},
                          {"local_mass", h.local_mass},
                          {"critical_mass", h.critical_mass}});
  j["streams"] = json::array();
  for (const auto& s : st.streams)
    j["streams"].push_back({{"layer", s.layer}, {"kv_head", s.kv_head}, {"jaccard", s.jaccard}, {"coverage", s.coverage}});
  return j.dump(2);
}

}  // namespace kvdrive::eval
