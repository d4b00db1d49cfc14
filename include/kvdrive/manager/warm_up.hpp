// Warm-up placement (Decision 6, KvManager::warm_up): after a layer's prefill, a placement policy
// ranks each stream's candidate pages from the prompt's last queries; the top W x budget pages
// not in fast memory are read into the stream's cache at step 0, the next ones of the ranking
// are copied into the middle tiers (each tier an even share of its room per stream of the layers
// not yet warmed), and with Config::pack_by_cluster the prompt pages on the last tier are
// rewritten in cluster order. The reads and copies go through a PageEdit, so a failure undoes
// them; the caches then take their pages (a policy that throws there breaks the sequence).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <numeric>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/manager/checks.hpp"
#include "kvdrive/manager/page_edit.hpp"
#include "kvdrive/manager/page_store.hpp"
#include "kvdrive/manager/prompt_keys.hpp"
#include "kvdrive/tier/placement.hpp"

namespace kvdrive::manager {

template <class Core>
class WarmUp {
 public:
  using Store = PageStore<Core>;
  using TierList = typename Core::TierList;
  using StreamT = typename Core::StreamT;
  static constexpr std::size_t kLastTier = Core::kLastTier;

  WarmUp(Core& c, Store& store) : c_(c), store_(store), edit_(c.tiers), scratch_(store.page_bytes()) {}

  /// Warms layer `layer` of sequence `id` with observation queries q_obs; returns the pages read
  /// into the caches (KvManager::warm_up says the rest).
  template <class Placement>
  std::size_t run(SeqId id, int layer, View<const float, 3> q_obs, const Placement& placement) {
    c_.check_layer(layer);
    auto& seq = c_.sequences.usable(id);
    const int kvh = c_.cfg.shape.kv_heads;
    const std::int64_t tokens = c_.stream(seq, layer, 0).pages.tokens;
    check_observation(c_.cfg, q_obs, tokens, "warm_up");
    set_shares(layer);
    std::vector<Head> heads(static_cast<std::size_t>(kvh));
    for (int h = 0; h < kvh; ++h) {
      StreamT& st = c_.stream(seq, layer, h);
      KVD_EXPECT(st.steps == 0, "warm_up: sequence {} layer {} has already decoded; warm up after prefill", id, layer);
      Head& w = heads[static_cast<std::size_t>(h)];
      w.st = &st;
      w.base = tier::PageKey{id, static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), 0};
      w.window = c_.window_of(layer, h);
      if (c_.ranges(tokens + 1).candidates() > 0) warm_head(w, tokens, q_obs, placement);
    }
    // Commit: the pages take their slots (cannot fail), then enter the caches at step 0.
    edit_.keep();
    for (Head& w : heads) w.st->pinned = std::move(w.pinned);
    const std::size_t warmed = take_pages(heads);
    update_caches(seq, id, layer, tokens, heads);
    for (std::size_t i = 0; i < kMaxTiers; ++i) c_.total.bytes_read[i] += key_bytes_[i];
    c_.total.warmed += warmed;
    return warmed;
  }

 private:
  /// One stream's part of the call.
  struct Head {
    StreamT* st = nullptr;
    tier::PageKey base;
    int window = 0;
    std::vector<std::uint32_t> pages;  ///< chosen for the cache, ascending
    std::vector<float> scores;
    std::vector<Slot> slots;                                     ///< fresh slot per chosen page, or -1 if it already has one
    std::vector<std::pair<std::uint32_t, std::uint8_t>> placed;  ///< page, middle tier it was copied to
    std::vector<std::uint32_t> pinned;                           ///< the ranking's best pages, best first (Config::pins)
  };

  /// Semantic packing is possible: the index groups pages into clusters, and the last tier is
  /// a store read through fetches that takes batches.
  static constexpr bool kCanPack = [] {
    if constexpr (TierList::kCount == 1) {
      return false;
    } else {
      using Last = std::remove_cvref_t<decltype(std::declval<TierList&>().template get<kLastTier>())>;
      return !Last::kAddressable &&
             requires(const typename Core::Index& ix, const typename Core::Index::State& s, Last& t, std::span<const tier::WriteRequest> w) {
        { ix.cluster_of(s, std::uint32_t{0}) } -> std::convertible_to<std::uint32_t>;
        t.write_batch(w);
      };
    }
  }();

  /// Each middle tier's share per stream: its room split evenly over this layer's heads and the
  /// layers not yet placed (warm-up runs layer by layer), so every layer gets its best pages there.
  void set_shares(int layer) {
    const auto layers_left = static_cast<std::size_t>(std::max(1, c_.cfg.shape.layers - layer));
    for (std::size_t i = 1; i < kLastTier; ++i) share_[i] = store_.free_pages(i) / (layers_left * static_cast<std::size_t>(c_.cfg.shape.kv_heads));
  }

