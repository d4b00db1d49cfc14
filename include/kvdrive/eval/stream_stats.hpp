// The figures of one stream of a Q/K trace (stream_stats), the per-stream part of the trace
// statistics (eval/trace_stats.hpp, which aggregates them over a source's streams).
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
// A stream's figures are means over its steps; its arithmetic is sequential in a fixed order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/core/config.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/page_ranges.hpp"
#include "kvdrive/eval/stream_trace.hpp"

namespace kvdrive::eval {

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
    KVD_EXPECT(sink_tokens >= 0 && local_tokens >= 0, "trace stats: sink_tokens {} local_tokens {} expected >= 0", sink_tokens, local_tokens);
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

namespace trace_stats_detail {

/// Throws kvdrive::Error for bad options or a stream whose arrays do not match its shape.
inline void check_stream(const StreamTrace& tr, const TraceStatsOptions& o) {
  o.validate();
  KVD_EXPECT(tr.group >= 1 && tr.head_dim >= 1 && tr.prefix >= 0 && tr.steps >= 1, "trace stats: stream with group {} head_dim {} prefix {} steps {}",
             tr.group, tr.head_dim, tr.prefix, tr.steps);
  KVD_EXPECT(tr.keys.size() == static_cast<std::size_t>(tr.tokens()) * tr.head_dim &&
                 tr.queries.size() == static_cast<std::size_t>(tr.steps) * tr.group * tr.head_dim,
             "trace stats: stream ({}, {}) has {} key and {} query floats for {} tokens, {} steps", tr.layer, tr.kv_head, tr.keys.size(),
             tr.queries.size(), tr.tokens(), tr.steps);
}

/// The per-head sums of one stream's figures, before they are divided by its steps.
inline StreamStats start_stats(const StreamTrace& tr) {
  StreamStats r;
  r.layer = tr.layer;
  r.kv_head = tr.kv_head;
  r.group = tr.group;
  r.prefix = tr.prefix;
  r.steps = tr.steps;
  for (auto* v : {&r.entropy, &r.entropy_norm, &r.top_mass, &r.sink_mass, &r.local_mass, &r.critical_mass})
    v->assign(static_cast<std::size_t>(tr.group), 0.0);
  return r;
}

/// One step's working arrays, sized once for the stream's longest step.
struct StepBuffers {
  std::size_t n_max;              ///< the stream's tokens: each head's stride in e
  std::vector<float> e;           ///< [group][n_max]: scaled scores, then exp(score - max)
  std::vector<float> tok;         ///< [group][padded rows]: one page's scores
  std::vector<float> sorted;      ///< one head's weights, for the top tokens
  std::vector<double> page_mass;  ///< [group][pages]: each page's attention mass
  std::vector<double> cand_mass;  ///< per candidate, summed over the group

  StepBuffers(const StreamTrace& tr, int rows)
      : n_max(static_cast<std::size_t>(tr.tokens())),
        e(static_cast<std::size_t>(tr.group) * n_max),
        tok(static_cast<std::size_t>(tr.group) * static_cast<std::size_t>(rows)),
        sorted(n_max) {}
};

/// Scaled scores of step s's n tokens for every head, page by page (the CPU kernel's order).
inline void token_scores(const StreamTrace& tr, std::int64_t s, std::int64_t n, int pt, float scale, std::size_t pages, StepBuffers& b) {
  const int rows = attention::padded_rows(pt);
  for (std::size_t p = 0; p < pages; ++p) {
    const std::int64_t first = static_cast<std::int64_t>(p) * pt;
    const int count = static_cast<int>(std::min<std::int64_t>(pt, n - first));
    attention::page_scores(tr.query(s), tr.group, tr.key(first), count, tr.head_dim, scale, b.tok.data());
    for (std::size_t h = 0; h < static_cast<std::size_t>(tr.group); ++h)
      std::copy_n(b.tok.data() + h * static_cast<std::size_t>(rows), count, b.e.data() + h * b.n_max + static_cast<std::size_t>(first));
  }
}

/// Mass of the ceil(budget x n) largest of head h's n weights x (summing to z), over z.
inline double top_mass(const float* x, std::size_t n, double budget, double z, StepBuffers& b) {
  const auto k = static_cast<std::size_t>(
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(budget * static_cast<double>(n) - 1e-9)), 1, static_cast<std::int64_t>(n)));
  std::copy_n(x, n, b.sorted.data());
  std::nth_element(b.sorted.begin(), b.sorted.begin() + static_cast<std::ptrdiff_t>(k - 1), b.sorted.begin() + static_cast<std::ptrdiff_t>(n),
                   std::greater<float>());
  double top = 0;
  for (std::size_t i = 0; i < k; ++i) top += b.sorted[i];
  return top / z;
}

