// Replays a StreamTrace against index policies the way KvManager drives them, and scores each
// policy's selections against full attention. Per stream: the keys and values are rounded to
// the KV dtype; every index is built from the prompt's sealed pages and extended page by page as
// decode seals new ones; at each step each index selects its pages among the candidates
// (Decision 3: sink and local excluded, budget = ceil(f x candidates)), and the step is scored:
//   mass_recall      attention mass on the attended pages (sink + selected + local), mean over
//                    the group's query heads; mass_recall_min: the minimum over the heads
//   topk_recall      |selected ∩ true top pages| / budget, the true top pages being those of
//                    largest attention mass summed over the group (OracleMass's rule)
//   out_err          ||sparse output - dense output|| / ||dense output|| over the group's heads
//   select_us        wall time of the index's select() for the stream (with the focus carry,
//                    every call the merge makes)
// With EvalSettings::carry on (off by default, so the figures are the index's own), each index's
// selection also keeps the pages its own sparse attention of the previous step weighted heavily,
// as KvManager does (Config::carry, manager/focus_carry.hpp).
// Dense attention for the reference runs once per step and is shared by every index.
// Policies are passed type-erased (AnyIndex, eval/any_index.hpp) so a tool can compare a
// runtime list of them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/core/config.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/page_ranges.hpp"
#include "kvdrive/eval/any_index.hpp"
#include "kvdrive/eval/cache_replay.hpp"
#include "kvdrive/eval/metrics.hpp"
#include "kvdrive/eval/stream_trace.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/selection.hpp"
#include "kvdrive/manager/focus_carry.hpp"
#include "kvdrive/tier/placement.hpp"

namespace kvdrive::eval {

struct EvalSettings {
  int page_tokens = 8;
  int sink_tokens = 4;
  int local_tokens = 64;
  double budget = 0.0625;           ///< fraction of the candidate pages, (0, 1]
  DType dtype = DType::f16;         ///< the KV dtype (keys, values and index data)
  FocusCarry carry{.share = 0.0f};  ///< off: the figures are each index's own selection

  void validate() const {
    carry.validate();
    KVD_EXPECT(page_tokens >= 1 && page_tokens <= 4096, "eval: page_tokens {} outside 1..4096", page_tokens);
    KVD_EXPECT(sink_tokens >= 0 && local_tokens >= 0, "eval: sink {} and local {} tokens must be >= 0", sink_tokens, local_tokens);
    (void)Budget::fraction(budget);
  }
};

/// Sums of one index's per-step figures; mean() of each is sum / steps.
struct IndexTally {
  std::string name;
  double mass_recall = 0, mass_recall_min = 0, topk_recall = 0, out_err = 0;
  double select_ns = 0;
  std::int64_t selects = 0;  ///< steps with candidates, where select() ran
  double index_bytes = 0;    ///< summed over steps, the index's bytes at that step
  double tokens = 0;         ///< summed over steps, the stream's tokens at that step
  std::int64_t steps = 0;

