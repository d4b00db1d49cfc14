// Statistics of a Q/K trace that say how much a sparse index and a step-window cache can gain on
// it: how the exact critical pages overlap from step to step, how concentrated and how spread
// attention is. Works on any source with shape() and stream(layer, kv_head) -> StreamTrace
// (SyntheticTrace, recorded traces), so synthetic and real traces are compared on equal terms.
//
// Definitions (also in docs/synthetic-traces.md). For each stream and decode step s the query
// attends to n = prefix + s + 1 tokens. Pages, sink, candidates and local follow
// core/page_ranges.hpp (DESIGN Decision 3). With p_h(t) = softmax over all n tokens of
// scale x q_h.k_t (scale = 1/sqrt(head_dim)) for query head h of the group:
//   critical pages C_s  the OracleMass selection: the ceil(budget x candidates) candidate pages
//                       (Budget::fraction rounding, at least 1) with the largest mass summed over
//                       the group's heads, sum_h sum_{t in page} p_h(t); ties to the lower page id
//   jaccard             |C_s ∩ C_{s-1}| / |C_s ∪ C_{s-1}|, mean over steps s >= 1
//   coverage W          |C_s ∩ (C_{s-1} ∪ ... ∪ C_{s-W})| / |C_s|, mean over steps s >= W: the
//                       hit rate of a cache holding exactly the last W steps' critical pages
//   entropy             -sum_t p_h(t) ln p_h(t) in nats, per query head, mean over steps; also
//                       divided by ln n (1 = uniform)
//   top mass            mass of the ceil(budget x n) tokens with the largest p_h(t) (6.25% of the
//                       tokens by default), per query head, mean over steps
//   sink / local / critical mass   mass on the sink pages, the local pages and C_s, per query
//                       head, mean over steps (their sum is what an exact index at this budget
//                       attends: OracleMass's mass recall)
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
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/config.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/page_ranges.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/eval/stream_trace.hpp"

namespace kvdrive::eval {

/// Anything that yields streams: SyntheticTrace, a recorded trace adapter.
template <class S>
concept StreamSource = requires(const S& s, int layer, int kv_head) {
  { s.shape() } -> std::convertible_to<ModelShape>;
  { s.stream(layer, kv_head) } -> std::convertible_to<StreamTrace>;
};

struct TraceStatsOptions {
  int page_tokens = 8;
  int sink_tokens = 4;
  int local_tokens = 64;
  double budget = 0.0625;  ///< fraction of the candidate pages (and of the tokens, for top mass)
  int max_window = 4;      ///< coverage is reported for W = 1 .. max_window
  int streams = 0;         ///< 0 = all streams, else a deterministic spread subset of this many
  int threads = 0;         ///< 0 = one per hardware thread