/// Head h at a step of n tokens: its softmax (b.e's row becomes exp(score - max)), its page
/// masses (b.page_mass), and its entropy, top, sink and local mass added to r.
inline void head_figures(std::size_t h, std::int64_t n, const PageRanges& pr, int pt, double budget, StepBuffers& b, StreamStats& r) {
  const auto pages = static_cast<std::size_t>(pr.pages);
  const auto un = static_cast<std::size_t>(n);
  float* x = b.e.data() + h * b.n_max;
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
  double* mass = b.page_mass.data() + h * pages;
  for (std::size_t p = 0; p < pages; ++p) {
    double pm = 0;
    const std::size_t end = std::min(un, (p + 1) * static_cast<std::size_t>(pt));
    for (std::size_t t = p * static_cast<std::size_t>(pt); t < end; ++t) pm += x[t];
    mass[p] = pm / z;
  }
  r.top_mass[h] += top_mass(x, un, budget, z, b);
  double sink = 0, local = 0;
  for (std::size_t p = 0; p < static_cast<std::size_t>(pr.sink_end); ++p) sink += mass[p];
  for (std::size_t p = static_cast<std::size_t>(pr.local_begin); p < pages; ++p) local += mass[p];
  r.sink_mass[h] += sink;
  r.local_mass[h] += local;
}

/// The step's critical pages (OracleMass's rule on the candidates: the `want` with the most
/// mass summed over the group), ascending; their mass per head added to r.critical_mass.
inline std::vector<std::uint32_t> critical_pages(const PageRanges& pr, std::int64_t want, StepBuffers& b, StreamStats& r) {
  const auto G = static_cast<std::size_t>(r.group), pages = static_cast<std::size_t>(pr.pages);
  const std::int64_t cands = pr.candidates();
  b.cand_mass.assign(static_cast<std::size_t>(cands), 0.0);
  for (std::size_t h = 0; h < G; ++h)
    for (std::int64_t i = 0; i < cands; ++i)
      b.cand_mass[static_cast<std::size_t>(i)] += b.page_mass[h * pages + static_cast<std::size_t>(pr.sink_end + i)];
  std::vector<std::uint32_t> crit = top_indices(b.cand_mass, static_cast<std::size_t>(want));
  for (auto& p : crit) p += static_cast<std::uint32_t>(pr.sink_end);
  for (std::size_t h = 0; h < G; ++h) {
    double c = 0;
    for (std::uint32_t p : crit) c += b.page_mass[h * pages + p];
    r.critical_mass[h] += c;
  }
  return crit;
}

/// How each step's critical pages overlap the previous steps': coverage W = 1 .. windows and
/// the Jaccard index with the step before, summed over the steps where they are defined.
class CriticalOverlap {
 public:
  CriticalOverlap(std::size_t page_slots, int windows)
      : windows_(windows),
        last_seen_(page_slots, std::numeric_limits<std::int64_t>::min() / 2),
        cover_sum_(static_cast<std::size_t>(windows), 0.0),
        cover_n_(static_cast<std::size_t>(windows), 0) {}