  /// Scores a stream's pages, packs them, places them below the cache and reads the chosen ones
  /// into fresh slots (all through the edit).
  template <class Placement>
  void warm_head(Head& w, std::int64_t tokens, View<const float, 3> q_obs, const Placement& placement) {
    const PageRanges r = c_.ranges(tokens + 1);
    // The bytes of the pages on the last tier, read once for scoring, kept for packing and for
    // the copies into middle tiers.
    const bool pack = kCanPack && c_.cfg.pack_by_cluster;
    last_.clear();
    read_prompt_keys(store_, c_.cfg, *w.st, w.base, tokens, keys_, scratch_.data(), key_bytes_, pack || TierList::kCount > 2 ? &last_ : nullptr);
    group_queries(c_.cfg, q_obs, static_cast<int>(w.base.head), q_);
    if (pack) packed_ += pack_by_cluster(w);
    tier::PlacementInput in;
    in.keys = keys_.data();
    in.tokens = tokens;
    in.queries = q_.data();
    in.observed = q_obs.extent(0);
    in.group = c_.cfg.group();
    in.head_dim = c_.cfg.shape.head_dim;
    in.page_tokens = c_.cfg.page_tokens;
    in.scale = c_.cfg.scale();
    const auto first = static_cast<std::uint32_t>(r.sink_end), end = static_cast<std::uint32_t>(r.local_begin);
    const tier::PageRanking ranking = placement.rank(in, first, end);
    ranking.check(first, end, Placement::name());
    if (c_.cfg.pins.enabled()) {
      // Enough for the pins' share of the budget as the stream grows to twice the prompt.
      const auto keep = static_cast<std::size_t>(c_.cfg.pins.pages_for(c_.cfg.budget.pages_for(2 * r.candidates())) + 1);
      w.pinned.assign(ranking.pages.begin(), ranking.pages.begin() + static_cast<std::ptrdiff_t>(std::min(keep, ranking.pages.size())));
    }
    const std::vector<std::pair<std::uint32_t, float>> chosen = choose(w, ranking, c_.cache_capacity(w.window, r));
    if constexpr (TierList::kCount > 2) place_in_middle_tiers(w, ranking, chosen);
    read_chosen(w, chosen);
  }

  /// The best pages of the ranking that live on a tier attended through the cache, up to its
  /// capacity, in page order.
  std::vector<std::pair<std::uint32_t, float>> choose(const Head& w, const tier::PageRanking& ranking, std::size_t capacity) const {
    std::vector<std::pair<std::uint32_t, float>> chosen;
    for (std::size_t i = 0; i < ranking.pages.size() && chosen.size() < capacity; ++i) {
      const PageEntry& e = w.st->pages[ranking.pages[i]];
      if (e.home == 0 || store_.attends_in_place(e.home)) continue;  // resident or attended in place
      chosen.emplace_back(ranking.pages[i], ranking.scores[i]);
    }
    return chosen;
  }

  /// Reads the chosen pages that have no slot into fresh ones, one batch per tier.
  void read_chosen(Head& w, std::vector<std::pair<std::uint32_t, float>> chosen) {
    std::sort(chosen.begin(), chosen.end());
    std::array<std::vector<tier::ReadRequest>, kMaxTiers> reads;
    typename Store::Staging staging;
    for (const auto& [page, score] : chosen) {
      w.pages.push_back(page);
      w.scores.push_back(score);
      w.slots.push_back(-1);
      if (w.st->pages[page].slot >= 0) continue;
      w.slots.back() = edit_.new_slot();
      tier::PageKey key = w.base;
      key.page = page;
      reads[w.st->pages[page].home].push_back({key, store_.stage(staging, w.slots.back())});
    }
    for (std::size_t t = 1; t < TierList::kCount; ++t)
      if (!reads[t].empty()) c_.tiers.visit(t, [&](auto& tier) { tier.wait(tier.submit(reads[t])); });
    typename Store::Staging* staged[] = {&staging};
    store_.land(staged);
  }