  void add(const IndexTally& o) {
    mass_recall += o.mass_recall;
    mass_recall_min += o.mass_recall_min;
    topk_recall += o.topk_recall;
    out_err += o.out_err;
    select_ns += o.select_ns;
    selects += o.selects;
    index_bytes += o.index_bytes;
    tokens += o.tokens;
    steps += o.steps;
  }
  double mean(double sum) const { return steps > 0 ? sum / static_cast<double>(steps) : 0.0; }
  double bytes_per_token() const { return tokens > 0 ? index_bytes / tokens : 0.0; }
  double select_us() const { return selects > 0 ? select_ns / static_cast<double>(selects) / 1e3 : 0.0; }
  double mean_bytes() const { return mean(index_bytes); }
};

namespace detail {
template <class T>
std::vector<T> to_dtype(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = from_float<T>(x[i]);
  return out;
}

/// Throws kvdrive::Error for a stream trace whose arrays do not match its shape.
inline void check_trace(const StreamTrace& tr) {
  KVD_EXPECT(tr.head_dim > 0 && tr.group > 0 && tr.steps >= 1 && tr.prefix >= 0, "eval: empty or malformed stream trace");
  KVD_EXPECT(tr.keys.size() == static_cast<std::size_t>(tr.tokens()) * tr.head_dim && tr.values.size() == tr.keys.size() &&
                 tr.queries.size() == static_cast<std::size_t>(tr.steps) * tr.group * tr.head_dim,
             "eval: stream trace arrays do not match its shape");
}

/// One stream replayed in KV dtype T, as evaluate_stream describes: the keys and values as the
/// cache stores them, and what one step needs (the dense reference, each index's selection and
/// sparse attention over it).
template <class T>
class StreamReplay {
 public:
  StreamReplay(const StreamTrace& tr, const EvalSettings& set)
      : tr_(tr),
        set_(set),
        d_(tr.head_dim),
        g_(tr.group),
        pt_(set.page_tokens),
        k_(to_dtype<T>(tr.keys)),
        v_(to_dtype<T>(tr.values)),
        kf_(k_.size()),
        dense_out_(static_cast<std::size_t>(g_) * d_),
        sparse_out_(dense_out_.size()),
        lse_(static_cast<std::size_t>(g_)),
        sparse_lse_(static_cast<std::size_t>(g_)) {
    // The index sees the keys as the manager hands them over: float, in the KV dtype's precision.
    for (std::size_t i = 0; i < k_.size(); ++i) kf_[i] = to_float(k_[i]);
  }

  /// Every step in order: the dense reference, then each index selects, attends and is scored;
  /// the step's token is committed and a page it fills joins every index.
  void run(std::vector<std::unique_ptr<AnyIndex>>& indices, std::vector<IndexTally>& tally, std::vector<SelectionLog>* logs) {
    const std::int64_t sealed0 = tr_.prefix / pt_;
    if (sealed0 > 0)
      for (auto& ix : indices) ix->build(page_keys(0, sealed0));
    const Budget budget = Budget::fraction(set_.budget);
    carried_.assign(indices.size(), {});
    for (std::int64_t s = 0; s < tr_.steps; ++s) {
      const std::int64_t n = tr_.prefix + s + 1;
      const PageRanges r = page_ranges(n, pt_, set_.sink_tokens, set_.local_tokens);
      const std::int64_t want = r.candidates() > 0 ? budget.pages_for(r.candidates()) : 0;
      reference(s, r, want);
      const index::IndexQuery q = query(s, r, want);
      for (std::size_t i = 0; i < indices.size(); ++i) {
        select(*indices[i], q, tally[i], carried_[i]);
        attend_selected(r, want, tally[i], logs ? &(*logs)[i] : nullptr);
        if (set_.carry.enabled())
          manager::carried_pages(set_.carry, selected_, sparse_page_lse_.data() + static_cast<std::size_t>(r.sink_end) * g_, sparse_lse_,
                                 carried_[i]);
        IndexTally& t = tally[i];
        t.index_bytes += static_cast<double>(indices[i]->bytes());
        t.tokens += static_cast<double>(n);
        ++t.steps;
      }
      if (n % pt_ == 0) seal(n / pt_ - 1, indices);
    }
  }

 private:
  index::PageKeys page_keys(std::int64_t first, std::int64_t n) const {
    return index::PageKeys{kf_.data() + static_cast<std::size_t>(first) * pt_ * d_, first, n, pt_, d_, set_.dtype};
  }

  /// The query of step s, over the candidates of r.
  index::IndexQuery query(std::int64_t s, const PageRanges& r, std::int64_t want) const {
    index::IndexQuery q;
    q.q = tr_.query(s);
    q.group = g_;
    q.head_dim = d_;
    q.scale = scale();
    q.first_candidate = r.sink_end;
    q.end_candidate = r.local_begin;
    q.budget_pages = want;
    return q;
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(d_)); }