  void validate() const {
    KVD_EXPECT(page_tokens >= 1 && page_tokens <= 4096, "trace stats: page_tokens {} expected 1..4096", page_tokens);
    KVD_EXPECT(sink_tokens >= 0 && local_tokens >= 0, "trace stats: sink_tokens {} local_tokens {} expected >= 0", sink_tokens,
               local_tokens);
    KVD_EXPECT(budget > 0.0 && budget <= 1.0 && std::isfinite(budget), "trace stats: budget {} is outside (0, 1]", budget);
    KVD_EXPECT(max_window >= 1 && max_window <= 64, "trace stats: max_window {} expected 1..64", max_window);
    KVD_EXPECT(streams >= 0, "trace stats: streams {} expected >= 0 (0 = all)", streams);
    KVD_EXPECT(threads >= 0, "trace stats: threads {} expected >= 0 (0 = all cores)", threads);
  }
};

/// One stream's figures, means over its steps (NaN where no step qualifies, e.g. coverage W
/// with fewer than W + 1 steps). Per-head vectors have `group` entries.
struct StreamStats {
  int layer = 0, kv_head = 0, group = 0;
  std::int64_t prefix = 0, steps = 0;
  std::int64_t candidate_pages = 0, budget_pages = 0;  ///< at step 0
  double jaccard = 0;
  std::vector<double> coverage;  ///< [max_window]: W = 1 .. max_window
  std::vector<double> entropy, entropy_norm, top_mass, sink_mass, local_mass, critical_mass;
};

/// Means over a set of streams (a layer, or all).
struct TraceStatsGroup {
  int layer = -1;  ///< -1 for all layers
  int streams = 0;
  double jaccard = 0;
  std::vector<double> coverage;  ///< [max_window]
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

/// The k indices with the largest values (ties to the lower index), ascending.
inline std::vector<std::uint32_t> top_indices(const std::vector<double>& value, std::size_t k) {
  std::vector<std::uint32_t> order(value.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  k = std::min(k, order.size());
  const auto better = [&](std::uint32_t a, std::uint32_t b) { return value[a] > value[b] || (value[a] == value[b] && a < b); };
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), better);
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

/// The figures of one stream; see the top of this file. When `critical` is given it receives
/// each step's critical pages C_s (ascending page ids), e.g. to replay a cache against them.
inline StreamStats stream_stats(const StreamTrace& tr, const TraceStatsOptions& o,
                                std::vector<std::vector<std::uint32_t>>* critical = nullptr) {
  o.validate();
  const int G = tr.group, D = tr.head_dim, pt = o.page_tokens, W = o.max_window;
  KVD_EXPECT(G >= 1 && D >= 1 && tr.prefix >= 0 && tr.steps >= 1, "trace stats: stream with group {} head_dim {} prefix {} steps {}",
             G, D, tr.prefix, tr.steps);
  KVD_EXPECT(tr.keys.size() == static_cast<std::size_t>(tr.tokens()) * D &&
                 tr.queries.size() == static_cast<std::size_t>(tr.steps) * G * D,
             "trace stats: stream ({}, {}) has {} key and {} query floats for {} tokens, {} steps", tr.layer, tr.kv_head,
             tr.keys.size(), tr.queries.size(), tr.tokens(), tr.steps);
  if (critical) critical->clear();
  const Budget budget = Budget::fraction(o.budget);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int rows = attention::padded_rows(pt);
  const auto Gs = static_cast<std::size_t>(G);

  StreamStats r;
  r.layer = tr.layer;
  r.kv_head = tr.kv_head;
  r.group = G;
  r.prefix = tr.prefix;
  r.steps = tr.steps;
  for (auto* v : {&r.entropy, &r.entropy_norm, &r.top_mass, &r.sink_mass, &r.local_mass, &r.critical_mass}) v->assign(Gs, 0.0);
  std::vector<double> cover_sum(static_cast<std::size_t>(W), 0.0);
  std::vector<std::int64_t> cover_n(static_cast<std::size_t>(W), 0);
  double jaccard_sum = 0;
  std::int64_t jaccard_n = 0;

  const std::size_t n_max = static_cast<std::size_t>(tr.tokens());
  std::vector<float> e(Gs * n_max), tok(Gs * static_cast<std::size_t>(rows)), sorted(n_max);
  std::vector<double> page_mass, cand_mass;
  // last_seen[p]: the last step whose critical set held page p, so p is in the union of the last
  // W sets exactly when last_seen[p] >= s - W.
  std::vector<std::int64_t> last_seen((n_max + static_cast<std::size_t>(pt) - 1) / static_cast<std::size_t>(pt),
                                      std::numeric_limits<std::int64_t>::min() / 2);
  std::size_t prev_size = 0;

  for (std::int64_t s = 0; s < tr.steps; ++s) {
    const std::int64_t n = tr.prefix + s + 1;
    const PageRanges pr = page_ranges(n, pt, o.sink_tokens, o.local_tokens);
    const auto pages = static_cast<std::size_t>(pr.pages);
    const float* q = tr.query(s);
    // Scaled scores of every token for every head, page by page (the CPU kernel's order).
    for (std::size_t p = 0; p < pages; ++p) {
      const std::int64_t first = static_cast<std::int64_t>(p) * pt;
      const int count = static_cast<int>(std::min<std::int64_t>(pt, n - first));
      attention::page_scores(q, G, tr.key(first), count, D, scale, tok.data());
      for (std::size_t h = 0; h < Gs; ++h)
        std::copy_n(tok.data() + h * static_cast<std::size_t>(rows), count, e.data() + h * n_max + static_cast<std::size_t>(first));
    }
    page_mass.assign(Gs * pages, 0.0);
    const auto un = static_cast<std::size_t>(n);
    for (std::size_t h = 0; h < Gs; ++h) {
      float* x = e.data() + h * n_max;
      float m = x[0];
      for (std::size_t t = 1; t < un; ++t) m = std::max(m, x[t]);
      double z = 0, zx = 0;  // sum of exp(x - m), and of exp(x - m) (x - m)
      for (std::size_t t = 0; t < un; ++t) {
        const float xm = x[t] - m, w = attention::exp_shifted(xm);
        x[t] = w;
        z += w;
        zx += static_cast<double>(w) * xm;
      }
      const double h_nats = std::log(z) - zx / z;
      r.entropy[h] += h_nats;
      r.entropy_norm[h] += n > 1 ? h_nats / std::log(static_cast<double>(n)) : 0.0;
      for (std::size_t p = 0; p < pages; ++p) {
        double pm = 0;
        const std::size_t end = std::min(un, (p + 1) * static_cast<std::size_t>(pt));
        for (std::size_t t = p * static_cast<std::size_t>(pt); t < end; ++t) pm += x[t];
        page_mass[h * pages + p] = pm / z;
      }
      // Mass of the top tokens.
      const auto k = static_cast<std::size_t>(std::clamp<std::int64_t>(
          static_cast<std::int64_t>(std::ceil(o.budget * static_cast<double>(n) - 1e-9)), 1, n));
      std::copy_n(x, un, sorted.data());
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k - 1), sorted.begin() + static_cast<std::ptrdiff_t>(un),
                       std::greater<float>());
      double top = 0;
      for (std::size_t i = 0; i < k; ++i) top += sorted[i];
      r.top_mass[h] += top / z;
      double sink = 0, local = 0;
      for (std::size_t p = 0; p < static_cast<std::size_t>(pr.sink_end); ++p) sink += page_mass[h * pages + p];
      for (std::size_t p = static_cast<std::size_t>(pr.local_begin); p < pages; ++p) local += page_mass[h * pages + p];
      r.sink_mass[h] += sink;
      r.local_mass[h] += local;
    }
    // The critical pages: OracleMass's rule on the candidates.
    const std::int64_t cands = pr.candidates();
    const std::int64_t want = budget.pages_for(cands);
    if (s == 0) {
      r.candidate_pages = cands;
      r.budget_pages = want;
    }
    cand_mass.assign(static_cast<std::size_t>(cands), 0.0);
    for (std::size_t h = 0; h < Gs; ++h)
      for (std::int64_t i = 0; i < cands; ++i) cand_mass[static_cast<std::size_t>(i)] += page_mass[h * pages + static_cast<std::size_t>(pr.sink_end + i)];
    std::vector<std::uint32_t> crit = top_indices(cand_mass, static_cast<std::size_t>(want));
    for (auto& p : crit) p += static_cast<std::uint32_t>(pr.sink_end);
    for (std::size_t h = 0; h < Gs; ++h) {
      double c = 0;
      for (std::uint32_t p : crit) c += page_mass[h * pages + p];
      r.critical_mass[h] += c;
    }
    if (!crit.empty()) {
      std::vector<std::size_t> hits(static_cast<std::size_t>(W), 0);
      for (std::uint32_t p : crit) {
        const std::int64_t age = s - last_seen[p];  // steps since p was last critical
        for (int w = 1; w <= W; ++w) hits[static_cast<std::size_t>(w - 1)] += age <= w;
      }
      for (int w = 1; w <= W; ++w)
        if (s >= w) {
          cover_sum[static_cast<std::size_t>(w - 1)] += static_cast<double>(hits[static_cast<std::size_t>(w - 1)]) / static_cast<double>(crit.size());
          ++cover_n[static_cast<std::size_t>(w - 1)];
        }
      if (s >= 1) {
        const double inter = static_cast<double>(hits[0]);
        jaccard_sum += inter / (static_cast<double>(crit.size() + prev_size) - inter);
        ++jaccard_n;
      }
    }
    for (std::uint32_t p : crit) last_seen[p] = s;
    prev_size = crit.size();
    if (critical) critical->push_back(std::move(crit));
  }