  /// Rewrites a stream's prompt pages on the last tier ordered by (cluster, page), in one batch,
  /// so that each cluster's pages take consecutive slots. Skips a stream whose clusters already
  /// follow page order. Returns the pages written. The bytes are the same, so a failure leaves
  /// every page readable as before (and nothing to undo).
  std::size_t pack_by_cluster(const Head& w) {
    if constexpr (kCanPack) {
      std::vector<std::size_t> order(last_.pages.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      const auto cluster = [&](std::size_t i) { return static_cast<std::uint32_t>(c_.index.cluster_of(w.st->index, last_.pages[i])); };
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cluster(a) < cluster(b); });
      if (std::is_sorted(order.begin(), order.end())) return 0;
      // An overwrite takes fresh slots before it frees the old ones: pack only with that room,
      // since the layout is an optimisation and warm-up must not fail for want of it.
      if (store_.free_pages(kLastTier) < last_.pages.size()) return 0;
      std::vector<tier::WriteRequest> reqs;
      reqs.reserve(order.size());
      for (std::size_t i : order) {
        tier::PageKey key = w.base;
        key.page = last_.pages[i];
        reqs.push_back({key, last_.bytes.data() + i * store_.stored_bytes()});
      }
      c_.tiers.template get<kLastTier>().write_batch(reqs);
      return reqs.size();
    } else {
      (void)w;
      return 0;
    }
  }

  /// Placement below the cache: walks the ranking past the pages chosen for the cache and copies
  /// the next ones into the middle tiers, in tier order, each up to its per-stream share, from
  /// the last tier's bytes as read. Records each copy in w.placed and the edit; homes change at
  /// commit.
  void place_in_middle_tiers(Head& w, const tier::PageRanking& ranking, const std::vector<std::pair<std::uint32_t, float>>& chosen) {
    std::vector<char> cached(w.st->pages.size(), 0);
    for (const auto& c : chosen) cached[c.first] = 1;
    std::size_t to = 1, left = share_[1];
    std::array<std::vector<tier::WriteRequest>, kMaxTiers> writes;
    for (std::uint32_t page : ranking.pages) {
      const PageEntry& e = w.st->pages[page];
      if (cached[page] || e.slot >= 0 || e.home != kLastTier) continue;
      while (left == 0 && ++to < kLastTier) left = share_[to];
      if (to >= kLastTier) break;
      const auto at = std::lower_bound(last_.pages.begin(), last_.pages.end(), page);
      KVD_EXPECT(at != last_.pages.end() && *at == page, "warm_up: page {} of the last tier was not read", page);
      tier::PageKey key = w.base;
      key.page = page;
      writes[to].push_back({key, last_.bytes.data() + static_cast<std::size_t>(at - last_.pages.begin()) * store_.stored_bytes()});
      --left;
    }
    for (std::size_t i = 1; i < kLastTier; ++i) {
      store_.write_pages(i, writes[i], edit_);
      for (const tier::WriteRequest& r : writes[i]) w.placed.emplace_back(r.key.page, static_cast<std::uint8_t>(i));
    }
  }

  /// The streams take their placed homes and their fresh slots; counts what moved. Cannot fail.
  std::size_t take_pages(std::vector<Head>& heads) noexcept {
    const std::size_t pb = store_.stored_bytes();
    c_.total.packed += packed_;
    c_.total.bytes_written[kLastTier] += packed_ * pb;
    std::size_t warmed = 0;
    for (Head& w : heads) {
      if (w.st == nullptr) continue;
      for (const auto& [page, tier_index] : w.placed) {
        w.st->pages[page].home = tier_index;
        c_.total.bytes_written[tier_index] += pb;
        ++c_.total.placed;
      }
      for (std::size_t i = 0; i < w.pages.size(); ++i)
        if (w.slots[i] >= 0) {
          w.st->pages[w.pages[i]].slot = w.slots[i];
          c_.total.bytes_read[w.st->pages[w.pages[i]].home] += pb;
          ++warmed;
        }
    }
    return warmed;
  }

  /// The chosen pages enter the caches at step 0. The policies' update() must not throw; if one
  /// does, the sequence is marked unusable (its pages, slots included, are freed by release()).
  void update_caches(typename Core::SequenceT& seq, SeqId id, int layer, std::int64_t tokens, std::vector<Head>& heads) {
    std::vector<std::uint32_t> evicted;
    std::size_t h = 0;
    try {
      for (; h < heads.size(); ++h) {
        Head& w = heads[h];
        if (w.pages.empty()) continue;
        eviction::CacheUpdate u;
        u.pages = w.pages;
        u.scores = w.scores;
        u.step = 0;
        u.window = w.window;
        u.capacity = c_.cache_capacity(u.window, c_.ranges(tokens + 1));
        c_.total.evictions += c_.update_cache(*w.st, u, evicted);
      }
    } catch (const std::exception& e) {
      seq.broken = true;
      fail("warm_up: the eviction policy threw while committing layer {} head {} ({}); sequence {} is now unusable: release it", layer, h, e.what(),
           id);
    }
  }

  Core& c_;
  Store& store_;
  PageEdit<TierList> edit_;  ///< fresh slots and middle-tier copies, undone on failure
  std::array<std::size_t, kMaxTiers> share_{};
  std::array<std::uint64_t, kMaxTiers> key_bytes_{};  ///< pages read back to score their keys
  std::size_t packed_ = 0;
  std::vector<float> keys_, q_;
  std::vector<std::byte> scratch_;
  LastTierPages last_;
};

}  // namespace kvdrive::manager
