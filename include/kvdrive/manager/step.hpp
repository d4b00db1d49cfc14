// Step: one decode step of one layer for a batch, as the StepStages a pipeline drives
// (pipeline/concept.hpp), in the order they run (Decision 1):
//   select    append_token writes the new token's K and V into its tail page, past the
//             stream's token count (invisible until commit); the index then picks candidates
//   classify  each selected page: a hit (resident, or attended in place) or a miss
//   fetch     the misses are read from their tiers into fresh staging slots, one batch per tier
//             (fetch_start leaves the reads in flight; fetch_finish waits and lands them)
//   compute   attention over the pages (manager/step_attend.hpp)
//   commit    prepare_commit writes sealed pages (the fallible part); then, past the point of no
//             return, apply() gives each stream its new tail, its misses and its cache update
// A step works over a narrow context: the manager's Core, its PageStore, and the plans buffer.
// Until commit it only reads shared state and writes plan-local buffers, fresh slots and the
// tail rows past the token count; abort() gives back everything (Decision 8).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/stats.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/manager/page_edit.hpp"
#include "kvdrive/manager/page_store.hpp"
#include "kvdrive/manager/step_attend.hpp"
#include "kvdrive/manager/step_plan.hpp"

namespace kvdrive::manager {

/// What attend() hands a step: the layer, the batch and its views.
struct StepInputs {
  int layer = 0;
  std::span<const SeqId> batch;
  View<const float, 3> q, k, v;
  View<float, 3> out;
};

template <class Core>
using PlanOf = StepPlan<typename Core::StreamT, typename PageStore<Core>::Staging, typename Core::TierList>;

template <class Core>
class Step {
 public:
  using Plan = PlanOf<Core>;
  using Store = PageStore<Core>;
  using TierList = typename Core::TierList;
  Stats stats;

  Step(Core& c, Store& store, std::vector<Plan>& plans, const StepInputs& in)
      : c_(c), store_(store), plans_(plans), in_(in), attention_(c, store), written_(c.tiers) {
    const int kvh = c.cfg.shape.kv_heads;
    plans_.resize(in.batch.size() * static_cast<std::size_t>(kvh));
    for (std::size_t b = 0; b < in.batch.size(); ++b)
      for (int h = 0; h < kvh; ++h) {
        Plan& p = plans_[b * kvh + h];
        p.stream = &c.stream(c.sequences.find(in.batch[b]), in.layer, h);
        p.base = tier::PageKey{in.batch[b], static_cast<std::uint32_t>(in.layer), static_cast<std::uint32_t>(h), 0};
        p.batch_index = b;
        p.head = h;
        p.reset();
      }
    stats.steps = 1;
    stats.streams = plans_.size();
  }

  std::size_t streams() const { return plans_.size(); }

  // ---- select --------------------------------------------------------------------------------

  void select(std::size_t i) {
    Plan& p = plans_[i];
    const index::IndexQuery query = prepare_select(p);
    if (p.ranges.candidates() > 0) {  // with the focus carry and the observation pins (manager/focus_carry.hpp)
      const FocusCarry rule = kept_pages(c_.cfg.carry, c_.cfg.pins, p.stream->pinned, p.stream->carried, query, p.kept);
      select_with_carry(p.merge, rule, p.kept, query, p.selected,
                        [&](const index::IndexQuery& q, std::vector<std::uint32_t>& out) { c_.index.select(p.stream->index, q, out); });
    }
    check_selection(p, query);
  }

