// The state of a KvManager as one plain struct (public members, no invariants of its own), and
// the table of its sequences.
//   Core<...>       config, policies, tiers, backend, remote tier, window plan, statistics and
//                   sequences; the units of manager/ (prefill, warm_up, step, tuning, prefix
//                   sharing) each take it by reference and the facade (manager.hpp) owns it
//   SequenceTable   add, find, usable, mark broken, release; ids are never reused
//   Stream          one (layer, KV head) of a sequence: page table, index and cache states
// Small queries every unit asks (a stream's window W, its cache capacity, the index's view of
// some keys, updating a cache, building or extending an index) live here, written once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/backend/concept.hpp"
#include "kvdrive/core/config.hpp"
#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/page_ranges.hpp"
#include "kvdrive/core/page_table.hpp"
#include "kvdrive/core/stats.hpp"
#include "kvdrive/eviction/concept.hpp"
#include "kvdrive/eviction/window_plan.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/page_key.hpp"
#include "kvdrive/tier/page_pool.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive {

using SeqId = std::uint64_t;

namespace manager {

/// Cache-size tuning during the first decode steps (KvManager::grow_windows, manager/tuning.hpp).
struct WindowGrowth {
  int max_window = 8;  ///< W never grows past this
  int steps = 16;      ///< decode steps per layer during which W may grow
};

/// One (layer, KV head) of a sequence.
template <class Index, class Eviction>
struct Stream {
  PageTable pages;
  std::uint64_t steps = 0;  ///< decode steps done
  typename Index::State index;
  typename Eviction::State cache;
  std::vector<std::uint32_t> carried;  ///< pages the last step attended heavily, heaviest first (Config::carry)
  std::vector<std::uint32_t> pinned;   ///< the prompt's observation ranking's best pages, best first (Config::pins)
  std::vector<std::byte> tail_host;    ///< device fast tier: the tail page's bytes, in host memory
};

template <class StreamT>
struct Sequence {
  std::optional<PrefixDigest> digest;
  std::vector<PrefixDigest> shared_chain;  ///< content keys of the leading pages shared on the remote tier (manager/prefix_share.hpp)
  std::uint32_t loaded_pages = 0;          ///< of those, pages load_prefix() read from it
  bool broken = false;                     ///< a policy threw after a point of no return; only release() works
  std::vector<StreamT> streams;            ///< [layer][kv_head]
};

/// The sequences of a manager by id. Ids start at 1 and are never reused, so a released id is
/// told apart from one never issued; adopt() takes an id issued elsewhere (a sequence whose pages
/// outlived the manager that wrote them) and keeps later ids above it.
template <class Seq>
class SequenceTable {
 public:
  /// A fresh sequence and its id.
  std::pair<SeqId, Seq&> add() {
    const SeqId id = next_id_++;
    return {id, sequences_[id]};
  }
  /// Takes `id` for a sequence created outside this table; it must not be in use.
  Seq& adopt(SeqId id) {
    KVD_EXPECT(id != 0 && !sequences_.contains(id), "sequence {} is already in use (or 0)", id);
    next_id_ = std::max(next_id_, id + 1);
    return sequences_[id];
  }

  const Seq& find(SeqId id) const {
    auto it = sequences_.find(id);
    if (it != sequences_.end()) return it->second;
    if (id < next_id_) fail("sequence {} was released and cannot be used again", id);
    fail("unknown sequence {} (add_sequence returns the ids)", id);
  }
  Seq& find(SeqId id) { return const_cast<Seq&>(std::as_const(*this).find(id)); }

  /// The sequence, if no failed commit has made it unusable.
  Seq& usable(SeqId id) {
    Seq& s = find(id);
    KVD_EXPECT(!s.broken, "sequence {} is unusable after a failed commit: release it", id);
    return s;
  }
  void mark_broken(SeqId id) { find(id).broken = true; }
  void erase(SeqId id) { sequences_.erase(id); }

  std::vector<SeqId> ids() const {
    std::vector<SeqId> out;
    for (const auto& [id, s] : sequences_) out.push_back(id);
    return out;
  }
  std::size_t size() const { return sequences_.size(); }
  auto begin() const { return sequences_.begin(); }
  auto end() const { return sequences_.end(); }

 private:
  std::unordered_map<SeqId, Seq> sequences_;
  SeqId next_id_ = 1;
};

template <class IndexT, class EvictionT, class TierListT, class PipelineT, class BackendT, class RemoteT>
struct Core {
  using Index = IndexT;
  using Eviction = EvictionT;
  using TierList = TierListT;
  using Pipeline = PipelineT;
  using Backend = BackendT;
  using Remote = RemoteT;
  using Fast = typename TierList::template Type<0>;
  using StreamT = Stream<Index, Eviction>;
  using SequenceT = Sequence<StreamT>;

