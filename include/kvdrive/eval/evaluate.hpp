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
//   select_us        wall time of the index's select() for the stream
// Dense attention for the reference runs once per step and is shared by every index.
// Policies are passed type-erased (AnyIndex) so a tool can compare a runtime list of them.
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
#include "kvdrive/eval/cache_replay.hpp"
#include "kvdrive/eval/metrics.hpp"
#include "kvdrive/eval/stream_trace.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/index/row_store.hpp"
#include "kvdrive/index/selection.hpp"
#include "kvdrive/tier/placement.hpp"

namespace kvdrive::eval {

struct EvalSettings {
  int page_tokens = 8;
  int sink_tokens = 4;
  int local_tokens = 64;
  double budget = 0.0625;    ///< fraction of the candidate pages, (0, 1]
  DType dtype = DType::f16;  ///< the KV dtype (keys, values and index data)

  void validate() const {
    KVD_EXPECT(page_tokens >= 1 && page_tokens <= 4096, "eval: page_tokens {} outside 1..4096", page_tokens);
    KVD_EXPECT(sink_tokens >= 0 && local_tokens >= 0, "eval: sink {} and local {} tokens must be >= 0", sink_tokens, local_tokens);
    (void)Budget::fraction(budget);
  }
};

/// A type-erased index policy with the state of one stream.
class AnyIndex {
 public:
  virtual ~AnyIndex() = default;
  virtual std::string name() const = 0;
  virtual void reset() = 0;  ///< a fresh state for the next stream
  virtual void check(int head_dim) const = 0;  ///< throws if the policy does not fit head_dim
  virtual void build(const index::PageKeys& k) = 0;
  virtual void append(const index::PageKeys& k) = 0;
  virtual void select(const index::IndexQuery& q, std::vector<std::uint32_t>& out) const = 0;
  virtual std::size_t bytes() const = 0;
  virtual std::unique_ptr<AnyIndex> clone() const = 0;  ///< same policy, fresh state
  virtual bool ignores_budget() const = 0;              ///< Dense: every candidate
};

template <index::IndexPolicy I>
class IndexAdapter final : public AnyIndex {
 public:
  explicit IndexAdapter(I policy = {}, std::string label = {}) : policy_(std::move(policy)), label_(std::move(label)) {}
  std::string name() const override { return label_.empty() ? std::string(I::name()) : label_; }
  void reset() override { state_ = typename I::State{}; }
  void check(int head_dim) const override { index::check_for_head_dim(policy_, head_dim); }
  void build(const index::PageKeys& k) override { policy_.build(state_, k); }
  void append(const index::PageKeys& k) override { policy_.append(state_, k); }
  void select(const index::IndexQuery& q, std::vector<std::uint32_t>& out) const override { policy_.select(state_, q, out); }
  std::size_t bytes() const override { return policy_.bytes(state_); }
  std::unique_ptr<AnyIndex> clone() const override { return std::make_unique<IndexAdapter>(policy_, label_); }
  bool ignores_budget() const override {
    if constexpr (requires { I::kIgnoresBudget; }) return I::kIgnoresBudget;
    return false;
  }
  const I& policy() const { return policy_; }
  const typename I::State& state() const { return state_; }