  /// select() for streams [first, last): with an index that selects many streams in one call
  /// (index::BatchSelectIndex, e.g. on a GPU), the streams are prepared in parallel and
  /// selected together; otherwise each is selected in parallel.
  void select_range(std::size_t first, std::size_t last) {
    if constexpr (index::BatchSelectIndex<typename Core::Index>) {
      std::vector<index::IndexQuery> queries(last - first);
      c_.backend.parallel_for(last - first, [&](std::size_t j) { queries[j] = prepare_select(plans_[first + j]); });
      // Streams with carried pages may ask again (focus carry); each round is one batch call.
      std::vector<std::size_t> ask, again;
      std::vector<std::uint8_t> merging(queries.size(), 0);
      for (std::size_t j = 0; j < queries.size(); ++j) {
        Plan& p = plans_[first + j];
        if (p.ranges.candidates() <= 0) continue;
        const FocusCarry rule = kept_pages(c_.cfg.carry, c_.cfg.pins, p.stream->pinned, p.stream->carried, queries[j], p.kept);
        merging[j] = p.merge.start(rule, p.kept, queries[j]);
        ask.push_back(j);
      }
      std::vector<const typename Core::Index::State*> states;
      std::vector<index::IndexQuery> asked;
      std::vector<std::vector<std::uint32_t>*> outs;
      while (!ask.empty()) {
        states.clear(), asked.clear(), outs.clear(), again.clear();
        for (std::size_t j : ask) {
          Plan& p = plans_[first + j];
          p.selected.clear();
          states.push_back(&p.stream->index);
          asked.push_back(queries[j]);
          if (merging[j]) asked.back().budget_pages = p.merge.ask();
          outs.push_back(&p.selected);
        }
        c_.index.select_batch(states, asked, outs);
        for (std::size_t j : ask) {
          Plan& p = plans_[first + j];
          if (!merging[j]) continue;
          if (p.merge.take(p.selected)) again.push_back(j);
          else p.selected.swap(p.merge.result());
        }
        ask.swap(again);
      }
      for (std::size_t j = 0; j < queries.size(); ++j) check_selection(plans_[first + j], queries[j]);
    } else {
      c_.backend.parallel_for(last - first, [&](std::size_t j) { select(first + j); });
    }
  }

  // ---- classify ------------------------------------------------------------------------------

  void classify(std::size_t i) {
    Plan& p = plans_[i];
    for (std::uint32_t page : p.selected) {
      const PageEntry& e = p.stream->pages[page];
      const bool in_place = store_.attends_in_place(e.home);
      if (in_place && e.slot < 0) {
        ++p.hits;
        ++p.in_place;
      } else if (e.slot >= 0) {
        ++p.hits;
      } else {
        // A miss is read from the page's backing tier; a page without one must be resident.
        KVD_EXPECT(e.home != 0, "page {} of a stream has no backing tier and no fast slot: its bytes are lost", page);
        p.misses.push_back(page);
      }
      // A page with no backing copy (home 0: a fast tier alone) lives in its slot for good; the
      // cache policy must never see it, or an eviction would lose its bytes.
      if (!in_place && e.home != 0) p.through_cache.push_back(page);
    }
  }

  // ---- fetch ---------------------------------------------------------------------------------

  void fetch(std::size_t i) { fetch_range(i, i + 1); }

  /// Fetches the misses of streams [first, last) into staging slots, in one batch per tier,
  /// so their reads are in flight together (one round trip to the device, not one per stream).
  void fetch_range(std::size_t first, std::size_t last) {
    fetch_start(first, last);
    fetch_finish(first, last);
  }

  /// Gives each miss of streams [first, last) a fresh fast slot (in misses order) and starts
  /// reading them, one batch per tier; returns with the reads in flight where the tier reads
  /// asynchronously (SsdTier), so a pipeline can start the next range meanwhile. The range's
  /// first plan holds the reads' handle and staging; fetch_finish(first, last) waits.
  void fetch_start(std::size_t first, std::size_t last) {
    Plan& head = plans_[first];
    for (std::size_t i = first; i < last; ++i) {
      Plan& p = plans_[i];
      p.staged.reserve(p.misses.size());
      for (std::size_t s = p.staged.size(); s < p.misses.size(); ++s) p.staged.push_back(c_.tiers.fast().allocate());
    }
    std::vector<tier::ReadRequest> reads;
    for (std::size_t tier_index = 1; tier_index < TierList::kCount; ++tier_index) {
      reads.clear();
      for (std::size_t i = first; i < last; ++i) {
        Plan& p = plans_[i];
        for (std::size_t s = 0; s < p.misses.size(); ++s)
          if (p.stream->pages[p.misses[s]].home == tier_index) reads.push_back({p.key(p.misses[s]), store_.stage(head.staging, p.staged[s])});
      }
      if (!reads.empty()) head.reads.submit(c_.tiers, tier_index, reads);
    }
  }

  /// Waits for the reads fetch_start(first, last) started (all of them, even after an error:
  /// none is left in flight), then throws the first error or lands the pages in their slots.
  void fetch_finish(std::size_t first, std::size_t) {
    Plan& head = plans_[first];
    if (std::exception_ptr error = head.reads.wait()) std::rethrow_exception(error);
    typename Store::Staging* staged[] = {&head.staging};
    store_.land(staged);
  }