  /// Step s's reference: dense attention over every page (dense_out_, lse_, page_lse_), and the
  /// true top pages: the `want` candidates of largest attention mass summed over the group.
  void reference(std::int64_t s, const PageRanges& r, std::int64_t want) {
    const std::int64_t n = tr_.prefix + s + 1;
    all_.clear();
    for (std::int64_t p = 0; p < r.pages; ++p) {
      const std::int64_t t0 = p * pt_;
      const int tokens = static_cast<int>(std::min<std::int64_t>(pt_, n - t0));
      all_.push_back({k_.data() + static_cast<std::size_t>(t0) * d_, v_.data() + static_cast<std::size_t>(t0) * d_, tokens});
    }
    page_lse_.resize(static_cast<std::size_t>(r.pages) * g_);
    dense_ = attention::DecodeArgs{tr_.query(s), g_, d_, scale(), all_, dense_out_.data(), lse_.data(), page_lse_.data()};
    attention::sparse_decode<T>(dense_);
    mass_.assign(static_cast<std::size_t>(r.candidates()), 0.0f);
    for (std::int64_t p = r.sink_end; p < r.local_begin; ++p)
      for (int h = 0; h < g_; ++h)
        mass_[static_cast<std::size_t>(p - r.sink_end)] +=
            std::exp(page_lse_[static_cast<std::size_t>(p) * g_ + h] - lse_[static_cast<std::size_t>(h)]);
    truth_.clear();
    index::top_pages(mass_, r.sink_end, want, truth_);
  }

  /// ix's selection for q into selected_, timed into t, checked against the rules KvManager
  /// enforces too: ascending unique candidates within the budget.
  void select(const AnyIndex& ix, const index::IndexQuery& q, IndexTally& t, const std::vector<std::uint32_t>& carried) {
    selected_.clear();
    if (q.candidates() > 0) {
      const auto t0 = std::chrono::steady_clock::now();
      manager::select_with_carry(merge_, set_.carry, carried, q, selected_,
                                 [&](const index::IndexQuery& a, std::vector<std::uint32_t>& out) { ix.select(a, out); });
      t.select_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      ++t.selects;
    }
    for (std::size_t j = 0; j < selected_.size(); ++j)
      KVD_EXPECT(selected_[j] >= q.first_candidate && selected_[j] < q.end_candidate && (j == 0 || selected_[j] > selected_[j - 1]),
                 "eval: index {} selected page {} (position {}): not an ascending, unique candidate in [{}, {})", t.name, selected_[j], j,
                 q.first_candidate, q.end_candidate);
    KVD_EXPECT(ix.ignores_budget() || static_cast<std::int64_t>(selected_.size()) <= q.budget_pages,
               "eval: index {} selected {} pages, over its budget of {}", t.name, selected_.size(), q.budget_pages);
  }

  /// Sparse attention over sink + selected_ + local, scored against the reference into t; with
  /// a log, each selected page's mass in it, as KvManager scores it.
  void attend_selected(const PageRanges& r, std::int64_t want, IndexTally& t, SelectionLog* log) {
    attended_ids_.clear();
    for (std::int64_t p = 0; p < r.sink_end; ++p) attended_ids_.push_back(static_cast<std::uint32_t>(p));
    attended_ids_.insert(attended_ids_.end(), selected_.begin(), selected_.end());
    for (std::int64_t p = r.local_begin; p < r.pages; ++p) attended_ids_.push_back(static_cast<std::uint32_t>(p));
    attended_.clear();
    for (std::uint32_t p : attended_ids_) attended_.push_back(all_[p]);
    sparse_page_lse_.resize(attended_ids_.size() * static_cast<std::size_t>(g_));
    attention::DecodeArgs sa = dense_;
    sa.pages = attended_;
    sa.out = sparse_out_.data();
    sa.lse = sparse_lse_.data();
    sa.page_lse = sparse_page_lse_.data();
    attention::sparse_decode<T>(sa);
    if (log) {
      selected_mass_.clear();
      for (std::size_t j = 0; j < selected_.size(); ++j) {
        const float* pl = sparse_page_lse_.data() + (static_cast<std::size_t>(r.sink_end) + j) * g_;
        float m = 0.0f;
        for (int h = 0; h < g_; ++h) m += attention::page_mass(pl[h], sparse_lse_[static_cast<std::size_t>(h)]);
        selected_mass_.push_back(m);
      }
      log->add_step(selected_, selected_mass_, want);
    }
    const MassRecall mr = mass_recall(page_lse_, lse_, g_, attended_ids_);
    t.mass_recall += mr.mean;
    t.mass_recall_min += mr.min;
    t.topk_recall += topk_recall(selected_, truth_);
    t.out_err += relative_error(sparse_out_, dense_out_);
  }