  /// Adds step s's critical pages.
  void add(std::int64_t s, const std::vector<std::uint32_t>& crit) {
    const int W = windows_;
    if (!crit.empty()) {
      std::vector<std::size_t> hits(static_cast<std::size_t>(W), 0);
      for (std::uint32_t p : crit) {
        const std::int64_t age = s - last_seen_[p];  // steps since p was last critical
        for (int w = 1; w <= W; ++w) hits[static_cast<std::size_t>(w - 1)] += age <= w;
      }
      for (int w = 1; w <= W; ++w)
        if (s >= w) {
          cover_sum_[static_cast<std::size_t>(w - 1)] +=
              static_cast<double>(hits[static_cast<std::size_t>(w - 1)]) / static_cast<double>(crit.size());
          ++cover_n_[static_cast<std::size_t>(w - 1)];
        }
      if (s >= 1) {
        const double inter = static_cast<double>(hits[0]);
        jaccard_sum_ += inter / (static_cast<double>(crit.size() + prev_size_) - inter);
        ++jaccard_n_;
      }
    }
    for (std::uint32_t p : crit) last_seen_[p] = s;
    prev_size_ = crit.size();
  }

  /// The means into r (NaN where no step qualified).
  void finish(StreamStats& r) const {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    r.jaccard = jaccard_n_ > 0 ? jaccard_sum_ / static_cast<double>(jaccard_n_) : nan;
    r.coverage.resize(static_cast<std::size_t>(windows_));
    for (std::size_t w = 0; w < r.coverage.size(); ++w) r.coverage[w] = cover_n_[w] > 0 ? cover_sum_[w] / static_cast<double>(cover_n_[w]) : nan;
  }

 private:
  int windows_;
  // last_seen_[p]: the last step whose critical set held page p, so p is in the union of the
  // last W sets exactly when last_seen_[p] >= s - W.
  std::vector<std::int64_t> last_seen_;
  std::vector<double> cover_sum_;
  std::vector<std::int64_t> cover_n_;
  double jaccard_sum_ = 0;
  std::int64_t jaccard_n_ = 0;
  std::size_t prev_size_ = 0;
};

}  // namespace trace_stats_detail

/// The figures of one stream; see the top of this file. When `critical` is given it receives
/// each step's critical pages C_s (ascending page ids), e.g. to replay a cache against them.
inline StreamStats stream_stats(const StreamTrace& tr, const TraceStatsOptions& o, std::vector<std::vector<std::uint32_t>>* critical = nullptr) {
  using namespace trace_stats_detail;
  check_stream(tr, o);
  if (critical) critical->clear();
  const Budget budget = Budget::fraction(o.budget);
  const float scale = 1.0f / std::sqrt(static_cast<float>(tr.head_dim));
  const int pt = o.page_tokens;
  StreamStats r = start_stats(tr);
  StepBuffers b(tr, attention::padded_rows(pt));
  CriticalOverlap overlap((b.n_max + static_cast<std::size_t>(pt) - 1) / static_cast<std::size_t>(pt), o.max_window);
  for (std::int64_t s = 0; s < tr.steps; ++s) {
    const std::int64_t n = tr.prefix + s + 1;
    const PageRanges pr = page_ranges(n, pt, o.sink_tokens, o.local_tokens);
    token_scores(tr, s, n, pt, scale, static_cast<std::size_t>(pr.pages), b);
    b.page_mass.assign(static_cast<std::size_t>(tr.group) * static_cast<std::size_t>(pr.pages), 0.0);
    for (std::size_t h = 0; h < static_cast<std::size_t>(tr.group); ++h) head_figures(h, n, pr, pt, o.budget, b, r);
    const std::int64_t want = budget.pages_for(pr.candidates());
    if (s == 0) {
      r.candidate_pages = pr.candidates();
      r.budget_pages = want;
    }
    std::vector<std::uint32_t> crit = critical_pages(pr, want, b, r);
    overlap.add(s, crit);
    if (critical) critical->push_back(std::move(crit));
  }
  const double steps = static_cast<double>(tr.steps);
  for (auto* v : {&r.entropy, &r.entropy_norm, &r.top_mass, &r.sink_mass, &r.local_mass, &r.critical_mass})
    for (double& x : *v) x /= steps;
  overlap.finish(r);
  return r;
}

}  // namespace kvdrive::eval