  // ---- compute -------------------------------------------------------------------------------

  void compute(std::size_t first, std::size_t last) { attention_.compute(std::span<Plan>(plans_).subspan(first, last - first)); }

  /// Attends the splits of streams [first, last) whose pages are all resident already (no
  /// miss among them), after classify and before or while their misses are read; compute()
  /// does the rest and merges. Optional for a pipeline: the bits are the same either way.
  void compute_ready(std::size_t first, std::size_t last) { attention_.compute_ready(std::span<Plan>(plans_).subspan(first, last - first)); }

  /// Runs fn(i) for i in [0, n) on the backend's threads (for stages that are per stream).
  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { c_.backend.parallel_for(n, fn); }

  /// Where the pipeline records each stage's time.
  StageTimes& times() { return stats.time; }

  // ---- commit --------------------------------------------------------------------------------

  /// The fallible part of commit(), which needs no attention output: sealed pages go to their
  /// backing tiers, and the index gets their keys as float. A pipeline may run it while
  /// compute() runs (Elastic does); commit() runs it if nobody did. Undone by abort().
  void prepare_commit() {
    if (prepared_) return;
    prepared_ = true;
    std::vector<SealedPage> seals;
    for (Plan& p : plans_)
      if (p.seals) seals.push_back({p.key(p.tail_page()), store_.tail_bytes(*p.stream, p.tail_slot())});
    store_.store_sealed(seals, written_, true);
    std::size_t at = 0;
    const std::size_t pb = store_.stored_bytes();
    for (Plan& p : plans_) {
      if (!p.seals) continue;
      p.seal_home = seals[at++].home;
      if (p.seal_home > 0) stats.bytes_written[Core::kLastTier] += pb;
      if (p.seal_home > 0 && p.seal_home != Core::kLastTier) stats.bytes_written[p.seal_home] += pb;
      p.seal_keys.clear();
      store_.append_page_keys(store_.tail_bytes(*p.stream, p.tail_slot()), p.seal_keys);  // still fallible
    }
  }

  void commit() {
    prepare_commit();
    // The point of no return: from here the step applies, and the pages written above stay.
    written_.keep();
    std::size_t i = 0;
    try {
      for (; i < plans_.size(); ++i) apply(plans_[i]);
    } catch (const std::exception& e) {
      fail_commit(i, e);
    }
  }

  /// Undo everything a failed step allocated or wrote; the sequences stay as they were.
  void abort() {
    for (Plan& p : plans_) (void)p.reads.wait();  // no read may land in a slot after it is freed
    for (Plan& p : plans_) release_slots(p);
    written_.undo();
  }

 private:
  /// select()'s part before the index: the new token goes into its page, and the stream's
  /// query is gathered.
  index::IndexQuery prepare_select(Plan& p) {
    append_token(p);
    const Config& c = c_.cfg;
    const int d = c.shape.head_dim, g = c.group();
    p.q.resize(static_cast<std::size_t>(g) * d);
    for (int j = 0; j < g; ++j) std::copy_n(in_.q.row(p.batch_index, p.head * g + j), d, p.q.data() + static_cast<std::size_t>(j) * d);
    index::IndexQuery query;
    query.q = p.q.data();
    query.group = g;
    query.head_dim = d;
    query.scale = c.scale();
    query.first_candidate = p.ranges.sink_end;
    query.end_candidate = p.ranges.local_begin;
    query.budget_pages = c.budget.pages_for(p.ranges.candidates());
    return query;
  }

  /// The new token's K and V go into its tail page (a fresh slot when it starts one), past the
  /// stream's token count, so invisible until commit.
  void append_token(Plan& p) {
    auto& st = *p.stream;
    p.ranges = c_.ranges(st.pages.tokens + 1);
    const int row = static_cast<int>(st.pages.tokens % c_.cfg.page_tokens);
    if (row == 0) p.new_tail = c_.tiers.fast().allocate();
    store_.write_token(st, p.tail_slot(), row, in_.k.row(p.batch_index, p.head), in_.v.row(p.batch_index, p.head));
    p.seals = row == c_.cfg.page_tokens - 1;
  }