  /// The fast tier is device memory (cuda::DeviceTier): the host moves its bytes only through
  /// upload/download, and the backend attends it (manager/page_store.hpp makes the choice).
  static constexpr bool kDeviceFast = tier::DeviceFastTier<Fast>;
  static constexpr bool kRemote = !std::is_same_v<Remote, tier::NoRemote>;
  static constexpr std::size_t kLastTier = TierList::kCount - 1;

  Core(Config c, Index i, Eviction e, TierList t, Pipeline p, Backend b)
      : cfg(std::move(c)), index(std::move(i)), eviction(std::move(e)), tiers(std::move(t)), pipeline(std::move(p)), backend(std::move(b)) {}
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  Config cfg;
  Index index;
  Eviction eviction;
  /// Device fast tier: pinned host pages that misses are read into before their upload. Declared
  /// before tiers so that it outlives them (the fast tier unpins it when it closes).
  tier::PagePool bounce;
  TierList tiers;
  Pipeline pipeline;
  Backend backend;
  [[no_unique_address]] std::conditional_t<kRemote, Remote*, tier::NoRemote> remote{};
  SequenceTable<SequenceT> sequences;
  std::optional<eviction::WindowPlan> plan;
  std::optional<WindowGrowth> growth;
  std::vector<int> growth_steps, growth_grown;  ///< per layer: steps seen, times grown
  Stats last, total;

  void check_layer(int layer) const { KVD_EXPECT(layer >= 0 && layer < cfg.shape.layers, "layer {} out of range [0, {})", layer, cfg.shape.layers); }
  void check_head(int head) const { KVD_EXPECT(head >= 0 && head < cfg.shape.kv_heads, "KV head {} out of range [0, {})", head, cfg.shape.kv_heads); }

  StreamT& stream(SequenceT& s, int layer, int head) const { return s.streams[static_cast<std::size_t>(layer) * cfg.shape.kv_heads + head]; }
  const StreamT& stream(const SequenceT& s, int layer, int head) const {
    check_head(head);
    return s.streams[static_cast<std::size_t>(layer) * cfg.shape.kv_heads + head];
  }

  /// The sink / candidate / local split of a stream of `tokens` tokens.
  PageRanges ranges(std::int64_t tokens) const { return page_ranges(tokens, cfg.page_tokens, cfg.sink_tokens, cfg.local_tokens); }

  /// The window W of a stream: the plan's, else the policy's.
  int window_of(int layer, int head) const { return plan ? plan->window(layer, head) : std::max(0, eviction.default_window()); }

  /// W x the budget of a step with these ranges.
  std::size_t cache_capacity(int window, const PageRanges& r) const {
    return static_cast<std::size_t>(std::max(0, window)) * static_cast<std::size_t>(cfg.budget.pages_for(r.candidates()));
  }

  /// The index's view of n consecutive pages' keys (as float), starting at page `first`.
  index::PageKeys page_keys_view(std::uint32_t first, std::int64_t n, const std::vector<float>& keys) const {
    index::PageKeys pk;
    pk.data = keys.data();
    pk.first_page = first;
    pk.pages = n;
    pk.page_tokens = cfg.page_tokens;
    pk.head_dim = cfg.shape.head_dim;
    pk.dtype = cfg.dtype;
    return pk;
  }

  /// Builds the stream's index from its first sealed pages, or extends it with later ones. May
  /// throw only if the index policy does (callers treat that as a broken sequence).
  void index_pages(StreamT& st, const index::PageKeys& keys) {
    if (keys.first_page == 0) index.build(st.index, keys);
    else index.append(st.index, keys);
  }

  /// Gives the eviction policy a step's scores and frees the fast slots of the pages it evicts;
  /// returns how many it evicted (`evicted` is scratch).
  std::size_t update_cache(StreamT& st, const eviction::CacheUpdate& u, std::vector<std::uint32_t>& evicted) {
    evicted.clear();
    eviction.update(st.cache, u, evicted);
    for (std::uint32_t page : evicted) {
      PageEntry& e = st.pages[page];
      if (e.slot >= 0) tiers.fast().release(e.slot);
      e.slot = -1;
    }
    return evicted.size();
  }

  /// Frees the fast slots of backed pages that left the local window for the next step and are
  /// not cached. Sink pages and pages with no backing tier keep their slots; the latter turn
  /// cold here, once: cool(slot) gives them their cold codec's values (PageStore::cool).
  template <class Cool>
  void slide_local_window(StreamT& st, Cool&& cool) {
    const PageRanges next = ranges(st.pages.tokens + 1);
    for (std::int64_t page = std::max(st.pages.released_below, next.sink_end); page < next.local_begin; ++page) {
      PageEntry& e = st.pages[static_cast<std::size_t>(page)];
      if (e.home == 0 && e.slot >= 0) cool(e.slot);
      if (e.home == 0 || e.slot < 0 || eviction.contains(st.cache, static_cast<std::uint32_t>(page))) continue;
      tiers.fast().release(e.slot);
      e.slot = -1;
    }
    st.pages.released_below = std::max(st.pages.released_below, next.local_begin);
  }
};

}  // namespace manager
}  // namespace kvdrive