  const double steps = static_cast<double>(tr.steps);
  for (auto* v : {&r.entropy, &r.entropy_norm, &r.top_mass, &r.sink_mass, &r.local_mass, &r.critical_mass})
    for (double& x : *v) x /= steps;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.jaccard = jaccard_n > 0 ? jaccard_sum / static_cast<double>(jaccard_n) : nan;
  r.coverage.resize(static_cast<std::size_t>(W));
  for (std::size_t w = 0; w < r.coverage.size(); ++w) r.coverage[w] = cover_n[w] > 0 ? cover_sum[w] / static_cast<double>(cover_n[w]) : nan;
  return r;
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
      options.threads > 0 ? static_cast<std::size_t>(options.threads) : std::max(1u, std::thread::hardware_concurrency()),
      list.size())));
  pool.parallel_for(list.size(), [&](std::size_t i) {
    const StreamTrace tr = source.stream(list[i].first, list[i].second);
    KVD_EXPECT(tr.group == shape.group() && tr.head_dim == shape.head_dim,
               "trace stats: stream ({}, {}) has group {} head_dim {}, the shape says {} and {}", list[i].first, list[i].second,
               tr.group, tr.head_dim, shape.group(), shape.head_dim);
    out.streams[i] = stream_stats(tr, options);
  });
  const StreamStats& first = out.streams.front();
  for (const StreamStats& s : out.streams)
    KVD_EXPECT(s.prefix == first.prefix && s.steps == first.steps,
               "trace stats: stream ({}, {}) has prefix {} and {} steps, stream ({}, {}) {} and {}", s.layer, s.kv_head, s.prefix,
               s.steps, first.layer, first.kv_head, first.prefix, first.steps);
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
      out.heads.push_back({s.layer, s.kv_head * s.group + g, s.entropy[gg], s.entropy_norm[gg], s.top_mass[gg], s.sink_mass[gg],
                           s.local_mass[gg], s.critical_mass[gg]});
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
  fmt::print(f, "pages of {} tokens, sink {} and local {} tokens, budget {:.2f}% = {} of {} candidate pages at step 0\n",
             o.page_tokens, o.sink_tokens, o.local_tokens, 100.0 * o.budget, st.budget_pages, st.candidate_pages);
  std::string head = fmt::format("{:>5} {:>7} {:>7}", "layer", "streams", "jaccard");
  for (int w = 1; w <= o.max_window; ++w) head += fmt::format(" {:>6}", fmt::format("cov W{}", w));
  head += fmt::format(" {:>7} {:>13} {:>6} {:>7} {:>6} {:>6} {:>6}\n", "entropy", "(min-max)", "H/ln n",
                      fmt::format("top{:.4g}%", 100.0 * o.budget), "sink", "local", "crit");
  fmt::print(f, "{}", head);
  const auto row = [&](const TraceStatsGroup& g) {
    std::string line = fmt::format("{:>5} {:>7} {:>7}", g.layer < 0 ? std::string("all") : std::to_string(g.layer), g.streams,
                                   num(g.jaccard, 3));
    for (double c : g.coverage) line += fmt::format(" {:>6}", num(c, 3));
    line += fmt::format(" {:>7} {:>13} {:>6} {:>7} {:>6} {:>6} {:>6}\n", num(g.entropy, 2),
                        fmt::format("({}-{})", num(g.entropy_min, 2), num(g.entropy_max, 2)), num(g.entropy_norm, 3),
                        num(g.top_mass, 3), num(g.sink_mass, 3), num(g.local_mass, 3), num(g.critical_mass, 3));
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
    json j = {{"streams", g.streams},           {"jaccard", g.jaccard},         {"coverage", g.coverage},
              {"entropy", g.entropy},           {"entropy_min", g.entropy_min}, {"entropy_max", g.entropy_max},
              {"entropy_norm", g.entropy_norm}, {"top_mass", g.top_mass},       {"sink_mass", g.sink_mass},
              {"local_mass", g.local_mass},     {"critical_mass", g.critical_mass}};
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
    j["heads"].push_back({{"layer", h.layer}, {"q_head", h.q_head}, {"entropy", h.entropy}, {"entropy_norm", h.entropy_norm},
                          {"top_mass", h.top_mass}, {"sink_mass", h.sink_mass}, {"local_mass", h.local_mass},
                          {"critical_mass", h.critical_mass}});
  j["streams"] = json::array();
  for (const auto& s : st.streams)
    j["streams"].push_back({{"layer", s.layer}, {"kv_head", s.kv_head}, {"jaccard", s.jaccard}, {"coverage", s.coverage}});
  return j.dump(2);
}

}  // namespace kvdrive::eval
