// StepPlan: everything one stream's decode step needs, filled stage by stage (manager/step.hpp),
// and PendingReads, the handle of a fetched range's reads in flight, which owns their tickets.
// A plan lives in a buffer the manager reuses step after step, so its vectors keep their room.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <utility>
#include <vector>

#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/core/page_ranges.hpp"
#include "kvdrive/core/page_table.hpp"
#include "kvdrive/manager/focus_carry.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/page_key.hpp"

namespace kvdrive::manager {

/// Reads submitted to the backing tiers for one fetched range: a ticket per tier. wait() waits
/// for every one and returns the first error; the destructor waits too, so no read is left in
/// flight into memory that is about to be freed.
template <class TierList>
class PendingReads {
 public:
  PendingReads() = default;
  PendingReads(PendingReads&& o) noexcept : tiers_(o.tiers_), tickets_(std::exchange(o.tickets_, {})) {}
  PendingReads& operator=(PendingReads&&) = delete;
  ~PendingReads() { (void)wait(); }

  /// Submits `reads` to tier `tier_index` and keeps the ticket.
  void submit(TierList& tiers, std::size_t tier_index, std::span<const tier::ReadRequest> reads) {
    tiers_ = &tiers;
    tickets_.reserve(tickets_.size() + 1);  // recording the ticket must not fail
    const tier::ReadTicket t = tiers.visit(tier_index, [&](auto& tr) { return tr.submit(reads); });
    tickets_.emplace_back(static_cast<std::uint8_t>(tier_index), t);
  }

  /// Waits for every read; returns the first error, or null.
  std::exception_ptr wait() noexcept {
    std::exception_ptr error;
    for (const auto& pending : std::exchange(tickets_, {})) {
      try {
        tiers_->visit(pending.first, [&](auto& tr) { tr.wait(pending.second); });
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    return error;
  }

 private:
  TierList* tiers_ = nullptr;
  std::vector<std::pair<std::uint8_t, tier::ReadTicket>> tickets_;
};

template <class StreamT, class Staging, class TierList>
struct StepPlan {
  StreamT* stream = nullptr;
  tier::PageKey base;  ///< sequence, layer, head of this stream
  std::size_t batch_index = 0;
  int head = 0;
  PageRanges ranges;     ///< with the new token counted
  Slot new_tail = -1;    ///< slot opened for the new token's page, if it starts one
  std::vector<float> q;  ///< [group][head_dim]
  std::vector<std::uint32_t> selected;
  CarryMerge merge;                 ///< joins the stream's carried pages with the index's selection
  std::vector<std::uint32_t> kept;  ///< the stream's pinned and carried pages this step keeps (kept_pages)
  std::vector<std::uint32_t> misses;
  std::vector<Slot> staged;  ///< fast slot holding each miss, in misses order
  /// For the range of streams this one starts (fetch_start): its staging pages and its reads.
  Staging staging;
  PendingReads<TierList> reads;
  std::vector<attention::PageRef> refs;
  std::vector<float> out, lse, page_lse;
  /// Split-KV (attention::kSplitPages): the attended page ids (sink, selected, local), each
  /// split's output and log-sum-exp, and which splits are done (compute_ready may do some
  /// before the misses arrive).
  std::vector<std::uint32_t> attended;
  std::vector<float> split_out, split_lse;
  std::vector<std::uint8_t> split_done;
  std::vector<std::uint32_t> through_cache;  ///< selected pages that use the cache
  std::vector<float> cache_scores;
  std::uint64_t hits = 0, in_place = 0;
  std::vector<float> seal_keys;  ///< keys of the page this step seals, as float
  std::uint8_t seal_home = 0;
  bool seals = false;

  /// The fast slot of the page the new token goes to.
  Slot tail_slot() const { return new_tail >= 0 ? new_tail : stream->pages.back().slot; }
  /// The page this step seals (when `seals`).
  std::uint32_t tail_page() const { return static_cast<std::uint32_t>(ranges.pages - 1); }
  tier::PageKey key(std::uint32_t page) const {
    tier::PageKey k = base;
    k.page = page;
    return k;
  }

  /// Ready for a new step (the vectors keep their room).
  void reset() {
    new_tail = -1;
    selected.clear();
    misses.clear();
    staged.clear();
    refs.clear();
    attended.clear();
    split_done.clear();
    through_cache.clear();
    cache_scores.clear();
    hits = in_place = 0;
    seal_home = 0;
    seals = false;
  }
};

}  // namespace kvdrive::manager