  /// An index's selection must be candidates, ascending.
  static void check_selection(const Plan& p, const index::IndexQuery& query) {
    for (std::size_t s = 0; s < p.selected.size(); ++s) {
      const std::uint32_t page = p.selected[s];
      KVD_EXPECT(page >= query.first_candidate && page < query.end_candidate && (s == 0 || page > p.selected[s - 1]),
                 "index '{}' selected page {} outside candidates [{}, {}) or out of order", Core::Index::name(), page, query.first_candidate,
                 query.end_candidate);
    }
  }

  /// Applies one stream's step. Policies' append() and update() run here, after the point of
  /// no return; they must not throw (if one does, attend() reports the batch unusable).
  void apply(Plan& p) {
    auto& st = *p.stream;
    if (p.new_tail >= 0) st.pages.push_back(PageEntry{std::exchange(p.new_tail, -1), 0});
    ++st.pages.tokens;
    if (p.seals) {
      st.pages[p.tail_page()].home = p.seal_home;
      c_.index_pages(st, c_.page_keys_view(p.tail_page(), 1, p.seal_keys));  // page 0: a stream decoded without prefill
    }
    // Misses enter the cache in their staging slots; the policy then evicts.
    for (std::size_t s = 0; s < p.misses.size(); ++s) st.pages[p.misses[s]].slot = p.staged[s];
    p.staged.clear();
    eviction::CacheUpdate u;
    u.pages = p.through_cache;
    u.scores = p.cache_scores;
    u.step = st.steps + 1;
    u.window = c_.window_of(in_.layer, p.head);
    u.capacity = c_.cache_capacity(u.window, p.ranges);
    const std::size_t evicted = c_.update_cache(st, u, evicted_);
    c_.slide_local_window(st, [&](Slot s) { store_.cool(s); });
    if (c_.cfg.carry.enabled() && !p.lse.empty())  // the next step's carried pages (focus_carry.hpp)
      carried_pages(c_.cfg.carry, p.selected, p.page_lse.data() + static_cast<std::size_t>(p.ranges.sink_end) * c_.cfg.group(), p.lse, st.carried);
    ++st.steps;
    const int g = c_.cfg.group(), d = c_.cfg.shape.head_dim;
    for (int j = 0; j < g; ++j) std::copy_n(p.out.data() + static_cast<std::size_t>(j) * d, d, in_.out.row(p.batch_index, p.head * g + j));
    count(p, evicted);
  }

  void count(const Plan& p, std::size_t evicted) {
    stats.candidates += static_cast<std::uint64_t>(p.ranges.candidates());
    stats.selected += p.selected.size();
    stats.hits += p.hits;
    stats.in_place += p.in_place;
    stats.misses += p.misses.size();
    stats.evictions += evicted;
    stats.attended_pages += p.refs.size();
    for (const auto& r : p.refs) stats.attended_tokens += static_cast<std::uint64_t>(r.tokens);
    for (std::uint32_t page : p.misses) stats.bytes_read[p.stream->pages[page].home] += store_.stored_bytes();
  }

  /// The slots a plan holds that no stream took over: its staging slots and its new tail.
  void release_slots(Plan& p) {
    for (Slot s : p.staged) c_.tiers.fast().release(s);
    p.staged.clear();
    p.staging.drop();
    if (p.new_tail >= 0) c_.tiers.fast().release(std::exchange(p.new_tail, -1));
  }

  /// A policy threw in apply() of stream i: the streams after it keep nothing of the step (their
  /// slots and sealed pages go), and the whole batch becomes unusable.
  [[noreturn]] void fail_commit(std::size_t i, const std::exception& e) {
    for (std::size_t j = 0; j < plans_.size(); ++j) {
      Plan& p = plans_[j];
      release_slots(p);
      if (j > i && p.seals) store_.erase_backed(p.seal_home, p.key(p.tail_page()));
    }
    std::string ids;
    for (std::size_t b = 0; b < in_.batch.size(); ++b) {
      c_.sequences.mark_broken(in_.batch[b]);
      ids += fmt::format("{}{}", b ? ", " : "", in_.batch[b]);
    }
    fail("attend: a policy threw while committing layer {} ({}); sequences {} are now unusable: release them", in_.layer, e.what(), ids);
  }

  Core& c_;
  Store& store_;
  std::vector<Plan>& plans_;
  StepInputs in_;
  StepAttention<Core, Store, Plan> attention_;
  PageEdit<TierList> written_;  ///< the sealed pages written, undone by abort()
  std::vector<std::uint32_t> evicted_;
  bool prepared_ = false;
};

}  // namespace kvdrive::manager