  /// Page `page` was sealed: it joins every index (the first page builds them).
  void seal(std::int64_t page, std::vector<std::unique_ptr<AnyIndex>>& indices) const {
    for (auto& ix : indices) {
      if (page == 0) ix->build(page_keys(0, 1));
      else ix->append(page_keys(page, 1));
    }
  }

  const StreamTrace& tr_;
  const EvalSettings& set_;
  const int d_, g_, pt_;
  const std::vector<T> k_, v_;
  std::vector<float> kf_;
  std::vector<attention::PageRef> all_, attended_;  ///< every page; the pages one index attends
  attention::DecodeArgs dense_;                     ///< the step's dense attention
  std::vector<float> dense_out_, sparse_out_, lse_, sparse_lse_, page_lse_, sparse_page_lse_;
  std::vector<float> mass_, selected_mass_;  ///< per candidate (summed over the group); per selected page
  std::vector<std::uint32_t> selected_, truth_, attended_ids_;
  std::vector<std::vector<std::uint32_t>> carried_;  ///< per index: pages its last step attended heavily
  manager::CarryMerge merge_;
};
}  // namespace detail

/// Replays one stream against every index (each reset first); returns one tally per index.
/// With `logs`, also records each index's selections for cache replays (eval/cache_replay.hpp).
inline std::vector<IndexTally> evaluate_stream(const StreamTrace& tr, std::vector<std::unique_ptr<AnyIndex>>& indices, const EvalSettings& set,
                                               std::vector<SelectionLog>* logs = nullptr) {
  set.validate();
  detail::check_trace(tr);
  std::vector<IndexTally> tally(indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    tally[i].name = indices[i]->name();
    indices[i]->check(tr.head_dim);
    indices[i]->reset();
  }
  if (logs) logs->assign(indices.size(), SelectionLog{});
  dispatch_dtype(set.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::StreamReplay<T>(tr, set).run(indices, tally, logs);
  });
  return tally;
}

/// The warm-up placement of one stream at the end of its prompt: the candidates of decode step
/// 0 ranked by `placement` from the trace's observation queries, the keys in the KV dtype.
template <tier::PlacementPolicy P>
tier::PageRanking warm_ranking(const StreamTrace& tr, const EvalSettings& set, const P& placement) {
  set.validate();
  std::vector<float> keys(tr.keys.begin(), tr.keys.begin() + static_cast<std::ptrdiff_t>(tr.prefix * tr.head_dim));
  index::round_to_dtype(set.dtype, keys.data(), keys.size());
  tier::PlacementInput in;
  in.keys = keys.data();
  in.tokens = tr.prefix;
  in.queries = tr.observed_queries.data();
  in.observed = tr.observed;
  in.group = tr.group;
  in.head_dim = tr.head_dim;
  in.page_tokens = set.page_tokens;
  in.scale = 1.0f / std::sqrt(static_cast<float>(tr.head_dim));
  const PageRanges r = page_ranges(tr.prefix + 1, set.page_tokens, set.sink_tokens, set.local_tokens);
  return placement.rank(in, static_cast<std::uint32_t>(r.sink_end), static_cast<std::uint32_t>(r.local_begin));
}

}  // namespace kvdrive::eval
