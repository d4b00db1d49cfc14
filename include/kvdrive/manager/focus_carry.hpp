// Focus carry (Config::carry): the pages a stream's previous step attended heavily stay selected.
// After compute, carried_pages() picks the selected pages that held at least carry.mass of one of
// the group's query heads, heaviest first; at the next step CarryMerge joins them (at most
// floor(share x budget)) with the index's own selection so that the step selects exactly the
// budget wherever the index can make it so:
//   1. ask the index for the whole budget k; if it already holds the carried pages, done (so an
//      index that selects more than asked, as Dense does, is left as it is);
//   2. else ask for k - e, e being how far the union overshot; an index whose top sets are nested
//      (every one that scores all candidates) now gives exactly k;
//   3. else ask for k - |carried|, which can never overshoot.
// Every step is a function of the stream's own previous attention and the index, so the output is
// the same bits whatever the cache, tiers, pipeline or thread count (Decision 2). The observation
// pins (Config::pins: the warm-up ranking's best pages, fixed after prefill) join the merge the
// same way, before the carried pages (kept_pages).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <utility>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/index/concept.hpp"

namespace kvdrive::manager {

/// The pages of `selected` (ascending) that held at least `rule.mass` of some query head's
/// attention, heaviest first (ties: lower page first), into `out`. page_lse holds `group` values
/// per selected page (the per-page log-sum-exp of the attention, Decision 2), lse the group's
/// totals.
inline void carried_pages(const FocusCarry& rule, std::span<const std::uint32_t> selected, const float* page_lse, std::span<const float> lse,
                          std::vector<std::uint32_t>& out) {
  out.clear();
  if (!rule.enabled()) return;
  const std::size_t g = lse.size();
  // In log space (a page's mass is exp(page_lse - lse)): no exponential per page and head on the
  // commit path, the same order.
  const float log_mass = std::log(rule.mass);
  thread_local std::vector<std::pair<float, std::uint32_t>> heavy;
  heavy.clear();
  for (std::size_t i = 0; i < selected.size(); ++i) {
    float m = -INFINITY;
    for (std::size_t h = 0; h < g; ++h) m = std::max(m, page_lse[i * g + h] - lse[h]);
    if (m >= log_mass) heavy.emplace_back(m, selected[i]);
  }
  std::sort(heavy.begin(), heavy.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (const auto& [m, page] : heavy) out.push_back(page);
}

/// One stream's merge of its carried pages with the index's selection over a step (see the top
/// of this file). start() says how many pages to ask the index for first; take() gets each
/// answer and says whether to ask again (ask() pages); result() is the step's selection.
class CarryMerge {
 public:
  /// `carried`: the stream's carried pages, heaviest first (pages outside the query's candidates
  /// are skipped). Returns false when nothing is carried: the index's answer is the selection.
  bool start(const FocusCarry& rule, std::span<const std::uint32_t> carried, const index::IndexQuery& q) {
    k_ = q.budget_pages;
    attempt_ = 0;
    carried_.clear();
    best_.clear();
    const std::int64_t cap = std::min(rule.pages_for(k_), q.candidates());
    for (std::uint32_t page : carried) {
      if (static_cast<std::int64_t>(carried_.size()) >= cap) break;
      if (page >= q.first_candidate && page < q.end_candidate) carried_.push_back(page);
    }
    std::sort(carried_.begin(), carried_.end());
    ask_ = k_;
    return !carried_.empty() && k_ < q.candidates();  // a budget of every candidate has room for all
  }

  std::int64_t ask() const { return ask_; }

  /// The index's answer to ask() pages (ascending). Returns true when another ask is needed.
  bool take(std::span<const std::uint32_t> selection) {
    ++attempt_;
    merged_.clear();
    std::set_union(selection.begin(), selection.end(), carried_.begin(), carried_.end(), std::back_inserter(merged_));
    const auto size = static_cast<std::int64_t>(merged_.size());
    if (merged_.size() == selection.size()) {  // the index chose every carried page itself
      best_ = merged_;
      return false;
    }
    if (size <= k_ && size > static_cast<std::int64_t>(best_.size())) best_ = merged_;
    if (size == k_ || attempt_ == 3) {
      if (best_.empty()) best_ = merged_;  // an index that answers more than it is asked for
      return false;
    }
    if (attempt_ == 1) {
      ask_ = k_ - (size - k_);  // size > k: the carried pages it lacked
    } else {
      if (size < k_) return false;                             // nearly the budget: keep it
      ask_ = k_ - static_cast<std::int64_t>(carried_.size());  // cannot overshoot
    }
    return true;
  }

  /// The step's selection (ascending, at most the budget).
  std::vector<std::uint32_t>& result() { return best_; }

 private:
  std::int64_t k_ = 0, ask_ = 0;
  int attempt_ = 0;
  std::vector<std::uint32_t> carried_, merged_, best_;
};

/// The pages a step keeps before the index chooses (CarryMerge's `carried`), into `out`: the
/// stream's observation pins within q's candidates, at most pins.pages_for(budget), then its
/// carried pages, at most carry.pages_for(budget), none twice. Returns the rule whose cap covers
/// both (the carry's, with the two shares added), which CarryMerge::start takes.
inline FocusCarry kept_pages(const FocusCarry& carry, const ObservationPins& pins, std::span<const std::uint32_t> pinned,
                             std::span<const std::uint32_t> carried, const index::IndexQuery& q, std::vector<std::uint32_t>& out) {
  out.clear();
  if (!pins.enabled() || pinned.empty()) {
    out.assign(carried.begin(), carried.end());
    return carry;
  }
  const auto take = [&](std::span<const std::uint32_t> pages, std::int64_t cap) {
    std::int64_t n = 0;
    for (std::uint32_t page : pages) {
      if (n >= cap) break;
      if (page < q.first_candidate || page >= q.end_candidate || std::find(out.begin(), out.end(), page) != out.end()) continue;
      out.push_back(page);
      ++n;
    }
  };
  take(pinned, pins.pages_for(q.budget_pages));
  if (carry.enabled()) take(carried, carry.pages_for(q.budget_pages));
  FocusCarry rule = carry;
  rule.share = carry.share + pins.share;
  return rule;
}

/// The step's selection for query q into out: select(query, out) alone when nothing is carried,
/// else the rounds of `merge` (select is asked each time with the count it names).
template <class Select>
void select_with_carry(CarryMerge& merge, const FocusCarry& rule, std::span<const std::uint32_t> carried, const index::IndexQuery& q,
                       std::vector<std::uint32_t>& out, Select&& select) {
  if (!merge.start(rule, carried, q)) {
    select(q, out);
    return;
  }
  index::IndexQuery ask = q;
  do {
    out.clear();
    ask.budget_pages = merge.ask();
    select(ask, out);
  } while (merge.take(out));
  out.swap(merge.result());
}

}  // namespace kvdrive::manager