 private:
  I policy_;
  std::string label_;
  typename I::State state_{};
};

template <index::IndexPolicy I>
std::unique_ptr<AnyIndex> make_any_index(I policy = {}, std::string label = {}) {
  return std::make_unique<IndexAdapter<I>>(std::move(policy), std::move(label));
}

/// Sums of one index's per-step figures; mean() of each is sum / steps.
struct IndexTally {
  std::string name;
  double mass_recall = 0, mass_recall_min = 0, topk_recall = 0, out_err = 0;
  double select_ns = 0;
  std::int64_t selects = 0;  ///< steps with candidates, where select() ran
  double index_bytes = 0;   ///< summed over steps, the index's bytes at that step
  double tokens = 0;        ///< summed over steps, the stream's tokens at that step
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
}  // namespace detail

/// Replays one stream against every index (each reset first); returns one tally per index.
/// With `logs`, also records each index's selections for cache replays (eval/cache_replay.hpp).
inline std::vector<IndexTally> evaluate_stream(const StreamTrace& tr, std::vector<std::unique_ptr<AnyIndex>>& indices,
                                               const EvalSettings& set, std::vector<SelectionLog>* logs = nullptr) {
  set.validate();
  KVD_EXPECT(tr.head_dim > 0 && tr.group > 0 && tr.steps >= 1 && tr.prefix >= 0, "eval: empty or malformed stream trace");
  KVD_EXPECT(tr.keys.size() == static_cast<std::size_t>(tr.tokens()) * tr.head_dim &&
                 tr.values.size() == tr.keys.size() &&
                 tr.queries.size() == static_cast<std::size_t>(tr.steps) * tr.group * tr.head_dim,
             "eval: stream trace arrays do not match its shape");
  std::vector<IndexTally> tally(indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    tally[i].name = indices[i]->name();
    indices[i]->check(tr.head_dim);
    indices[i]->reset();
  }
  if (logs) logs->assign(indices.size(), SelectionLog{});
  dispatch_dtype(set.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int d = tr.head_dim, g = tr.group, pt = set.page_tokens;
    const std::vector<T> k = detail::to_dtype<T>(tr.keys), v = detail::to_dtype<T>(tr.values);
    // The index sees the keys as the manager hands them over: float, in the KV dtype's precision.
    std::vector<float> kf(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) kf[i] = to_float(k[i]);
    const auto page_keys = [&](std::int64_t first, std::int64_t n) {
      return index::PageKeys{kf.data() + static_cast<std::size_t>(first) * pt * d, first, n, pt, d, set.dtype};
    };
    const std::int64_t sealed0 = tr.prefix / pt;
    if (sealed0 > 0)
      for (auto& ix : indices) ix->build(page_keys(0, sealed0));
    const Budget budget = Budget::fraction(set.budget);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<attention::PageRef> all, attended;
    std::vector<float> dense_out(static_cast<std::size_t>(g) * d), sparse_out(dense_out.size());
    std::vector<float> lse(static_cast<std::size_t>(g)), page_lse;
    std::vector<float> sparse_lse(static_cast<std::size_t>(g)), sparse_page_lse, selected_mass;
    std::vector<std::uint32_t> selected, truth, attended_ids;
    std::vector<float> mass;
    for (std::int64_t s = 0; s < tr.steps; ++s) {
      const std::int64_t n = tr.prefix + s + 1;
      const PageRanges r = page_ranges(n, pt, set.sink_tokens, set.local_tokens);
      all.clear();
      for (std::int64_t p = 0; p < r.pages; ++p) {
        const std::int64_t t0 = p * pt;
        const int tokens = static_cast<int>(std::min<std::int64_t>(pt, n - t0));
        all.push_back({k.data() + static_cast<std::size_t>(t0) * d, v.data() + static_cast<std::size_t>(t0) * d, tokens});
      }
      page_lse.resize(static_cast<std::size_t>(r.pages) * g);
      attention::DecodeArgs a;
      a.q = tr.query(s);
      a.group = g;
      a.head_dim = d;
      a.scale = scale;
      a.pages = all;
      a.out = dense_out.data();
      a.lse = lse.data();
      a.page_lse = page_lse.data();
      attention::sparse_decode<T>(a);
      // The true top pages: largest attention mass summed over the group, among candidates.
      const std::int64_t want = r.candidates() > 0 ? budget.pages_for(r.candidates()) : 0;
      mass.assign(static_cast<std::size_t>(r.candidates()), 0.0f);
      for (std::int64_t p = r.sink_end; p < r.local_begin; ++p)
        for (int h = 0; h < g; ++h)
          mass[static_cast<std::size_t>(p - r.sink_end)] += std::exp(page_lse[static_cast<std::size_t>(p) * g + h] - lse[static_cast<std::size_t>(h)]);
      truth.clear();
      index::top_pages(mass, r.sink_end, want, truth);

      index::IndexQuery q;
      q.q = tr.query(s);
      q.group = g;
      q.head_dim = d;
      q.scale = scale;
      q.first_candidate = r.sink_end;
      q.end_candidate = r.local_begin;
      q.budget_pages = want;
      for (std::size_t i = 0; i < indices.size(); ++i) {
        selected.clear();
        if (r.candidates() > 0) {
          const auto t0 = std::chrono::steady_clock::now();
          indices[i]->select(q, selected);
          tally[i].select_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
          ++tally[i].selects;
        }
        // The rules KvManager enforces too: ascending unique candidates within the budget.
        for (std::size_t j = 0; j < selected.size(); ++j)
          KVD_EXPECT(selected[j] >= q.first_candidate && selected[j] < q.end_candidate && (j == 0 || selected[j] > selected[j - 1]),
                     "eval: index {} selected page {} (position {}): not an ascending, unique candidate in [{}, {})",
                     tally[i].name, selected[j], j, q.first_candidate, q.end_candidate);
        KVD_EXPECT(indices[i]->ignores_budget() || static_cast<std::int64_t>(selected.size()) <= want,
                   "eval: index {} selected {} pages, over its budget of {}", tally[i].name, selected.size(), want);
        attended_ids.clear();
        for (std::int64_t p = 0; p < r.sink_end; ++p) attended_ids.push_back(static_cast<std::uint32_t>(p));
        attended_ids.insert(attended_ids.end(), selected.begin(), selected.end());
        for (std::int64_t p = r.local_begin; p < r.pages; ++p) attended_ids.push_back(static_cast<std::uint32_t>(p));
        attended.clear();
        for (std::uint32_t p : attended_ids) attended.push_back(all[p]);
        attention::DecodeArgs sa = a;
        sa.pages = attended;
        sa.out = sparse_out.data();
        sparse_page_lse.resize(attended_ids.size() * static_cast<std::size_t>(g));
        sa.lse = sparse_lse.data();
        sa.page_lse = sparse_page_lse.data();
        attention::sparse_decode<T>(sa);
        if (logs) {  // each selected page's mass in the sparse attention, as KvManager scores it
          selected_mass.clear();
          for (std::size_t j = 0; j < selected.size(); ++j) {
            const float* pl = sparse_page_lse.data() + (static_cast<std::size_t>(r.sink_end) + j) * g;
            float m = 0.0f;
            for (int h = 0; h < g; ++h) m += attention::page_mass(pl[h], sparse_lse[static_cast<std::size_t>(h)]);
            selected_mass.push_back(m);
          }
          (*logs)[i].add_step(selected, selected_mass, want);
        }
        const MassRecall mr = mass_recall(page_lse, lse, g, attended_ids);
        IndexTally& t = tally[i];
        t.mass_recall += mr.mean;
        t.mass_recall_min += mr.min;
        t.topk_recall += topk_recall(selected, truth);
        t.out_err += relative_error(sparse_out, dense_out);
        t.index_bytes += static_cast<double>(indices[i]->bytes());
        t.tokens += static_cast<double>(n);
        ++t.steps;
      }
      // The step's token is committed; a page it fills is sealed and joins every index.
      if (n % pt == 0) {
        const std::int64_t page = n / pt - 1;
        for (auto& ix : indices) {
          if (page == 0)
            ix->build(page_keys(0, 1));
          else
            ix->append(page_keys(page, 1));
        }
      }
    }
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
