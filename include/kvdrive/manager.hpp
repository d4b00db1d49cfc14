// KvManager: the KV cache of many sequences across the tiers, with sparse decode attention.
// An engine calls it once per layer per decode step in place of its attention:
//
//   auto id = kv.add_sequence(digest);             // optional prefix digest (Decision 10)
//   kv.prefill(id, layer, K, V);                   // per layer: the prompt's keys and values
//   kv.attend(layer, batch, q, k, v, out);         // per layer per step: append + attend
//   kv.release(id);
//
// With a remote tier (Remote = tier::RedisTier, share_prefixes()), engines share the pages of a
// common prompt prefix: prefill publishes the prefix's pages, and load_prefix() lets another
// engine read them instead of computing them (docs/remote.md).
//
// attend() fills one StepPlan per stream (sequence x KV head) and runs the five stages of
// Decision 1 through the Pipeline policy. Before commit() the stages only read shared state and
// write plan-local buffers, fresh slots, and the new token's row of the tail page (past the
// stream's token count, so invisible). commit() does its fallible work (writing sealed pages)
// first, then applies; a step that fails before that point changes nothing (Decision 8). Not
// thread-safe: one caller at a time.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/attention/convert.hpp"
#include "kvdrive/attention/math.hpp"
#include "kvdrive/attention/sparse_decode.hpp"
#include "kvdrive/backend/concept.hpp"
#include "kvdrive/backend/cpu.hpp"
#include "kvdrive/core/config.hpp"
#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/page_ranges.hpp"
#include "kvdrive/core/page_table.hpp"
#include "kvdrive/core/stats.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/eviction/concept.hpp"
#include "kvdrive/eviction/window_plan.hpp"
#include "kvdrive/index/cluster_size.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/pipeline/concept.hpp"
#include "kvdrive/pipeline/serial.hpp"
#include "kvdrive/tier/host.hpp"
#include "kvdrive/tier/placement.hpp"
#include "kvdrive/tier/remote.hpp"
#include "kvdrive/tier/tiers.hpp"

namespace kvdrive {

using SeqId = std::uint64_t;

template <index::IndexPolicy Index, eviction::EvictionPolicy Eviction,
          class TierList = Tiers<tier::HostTier>, pipeline::PipelinePolicy Pipeline = pipeline::Serial,
          class Backend = backend::Cpu, class Remote = tier::NoRemote>
class KvManager {
  using Fast = typename TierList::template Type<0>;
  /// The fast tier is device memory (cuda::DeviceTier): the host moves its bytes only through
  /// upload/download, and the backend attends it.
  static constexpr bool kDeviceFast = tier::DeviceFastTier<Fast>;
  static_assert(backend::Backend<Backend>, "KvManager: the backend needs parallel_for(n, fn)");
  static_assert(std::is_nothrow_move_constructible_v<typename Index::State> &&
                    std::is_nothrow_move_constructible_v<typename Eviction::State>,
                "KvManager: the index's and the eviction policy's State must move without throwing (they live in vectors "
                "that grow); use std::vector rather than std::deque, or give the State a noexcept move constructor");
  static_assert(kDeviceFast == backend::DeviceBackend<Backend>,
                "KvManager: a fast tier in device memory (cuda::DeviceTier) needs a backend that attends it "
                "(backend::Cuda), and such a backend needs a device fast tier");
  static constexpr bool kRemote = !std::is_same_v<Remote, tier::NoRemote>;
  static_assert(!kRemote || tier::RemoteTier<Remote>,
                "KvManager: the Remote parameter must be a tier::RemoteTier (tier::RedisTier) or tier::NoRemote");

 public:

  explicit KvManager(Config config, Index index = {}, Eviction eviction = {}, TierList tiers = {},
                     Pipeline pipeline = {}, Backend backend = {})
      : cfg_(std::move(config)),
        index_(std::move(index)),
        eviction_(std::move(eviction)),
        tiers_(std::move(tiers)),
        pipeline_(std::move(pipeline)),
        backend_(std::move(backend)) {
    cfg_.validate();
    index::check_for_head_dim(index_, cfg_.shape.head_dim);
    if constexpr (requires { backend_.validate(cfg_); }) backend_.validate(cfg_);  // e.g. the CUDA kernels' limits
    if constexpr (requires { tiers_.fast().device(); backend_.device(); })
      KVD_EXPECT(tiers_.fast().device() == backend_.device(), "KvManager: the fast tier is on device {} but the backend on device {}",
                 tiers_.fast().device(), backend_.device());
    if constexpr (requires { tiers_.fast().device(); index_.device; })
      KVD_EXPECT(tiers_.fast().device() == index_.device, "KvManager: the fast tier is on device {} but the index selects on device {}",
                 tiers_.fast().device(), index_.device);
    register_fast_memory();
    tiers_.open(tier::TierGeometry{cfg_.page_bytes()});
  }

  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  ~KvManager() {
    std::vector<SeqId> ids;
    for (auto& [id, s] : sequences_) ids.push_back(id);
    for (SeqId id : ids) release(id);
  }

  // ---- sequences -----------------------------------------------------------------------------

  /// Starts a sequence; `digest` identifies its prompt prefix for content-addressed tiers.
  SeqId add_sequence(std::optional<PrefixDigest> digest = std::nullopt) {
    const SeqId id = next_id_++;
    Sequence& s = sequences_[id];
    s.digest = digest;
    s.streams.resize(static_cast<std::size_t>(cfg_.shape.layers) * cfg_.shape.kv_heads);
    if (kRemote && digest && digest->tokens >= cfg_.page_tokens) {
      s.shared_pages = static_cast<std::uint32_t>(std::min<std::int64_t>(digest->tokens / cfg_.page_tokens, UINT32_MAX));
      s.shared_digest = remote_digest(*digest);
    }
    return id;
  }

  // ---- sharing prefixes through a remote tier ------------------------------------------------

  /// Shares prompt prefixes through `remote` (kept by the caller; it must outlive the manager):
  /// from now on, a sequence added with a PrefixDigest covering `tokens` tokens publishes the
  /// pages wholly inside those tokens as prefill seals them, and load_prefix() reads them. The
  /// keys mix the digest with this manager's layout (shape, page size, dtype), so managers that
  /// lay pages out differently never share. The remote tier is never the only copy of a page:
  /// every page is also on this manager's own tiers.
  void share_prefixes(Remote& remote)
    requires kRemote
  {
    if constexpr (requires { remote.params().model; })
      KVD_EXPECT(remote.params().model.low != 0 || remote.params().model.high != 0,
                 "share_prefixes: the remote tier has no model digest (Params::model): pages of different models would meet");
    remote.open(tier::TierGeometry{cfg_.page_bytes()});
    remote_ = &remote;
  }

  /// What load_prefix() did.
  struct PrefixLoad {
    std::uint32_t pages_found = 0;   ///< leading pages the remote tier listed for every stream
    std::uint32_t pages_loaded = 0;  ///< of those, pages read and verified for every stream
    std::int64_t tokens = 0;         ///< tokens now in every layer (pages_loaded x page_tokens)
  };

  /// Before a sequence's prefill: reads the longest run of its prefix's leading pages that the
  /// remote tier holds for every layer and head (at most max_tokens tokens, and within its
  /// PrefixDigest), and prefills every layer with them, so the engine computes only the tokens
  /// after result.tokens. `chunk` is the engine's prefill chunk (tokens per prefill call): the
  /// run is prefilled in such chunks and cut to a whole number of them, so the engine's own
  /// chunks then fall where they would have, and an index that depends on the chunks
  /// (Hierarchical re-clusters as prefill grows it) comes out exactly as if the engine had
  /// computed everything: same index, same output bits. on_layer(layer, k, v) gets each
  /// layer's loaded K and V as float [tokens][kv_heads][head_dim] (the engine's prefill
  /// attention needs them). A page the server lacks, fails to send, or sends corrupt ends the
  /// run there: it and the rest are computed as usual, and the tier's remote_stats() count why.
  /// Loads nothing without a remote tier or a digest. Holds the run's pages in host memory
  /// while it reads them. The server's trouble never throws; a local failure while prefilling
  /// the run does, as prefill() does, and may leave some layers holding it: release the sequence.
  template <class OnLayer>
  PrefixLoad load_prefix(SeqId id, std::int64_t max_tokens, std::int64_t chunk, OnLayer&& on_layer)
    requires kRemote
  {
    KVD_EXPECT(chunk >= 1 && chunk <= (std::int64_t{1} << 30), "load_prefix: chunk {} must be in 1..2^30 (the engine's tokens per prefill call)",
               chunk);
    Sequence& seq = usable_sequence(id);
    for (int l = 0; l < cfg_.shape.layers; ++l)
      KVD_EXPECT(length(id, l) == 0, "load_prefix: sequence {} layer {} already holds {} tokens; load the prefix first", id, l,
                 length(id, l));
    PrefixLoad r;
    if (remote_ == nullptr || seq.shared_pages == 0 || max_tokens < cfg_.page_tokens) return r;
    const int layers = cfg_.shape.layers, kvh = cfg_.shape.kv_heads, pt = cfg_.page_tokens, d = cfg_.shape.head_dim;
    // Runs are cut to whole chunks (which are whole pages too) before anything is read.
    const std::int64_t unit = std::lcm<std::int64_t>(chunk, pt);
    const auto cut = [&](std::int64_t pages) { return static_cast<std::uint32_t>(pages * pt / unit * unit / pt); };
    const std::uint32_t max_pages = cut(std::min<std::int64_t>(seq.shared_pages, max_tokens / pt));
    if (max_pages == 0) return r;
    r.pages_found = std::min(max_pages, remote_->lookup(seq.shared_digest, static_cast<std::uint32_t>(layers), static_cast<std::uint32_t>(kvh), max_pages));
    const std::uint32_t want = cut(r.pages_found);
    if (want == 0) return r;
    // Every layer's reads are queued at once; the run is what every stream read and verified.
    const std::size_t pb = cfg_.page_bytes(), per_layer = static_cast<std::size_t>(kvh) * want;
    std::vector<std::byte> bytes(static_cast<std::size_t>(layers) * per_layer * pb);
    std::vector<tier::ReadTicket> tickets;
    tickets.reserve(static_cast<std::size_t>(layers));
    std::vector<tier::ReadRequest> reads(per_layer);
    std::vector<tier::RemoteRead> outcome(per_layer);
    // Reads in flight write into `bytes`: if anything throws before they are waited for, wait
    // for them on the way out.
    std::size_t waited = 0;
    struct WaitOnUnwind {
      Remote& remote;
      std::vector<tier::ReadTicket>& tickets;
      std::size_t& waited;
      std::vector<tier::RemoteRead>& outcome;
      ~WaitOnUnwind() {
        for (; waited < tickets.size(); ++waited) try {
            remote.wait_each(tickets[waited], outcome);
          } catch (...) {
          }
      }
    } guard{*remote_, tickets, waited, outcome};
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kvh; ++h)
        for (std::uint32_t p = 0; p < want; ++p) {
          const std::size_t i = static_cast<std::size_t>(h) * want + p;
          reads[i] = {tier::PageKey{id, static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(h), p},
                      bytes.data() + (static_cast<std::size_t>(l) * per_layer + i) * pb};
        }
      tickets.push_back(remote_->submit(seq.shared_digest, reads));
    }
    std::uint32_t run = want;
    for (int l = 0; l < layers; ++l) {
      remote_->wait_each(tickets[static_cast<std::size_t>(l)], outcome);
      waited = static_cast<std::size_t>(l) + 1;
      for (int h = 0; h < kvh; ++h)
        for (std::uint32_t p = 0; p < run; ++p)
          if (outcome[static_cast<std::size_t>(h) * want + p] != tier::RemoteRead::hit) run = p;
    }
    run = cut(run);
    r.pages_loaded = run;
    r.tokens = static_cast<std::int64_t>(run) * pt;
    if (run == 0) return r;
    // Prefill from the pages: float is exact for every KV dtype, so the stored bytes come out the
    // same as the publisher's, and the index sees the same keys.
    seq.loaded_pages = run;  // prefill need not publish them again
    std::vector<float> k(static_cast<std::size_t>(r.tokens) * kvh * d), v(k.size()), row(static_cast<std::size_t>(pt) * d);
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kvh; ++h)
        for (std::uint32_t p = 0; p < run; ++p) {
          const std::byte* page = bytes.data() + (static_cast<std::size_t>(l) * per_layer + static_cast<std::size_t>(h) * want + p) * pb;
          for (int half = 0; half < 2; ++half) {
            dispatch_dtype(cfg_.dtype, [&](auto tag) {
              using T = typename decltype(tag)::type;
              attention::to_float_block(reinterpret_cast<const T*>(page + half * cfg_.block_bytes()), row.data(), row.size());
            });
            std::vector<float>& dst = half == 0 ? k : v;
            for (int t = 0; t < pt; ++t)
              std::copy_n(row.data() + static_cast<std::size_t>(t) * d, d,
                          dst.data() + ((static_cast<std::size_t>(p) * pt + t) * kvh + h) * d);
          }
        }
      const auto kv = make_view(std::as_const(k).data(), r.tokens, kvh, d), vv = make_view(std::as_const(v).data(), r.tokens, kvh, d);
      for (std::int64_t t0 = 0; t0 < r.tokens; t0 += chunk) {
        const std::int64_t n = std::min(chunk, r.tokens - t0);
        const std::size_t at = static_cast<std::size_t>(t0) * kvh * d;
        prefill(id, l, make_view(kv.data + at, n, kvh, d), make_view(vv.data + at, n, kvh, d));
      }
      on_layer(l, kv, vv);
    }
    return r;
  }
  PrefixLoad load_prefix(SeqId id, std::int64_t max_tokens, std::int64_t chunk)
    requires kRemote
  {
    return load_prefix(id, max_tokens, chunk, [](int, View<const float, 3>, View<const float, 3>) {});
  }

  /// Frees every page of the sequence in every tier. The id may not be used again.
  void release(SeqId id) {
    Sequence& s = sequence(id);
    for (std::size_t i = 0; i < s.streams.size(); ++i) {
      Stream& st = s.streams[i];
      const auto layer = static_cast<std::uint32_t>(i / cfg_.shape.kv_heads);
      const auto head = static_cast<std::uint32_t>(i % cfg_.shape.kv_heads);
      for (std::size_t p = 0; p < st.pages.size(); ++p) {
        const PageEntry& e = st.pages[p];
        if (e.slot >= 0) tiers_.fast().release(e.slot);
        erase_backed(e.home, tier::PageKey{id, layer, head, static_cast<std::uint32_t>(p)});
      }
    }
    sequences_.erase(id);  // its shared pages stay on the remote tier, for other engines
    // Make the erases durable where a tier defers them (SsdTier), so their room is usable.
    for (std::size_t i = 1; i < TierList::kCount; ++i)
      tiers_.visit(i, [](auto& t) {
        if constexpr (requires { t.sync(); }) {
          try {
            t.sync();
          } catch (...) {  // the erases stay pending; the store stays correct
          }
        }
      });
  }

  std::optional<PrefixDigest> prefix_digest(SeqId id) const { return sequence(id).digest; }
  /// The digest that addresses the sequence's shared pages on a remote tier (its prefix digest
  /// mixed with this manager's page layout), if it shares any.
  std::optional<PrefixDigest> shared_digest(SeqId id) const {
    const Sequence& s = sequence(id);
    return s.shared_pages > 0 ? std::optional<PrefixDigest>(s.shared_digest) : std::nullopt;
  }

  /// Tokens stored for one layer of a sequence (prefill plus decoded).
  std::int64_t length(SeqId id, int layer) const {
    check_layer(layer);
    return sequence(id).streams[static_cast<std::size_t>(layer) * cfg_.shape.kv_heads].pages.tokens;
  }

  // ---- prefill -------------------------------------------------------------------------------

  /// Appends prompt tokens of one layer: k and v are [tokens][kv_heads][head_dim] floats, stored
  /// in the KV dtype. May be called in chunks, before the layer's first attend().
  void prefill(SeqId id, int layer, View<const float, 3> k, View<const float, 3> v) {
    check_layer(layer);
    Sequence& seq = usable_sequence(id);
    check_kv_view(k, "prefill: k", -1);
    check_kv_view(v, "prefill: v", -1);
    KVD_EXPECT(k.extent(0) == v.extent(0), "prefill: k has {} tokens but v has {}", k.extent(0),
               v.extent(0));
    const std::int64_t n = k.extent(0);
    const int kvh = cfg_.shape.kv_heads, pt = cfg_.page_tokens;
    for (int h = 0; h < kvh; ++h)
      KVD_EXPECT(stream(seq, layer, h).steps == 0,
                 "prefill: sequence {} layer {} has already decoded; prefill comes first", id, layer);
    if (n == 0) return;

    // Fallible part: fill fresh slots, write sealed pages to their backing tier.
    struct HeadWork {
      std::vector<Slot> new_slots;        // slots of pages this call opens
      std::vector<std::byte> host;        // device fast tier: the pages this call writes, in host memory
      std::vector<std::byte> tail;        // device fast tier: the new tail page's bytes, if partial
      std::vector<std::uint32_t> sealed;  // pages this call seals
      std::vector<std::uint8_t> sealed_home;
      std::vector<float> keys;            // the sealed pages' keys, as float, for the index
    };
    std::vector<HeadWork> work(static_cast<std::size_t>(kvh));
    std::vector<std::pair<std::uint8_t, tier::PageKey>> written;
    std::vector<SealedPage> seals;
    try {
      for (int h = 0; h < kvh; ++h) {
        Stream& st = stream(seq, layer, h);
        HeadWork& w = work[static_cast<std::size_t>(h)];
        const std::int64_t first_page = st.pages.tokens / pt, end_page = (st.pages.tokens + n + pt - 1) / pt;
        const auto slot_of = [&](std::int64_t page) {
          return page < static_cast<std::int64_t>(st.pages.size()) ? st.pages[static_cast<std::size_t>(page)].slot
                                                                   : w.new_slots[static_cast<std::size_t>(page) - st.pages.size()];
        };
        // Where a page's bytes are written: its slot, or (device fast tier) host memory, uploaded after.
        const auto bytes_of = [&](std::int64_t page) {
          if constexpr (kDeviceFast)
            return w.host.data() + static_cast<std::size_t>(page - first_page) * cfg_.page_bytes();
          else
            return tiers_.fast().slot_data(slot_of(page));
        };
        if constexpr (kDeviceFast) {
          w.host.assign(static_cast<std::size_t>(end_page - first_page) * cfg_.page_bytes(), std::byte{0});
          if (st.pages.tokens % pt != 0) std::copy(st.tail_host.begin(), st.tail_host.end(), w.host.begin());
        }
        for (std::int64_t t = 0; t < n; ++t) {
          const std::int64_t pos = st.pages.tokens + t;
          const std::int64_t page = pos / pt;
          const int row = static_cast<int>(pos % pt);
          if (page >= static_cast<std::int64_t>(st.pages.size()) && row == 0) w.new_slots.push_back(tiers_.fast().allocate());
          write_token(bytes_of(page), row, k.row(t, h), v.row(t, h));
          if (row == pt - 1) w.sealed.push_back(static_cast<std::uint32_t>(page));
        }
        if constexpr (kDeviceFast) {
          // Only the pages that keep their slot after this call go up: sink, local window, the
          // partial tail, and every page when there is no backing tier. The others leave the fast
          // tier at commit (slide_local_window) and live on their backing tier from the start.
          const PageRanges after = page_ranges(st.pages.tokens + n + 1, pt, cfg_.sink_tokens, cfg_.local_tokens);
          std::vector<tier::SlotUpload> up;
          for (std::int64_t page = first_page; page < end_page; ++page) {
            const bool sealed = (page + 1) * pt <= st.pages.tokens + n;
            if (TierList::kCount == 1 || !sealed || page < after.sink_end || page >= after.local_begin)
              up.push_back({slot_of(page), bytes_of(page)});
          }
          tiers_.fast().upload_pages(up);
          if ((st.pages.tokens + n) % pt != 0) w.tail.assign(bytes_of(end_page - 1), bytes_of(end_page - 1) + cfg_.page_bytes());
        }
        for (std::uint32_t page : w.sealed) {
          seals.push_back({tier::PageKey{id, static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), page}, bytes_of(page)});
          append_page_keys(bytes_of(page), w.keys);
        }
      }
      // Every head's sealed pages go to the backing tiers together (one sync per tier).
      store_sealed(seals, written, false);
      publish_prefix_pages(seq, seals);
      std::size_t at = 0;
      for (HeadWork& w : work)
        for (std::size_t i = 0; i < w.sealed.size(); ++i) w.sealed_home.push_back(seals[at++].home);
    } catch (...) {
      for (HeadWork& w : work)
        for (Slot s : w.new_slots) tiers_.fast().release(s);
      for (auto& [home, key] : written) tiers_.visit(home, [&](auto& t) { t.erase(key); });
      throw;
    }

    // Commit. Index policies' build() and append() must not throw here (see apply()).
    int h = 0;
    try {
      for (; h < kvh; ++h) {
        Stream& st = stream(seq, layer, h);
        HeadWork& w = work[static_cast<std::size_t>(h)];
        for (Slot s : std::exchange(w.new_slots, {})) st.pages.push_back(PageEntry{s, 0});
        for (std::size_t i = 0; i < w.sealed.size(); ++i) st.pages[w.sealed[i]].home = w.sealed_home[i];
        st.pages.tokens += n;
        if constexpr (kDeviceFast) st.tail_host.swap(w.tail);
        if (!w.sealed.empty()) {
          const index::PageKeys pk = page_keys_view(w.sealed.front(), static_cast<std::int64_t>(w.sealed.size()), w.keys);
          if (w.sealed.front() == 0)
            index_.build(st.index, pk);
          else
            index_.append(st.index, pk);
        }
        slide_local_window(st);
      }
    } catch (const std::exception& e) {
      for (HeadWork& w : work)
        for (Slot s : w.new_slots) tiers_.fast().release(s);
      seq.broken = true;
      fail("prefill: the index threw while committing layer {} head {} ({}); sequence {} is now unusable: release it",
           layer, h, e.what(), id);
    }
  }

  // ---- warm-up placement ---------------------------------------------------------------------

  /// Warm-up (Decision 6): after a layer's prefill, `placement` ranks each stream's candidate
  /// pages from the prompt's last queries, q_obs [observed][q_heads][head_dim] (the queries of
  /// the last `observed` prompt positions, 16-64 for SnapKV), and the top W x budget pages that
  /// live on a non-addressable tier are read into the stream's cache at step 0. Pages on
  /// addressable tiers are attended in place and need none. With middle tiers (Tiers<Fast, A,
  /// ..., Last>), the next pages of the ranking are copied from the last tier into them, in
  /// order, each tier taking an even share of its free room per (layer, head) of the layers not
  /// yet warmed (so call it layer by layer, in order): best pages in the cache, the next in the
  /// middle tiers, all of them in the last tier (Stats::placed counts the copies). Scoring needs
  /// the prompt's keys: pages that left the fast tier are read back for it (counted in
  /// bytes_read), so call it right after prefill. With Config::pack_by_cluster it also packs
  /// the prompt pages on the last tier by cluster (see there). Returns the pages read into the
  /// cache. On error nothing changes, except that streams already packed keep their new slots
  /// (same bytes). The shares assume one sequence at a time: a first sequence warmed up over
  /// all layers takes the middle tiers' room, and later ones get what is left.
  template <tier::PlacementPolicy P = tier::ImportanceGuided>
  std::size_t warm_up(SeqId id, int layer, View<const float, 3> q_obs, const P& placement = {}) {
    check_layer(layer);
    Sequence& seq = usable_sequence(id);
    const int kvh = cfg_.shape.kv_heads, g = cfg_.group(), d = cfg_.shape.head_dim, pt = cfg_.page_tokens;
    const std::int64_t tokens = check_observation(seq, layer, q_obs, "warm_up");
    struct HeadWarm {
      std::vector<std::uint32_t> pages;
      std::vector<float> scores;
      std::vector<Slot> slots;  // fresh slot per page, or -1 if it already has one
      std::vector<std::pair<std::uint32_t, std::uint8_t>> placed;  // page, middle tier it was copied to
    };
    std::vector<HeadWarm> work(static_cast<std::size_t>(kvh));
    std::vector<std::pair<std::uint8_t, tier::PageKey>> written;  // middle-tier copies, undone on failure
    // Each middle tier's share per stream: its room split evenly over this layer's heads and the
    // layers not yet placed (warm-up runs layer by layer), so every layer gets its best pages there.
    std::array<std::size_t, kMaxTiers> share{};
    const auto layers_left = static_cast<std::size_t>(std::max(1, cfg_.shape.layers - layer));
    for (std::size_t i = 1; i < kLastTier; ++i)
      share[i] = tiers_.visit(i, [](auto& t) -> std::size_t { return t.free_pages(); }) / (layers_left * static_cast<std::size_t>(kvh));
    std::vector<float> keys, q;
    std::vector<std::byte> scratch(cfg_.page_bytes());
    const bool pack = kCanPack && cfg_.pack_by_cluster;
    // The bytes of each stream's pages on the last tier, read once for scoring, kept for packing
    // and for the copies into middle tiers.
    const bool keep_bytes = pack || TierList::kCount > 2;
    std::vector<std::uint32_t> last_pages;
    std::vector<std::byte> last_bytes;
    std::size_t packed = 0;
    std::array<std::uint64_t, kMaxTiers> key_bytes{};  // pages read back to score their keys
    try {
      for (int h = 0; h < kvh; ++h) {
        Stream& st = stream(seq, layer, h);
        KVD_EXPECT(st.steps == 0, "warm_up: sequence {} layer {} has already decoded; warm up after prefill", id, layer);
        const PageRanges r = page_ranges(tokens + 1, pt, cfg_.sink_tokens, cfg_.local_tokens);
        if (r.candidates() <= 0) continue;
        const tier::PageKey base{id, static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), 0};
        // The prompt's keys as float, every page (the tail page's filled rows only); with
        // packing, the bytes of the pages on the last tier too.
        last_pages.clear();
        last_bytes.clear();
        read_stream_keys(st, base, tokens, keys, scratch.data(), key_bytes, keep_bytes ? &last_pages : nullptr, &last_bytes);
        group_queries(q_obs, h, q);
        if (pack) packed += pack_by_cluster(st, base, last_pages, last_bytes);
        tier::PlacementInput in;
        in.keys = keys.data();
        in.tokens = tokens;
        in.queries = q.data();
        in.observed = q_obs.extent(0);
        in.group = g;
        in.head_dim = d;
        in.page_tokens = pt;
        in.scale = cfg_.scale();
        const tier::PageRanking ranking = placement.rank(in, static_cast<std::uint32_t>(r.sink_end), static_cast<std::uint32_t>(r.local_begin));
        ranking.check(static_cast<std::uint32_t>(r.sink_end), static_cast<std::uint32_t>(r.local_begin), P::name());
        const std::size_t capacity = cache_capacity(window_of(layer, h), r);
        HeadWarm& w = work[static_cast<std::size_t>(h)];
        std::vector<std::pair<std::uint32_t, float>> chosen;
        for (std::size_t i = 0; i < ranking.pages.size() && chosen.size() < capacity; ++i) {
          const PageEntry& e = st.pages[ranking.pages[i]];
          if (e.home == 0 || attends_in_place(e.home)) continue;  // resident or attended in place
          chosen.emplace_back(ranking.pages[i], ranking.scores[i]);
        }
        if constexpr (TierList::kCount > 2) place_in_middle_tiers(st, base, ranking, chosen, share, last_pages, last_bytes, w.placed, written);
        std::sort(chosen.begin(), chosen.end());
        std::array<std::vector<tier::ReadRequest>, kMaxTiers> reads;  // one batch per tier
        std::vector<tier::SlotUpload> uploads;                        // device fast tier: staged reads
        StagingPages staging(*this);
        for (const auto& [page, score] : chosen) {
          w.pages.push_back(page);
          w.scores.push_back(score);
          w.slots.push_back(-1);
          if (st.pages[page].slot >= 0) continue;
          w.slots.back() = tiers_.fast().allocate();
          tier::PageKey key = base;
          key.page = page;
          std::byte* dst = nullptr;
          if constexpr (kDeviceFast) {
            dst = staging.add();
            uploads.push_back({w.slots.back(), dst});
          } else {
            dst = tiers_.fast().slot_data(w.slots.back());
          }
          reads[st.pages[page].home].push_back({key, dst});
        }
        for (std::size_t t = 1; t < TierList::kCount; ++t)
          if (!reads[t].empty()) tiers_.visit(t, [&](auto& tier) { tier.wait(tier.submit(reads[t])); });
        if constexpr (kDeviceFast) tiers_.fast().upload_pages(uploads);
      }
    } catch (...) {
      for (HeadWarm& w : work)
        for (Slot s : w.slots)
          if (s >= 0) tiers_.fast().release(s);
      for (auto& [home, key] : written) tiers_.visit(home, [&](auto& t) { t.erase(key); });
      throw;
    }
    // Commit: the pages take their slots (cannot fail), then enter the caches at step 0. The
    // policies' update() must not throw; if one does, the sequence is marked unusable (its
    // pages, slots included, are freed by release()).
    total_.packed += packed;
    total_.bytes_written[kLastTier] += packed * cfg_.page_bytes();
    std::size_t warmed = 0;
    for (int h = 0; h < kvh; ++h) {
      Stream& st = stream(seq, layer, h);
      HeadWarm& w = work[static_cast<std::size_t>(h)];
      for (const auto& [page, tier_index] : w.placed) {
        st.pages[page].home = tier_index;
        total_.bytes_written[tier_index] += cfg_.page_bytes();
        ++total_.placed;
      }
      for (std::size_t i = 0; i < w.pages.size(); ++i)
        if (w.slots[i] >= 0) {
          st.pages[w.pages[i]].slot = w.slots[i];
          total_.bytes_read[st.pages[w.pages[i]].home] += cfg_.page_bytes();
          ++warmed;
        }
    }
    std::vector<std::uint32_t> evicted;
    int h = 0;
    try {
      for (; h < kvh; ++h) {
        Stream& st = stream(seq, layer, h);
        HeadWarm& w = work[static_cast<std::size_t>(h)];
        if (w.pages.empty()) continue;
        eviction::CacheUpdate u;
        u.pages = w.pages;
        u.scores = w.scores;
        u.step = 0;
        u.window = window_of(layer, h);
        u.capacity = cache_capacity(u.window, page_ranges(tokens + 1, pt, cfg_.sink_tokens, cfg_.local_tokens));
        evicted.clear();
        eviction_.update(st.cache, u, evicted);
        for (std::uint32_t page : evicted) {
          PageEntry& e = st.pages[page];
          if (e.slot >= 0) tiers_.fast().release(e.slot);
          e.slot = -1;
        }
        total_.evictions += evicted.size();
      }
    } catch (const std::exception& e) {
      seq.broken = true;
      fail("warm_up: the eviction policy threw while committing layer {} head {} ({}); sequence {} is now unusable: release it",
           layer, h, e.what(), id);
    }
    for (std::size_t i = 0; i < kMaxTiers; ++i) total_.bytes_read[i] += key_bytes[i];
    total_.warmed += warmed;
    return warmed;
  }

  // ---- decode --------------------------------------------------------------------------------

  /// One decode step of one layer for a batch of sequences. q and out are
  /// [batch][q_heads][head_dim]; k and v, the new token's, are [batch][kv_heads][head_dim].
  /// The new token is appended and attended. On error nothing changes (Decision 8).
  void attend(int layer, std::span<const SeqId> batch, View<const float, 3> q,
              View<const float, 3> k, View<const float, 3> v, View<float, 3> out) {
    check_step_inputs(layer, batch, q, k, v, out);
    Step step(*this, layer, batch, q, k, v, out);
    try {
      pipeline_.run(step);
    } catch (...) {
      step.abort();
      throw;
    }
    last_ = step.stats;
    total_ += step.stats;
    if (growth_) grow_window(layer, batch, step.stats.time);
  }

  // ---- tuning --------------------------------------------------------------------------------

  /// What tune() measured: the step time of each micro-batch size tried, and the one chosen.
  struct TuneReport {
    std::size_t micro_batch = 0;                                  ///< chosen (streams)
    std::vector<std::pair<std::size_t, double>> step_ms;          ///< (micro-batch, median ms)
  };

  /// Calibrates the pipeline on one step of this batch without applying it: for pipelines with
  /// micro-batches (Elastic), each size in {streams, /2, /4, /8, 1} runs `repeats` dry steps
  /// (select, classify, fetch and compute, then rolled back: nothing changes), the sizes taking
  /// turns round by round so that drift in the machine's speed hits them alike, and the size
  /// with the fastest median is set; a split must beat the whole batch by 10%. Call it after
  /// warm-up, with a representative batch. Arguments as attend().
  TuneReport tune(int layer, std::span<const SeqId> batch, View<const float, 3> q, View<const float, 3> k,
                  View<const float, 3> v, View<float, 3> out, int repeats = 9) {
    KVD_EXPECT(repeats >= 1, "tune: repeats {} must be >= 1", repeats);
    check_step_inputs(layer, batch, q, k, v, out);
    TuneReport report;
    if constexpr (requires(Pipeline& p, std::size_t n) { p.set_micro_batch(n); }) {
      const std::size_t streams = batch.size() * static_cast<std::size_t>(cfg_.shape.kv_heads);
      std::vector<std::size_t> sizes;
      for (std::size_t div : {1, 2, 4, 8, 1 << 30}) {
        const std::size_t mb = std::max<std::size_t>(1, streams / std::min<std::size_t>(div, streams));
        if (std::find(sizes.begin(), sizes.end(), mb) == sizes.end()) sizes.push_back(mb);
      }
      const Pipeline saved = pipeline_;
      std::vector<std::vector<double>> ms(sizes.size());
      try {
        for (int r = 0; r < repeats; ++r)
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            pipeline_.set_micro_batch(sizes[i]);
            Step step(*this, layer, batch, q, k, v, out);
            DryRun<Step> dry{step};
            const auto t0 = std::chrono::steady_clock::now();
            try {
              pipeline_.run(dry);
            } catch (...) {
              step.abort();
              throw;
            }
            ms[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            step.abort();
          }
      } catch (...) {
        pipeline_ = saved;
        throw;
      }
      double whole = 0, best_split = std::numeric_limits<double>::infinity();
      std::size_t split = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        std::sort(ms[i].begin(), ms[i].end());
        const double median = ms[i][ms[i].size() / 2];
        report.step_ms.emplace_back(sizes[i], median);
        if (sizes[i] == streams) {
          whole = median;
        } else if (median < best_split) {
          best_split = median;
          split = sizes[i];
        }
      }
      // A split must beat the whole batch by 10%: dry steps are noisy, and a needless split
      // only adds hand-offs.
      report.micro_batch = split != 0 && best_split < 0.90 * whole ? split : streams;
      pipeline_.set_micro_batch(report.micro_batch);
    }
    return report;
  }

  /// Cluster sizes tune_clusters() tries by default (pages per cluster).
  static constexpr std::array<int, 5> kClusterSizes{4, 8, 16, 32, 64};

  /// Chooses the index's cluster size (KVDrive's number of centroids) on one prefilled layer of
  /// a sequence (index/cluster_size.hpp): the index is built at each size over every KV head's
  /// prompt keys and selects with the prompt's last queries q_obs ([observed][q_heads][head_dim],
  /// as warm_up takes them); the fastest size whose mean mass recall is within `tolerance` of the
  /// best size's is set in the index's parameters, for every index built from then on, and this
  /// layer's streams are re-indexed with it. Layers prefilled earlier keep their index, so call
  /// it on the first layer, after its prefill and before warm_up (packing follows the clusters).
  /// Set params.pages_per_cluster by hand instead to skip it. On error nothing changes.
  index::ClusterSizeChoice tune_clusters(SeqId id, int layer, View<const float, 3> q_obs,
                                         std::span<const int> sizes = kClusterSizes, double tolerance = 0.01)
    requires index::HasClusterSize<Index>
  {
    check_layer(layer);
    Sequence& seq = usable_sequence(id);
    const int kvh = cfg_.shape.kv_heads, g = cfg_.group(), pt = cfg_.page_tokens;
    const std::int64_t tokens = check_observation(seq, layer, q_obs, "tune_clusters");
    const auto sealed = static_cast<std::uint32_t>(tokens / pt);
    std::vector<std::vector<float>> keys(static_cast<std::size_t>(kvh)), queries(static_cast<std::size_t>(kvh));
    std::vector<index::ClusterCalibration> calibration;
    std::vector<std::byte> scratch(cfg_.page_bytes());
    std::array<std::uint64_t, kMaxTiers> key_bytes{};
    const PageRanges r = page_ranges(tokens + 1, pt, cfg_.sink_tokens, cfg_.local_tokens);
    for (int h = 0; h < kvh; ++h) {
      const Stream& st = stream(seq, layer, h);
      KVD_EXPECT(st.steps == 0, "tune_clusters: sequence {} layer {} has already decoded; tune after prefill", id, layer);
      const auto hu = static_cast<std::size_t>(h);
      read_stream_keys(st, tier::PageKey{id, static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), 0}, tokens, keys[hu],
                       scratch.data(), key_bytes, nullptr, nullptr);
      group_queries(q_obs, h, queries[hu]);
      index::ClusterCalibration c;
      c.keys = page_keys_view(0, sealed, keys[hu]);
      c.queries = queries[hu];
      c.group = g;
      c.scale = cfg_.scale();
      c.first_candidate = r.sink_end;
      c.end_candidate = std::min<std::int64_t>(r.local_begin, sealed);
      c.budget_pages = cfg_.budget.pages_for(r.candidates());
      if (c.end_candidate > c.first_candidate) calibration.push_back(c);
    }
    KVD_EXPECT(!calibration.empty(), "tune_clusters: layer {} of sequence {} has no candidate pages to calibrate on ({} tokens)", layer,
               id, tokens);
    index::ClusterSizeChoice choice = index::choose_cluster_size(index_, calibration, sizes, tolerance);
    Index tuned = index_;
    tuned.params.pages_per_cluster = choice.pages_per_cluster;
    std::vector<typename Index::State> fresh = build_indexes(tuned, sealed, keys);
    // Commit (cannot fail): the new size, and this layer's streams on their new index.
    index_ = std::move(tuned);
    install_indexes(seq, layer, fresh, key_bytes);
    return choice;
  }

  /// Rebuilds the index of one prefilled layer of a sequence with the index policy's current
  /// parameters (after tune_clusters() on another layer, or a change by hand), from the prompt's
  /// keys (read back from the tiers where they left the fast tier). Before the layer decodes.
  /// On error nothing changes.
  void reindex(SeqId id, int layer) {
    check_layer(layer);
    Sequence& seq = usable_sequence(id);
    const int kvh = cfg_.shape.kv_heads;
    const std::int64_t tokens = stream(seq, layer, 0).pages.tokens;
    std::vector<std::vector<float>> keys(static_cast<std::size_t>(kvh));
    std::vector<std::byte> scratch(cfg_.page_bytes());
    std::array<std::uint64_t, kMaxTiers> key_bytes{};
    for (int h = 0; h < kvh; ++h) {
      const Stream& st = stream(seq, layer, h);
      KVD_EXPECT(st.steps == 0, "reindex: sequence {} layer {} has already decoded", id, layer);
      read_stream_keys(st, tier::PageKey{id, static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), 0}, tokens,
                       keys[static_cast<std::size_t>(h)], scratch.data(), key_bytes, nullptr, nullptr);
    }
    std::vector<typename Index::State> fresh = build_indexes(index_, static_cast<std::uint32_t>(tokens / cfg_.page_tokens), keys);
    install_indexes(seq, layer, fresh, key_bytes);  // cannot fail
  }

  // ---- inspection ----------------------------------------------------------------------------

  const Config& config() const { return cfg_; }
  TierList& tiers() { return tiers_; }
  const Index& index_policy() const { return index_; }
  const Eviction& eviction_policy() const { return eviction_; }
  const Pipeline& pipeline_policy() const { return pipeline_; }
  Pipeline& pipeline_policy() { return pipeline_; }
  /// Statistics of the last successful attend() and of all of them.
  const Stats& last_stats() const { return last_; }
  const Stats& total_stats() const { return total_; }
  std::size_t sequences() const { return sequences_.size(); }

  /// Host staging pages in use: with a device fast tier, pages read from the backing tiers wait
  /// there for their upload. 0 between calls.
  std::size_t staging_pages() const { return bounce_.used(); }

  /// Bytes held by the index over all streams.
  std::size_t index_bytes() const {
    std::size_t total = 0;
    for (const auto& [id, s] : sequences_)
      for (const Stream& st : s.streams) total += index_.bytes(st.index);
    return total;
  }

  // ---- cache windows -------------------------------------------------------------------------

  /// Gives each (layer, KV head) its own window W (eviction/window_plan.hpp; the knapsack
  /// allocation in eviction/knapsack.hpp makes one). A stream's cache keeps W x budget pages.
  /// Applies from the next update on; refused for policies whose window is fixed (None, LastStep).
  void set_window_plan(eviction::WindowPlan plan) {
    KVD_EXPECT(!eviction::kHasFixedWindow<Eviction>, "set_window_plan: eviction policy '{}' has a fixed window", Eviction::name());
    plan.validate(cfg_.shape);
    plan_ = std::move(plan);
  }
  /// Back to the policy's own W for every stream.
  void clear_window_plan() { plan_.reset(); }

  /// Cache-size tuning during the first decode steps (KVDrive grows the cache during warm-up
  /// until the CPU side of the pipeline matches selection). For `steps` decode steps of each
  /// layer, after every step whose classify + fetch time exceeds its select time (the reads are
  /// the long pole; a larger cache turns misses into hits), the layer's W grows by one for every
  /// KV head, up to `max_window`, if the fast tier has room for one more step's budget of every
  /// stream of the layer, on top of what the caches not yet full to their W will take and a
  /// step's worth of staging. Once the reads fit under selection a
  /// larger cache buys no step time, so W stops there. (Classification here is a page-table
  /// lookup per selected page, so unlike the paper's it does not itself grow with the cache.)
  struct WindowGrowth {
    int max_window = 8;  ///< W never grows past this
    int steps = 16;      ///< decode steps per layer during which W may grow
  };
  void grow_windows(WindowGrowth g) {
    KVD_EXPECT(!eviction::kHasFixedWindow<Eviction>, "grow_windows: eviction policy '{}' has a fixed window", Eviction::name());
    KVD_EXPECT(g.max_window >= 0 && g.max_window <= 1024 && g.steps >= 0,
               "grow_windows: max_window {} must be in 0..1024 and steps {} >= 0", g.max_window, g.steps);
    auto plan = plan_ ? *plan_ : eviction::WindowPlan::uniform(cfg_.shape, std::max(0, eviction_.default_window()));
    growth_steps_.assign(static_cast<std::size_t>(cfg_.shape.layers), 0);
    growth_grown_.assign(static_cast<std::size_t>(cfg_.shape.layers), 0);
    plan_ = std::move(plan);
    growth_ = g;
  }
  /// Times W grew, per layer, since grow_windows().
  const std::vector<int>& window_grown() const { return growth_grown_; }
  const std::optional<eviction::WindowPlan>& window_plan() const { return plan_; }

  /// The window W of a stream: the plan's, else the policy's.
  int window_of(int layer, int head) const {
    check_layer(layer);
    return plan_ ? plan_->window(layer, head) : std::max(0, eviction_.default_window());
  }

  /// Pages of one stream currently held in the fast tier's cache (eviction-managed).
  std::size_t cached_pages(SeqId id, int layer, int head) const {
    check_layer(layer);
    return eviction_.size(stream(sequence(id), layer, head).cache);
  }

  /// The index state of one stream, for inspection (e.g. Hierarchical::cluster_of).
  const typename Index::State& index_state(SeqId id, int layer, int head) const {
    check_layer(layer);
    KVD_EXPECT(head >= 0 && head < cfg_.shape.kv_heads, "head {} outside 0..{}", head, cfg_.shape.kv_heads - 1);
    return stream(sequence(id), layer, head).index;
  }

 private:
  /// A page sealed by prefill or a step, on its way to a backing tier.
  struct SealedPage {
    tier::PageKey key;
    const std::byte* bytes = nullptr;
    std::uint8_t home = 0;
  };

  struct Stream {
    PageTable pages;
    std::uint64_t steps = 0;  ///< decode steps done
    typename Index::State index;
    typename Eviction::State cache;
    std::vector<std::byte> tail_host;  ///< device fast tier: the tail page's bytes, in host memory
  };

  struct Sequence {
    std::optional<PrefixDigest> digest;
    std::uint32_t shared_pages = 0;  ///< leading pages content-addressed on the remote tier
    std::uint32_t loaded_pages = 0;  ///< of those, pages load_prefix() read from it
    PrefixDigest shared_digest;      ///< their remote digest (remote_digest(digest))
    bool broken = false;  ///< a policy threw after a step's point of no return; only release() works
    std::vector<Stream> streams;  ///< [layer][kv_head]
  };

  /// Everything one stream's step needs, filled stage by stage.
  struct StepPlan {
    Stream* stream = nullptr;
    tier::PageKey base;         ///< sequence, layer, head of this stream
    std::size_t batch_index = 0;
    int head = 0;
    PageRanges ranges;          ///< with the new token counted
    Slot new_tail = -1;         ///< slot opened for the new token's page, if it starts one
    std::vector<float> q;       ///< [group][head_dim]
    std::vector<std::uint32_t> selected;
    std::vector<std::uint32_t> misses;
    std::vector<Slot> staged;   ///< fast slot holding each miss
    std::vector<Slot> bounce;   ///< device fast tier: host staging page each miss is read into, as staged
    /// Reads in flight for the fetch range this stream starts: (tier, ticket) per tier.
    std::vector<std::pair<std::uint8_t, tier::ReadTicket>> in_flight;
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
  };

  /// The StepStages that the pipeline drives for one attend().
  class Step {
   public:
    Stats stats;

    Step(KvManager& m, int layer, std::span<const SeqId> batch, View<const float, 3> q,
         View<const float, 3> k, View<const float, 3> v, View<float, 3> out)
        : m_(m), layer_(layer), batch_(batch), k_(k), v_(v), q_(q), out_(out) {
      const int kvh = m.cfg_.shape.kv_heads;
      m.plans_.resize(batch.size() * static_cast<std::size_t>(kvh));
      for (std::size_t b = 0; b < batch.size(); ++b)
        for (int h = 0; h < kvh; ++h) {
          StepPlan& p = m.plans_[b * kvh + h];
          p.stream = &m.stream(m.sequence(batch[b]), layer, h);
          p.base = tier::PageKey{batch[b], static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), 0};
          p.batch_index = b;
          p.head = h;
          reset(p);
        }
      stats.steps = 1;
      stats.streams = m.plans_.size();
    }

    std::size_t streams() const { return m_.plans_.size(); }

    void select(std::size_t i) {
      StepPlan& p = m_.plans_[i];
      const index::IndexQuery query = prepare_select(p);
      if (p.ranges.candidates() > 0) m_.index_.select(p.stream->index, query, p.selected);
      check_selection(p, query);
    }

    /// select() for streams [first, last): with an index that selects many streams in one call
    /// (index::BatchSelectIndex, e.g. on a GPU), the streams are prepared in parallel and
    /// selected together; otherwise each is selected in parallel.
    void select_range(std::size_t first, std::size_t last) {
      if constexpr (index::BatchSelectIndex<Index>) {
        std::vector<index::IndexQuery> queries(last - first);
        m_.backend_.parallel_for(last - first, [&](std::size_t j) { queries[j] = prepare_select(m_.plans_[first + j]); });
        std::vector<const typename Index::State*> states;
        std::vector<index::IndexQuery> asked;
        std::vector<std::vector<std::uint32_t>*> outs;
        for (std::size_t j = 0; j < queries.size(); ++j) {
          StepPlan& p = m_.plans_[first + j];
          if (p.ranges.candidates() <= 0) continue;
          states.push_back(&p.stream->index);
          asked.push_back(queries[j]);
          outs.push_back(&p.selected);
        }
        if (!states.empty()) m_.index_.select_batch(states, asked, outs);
        for (std::size_t j = 0; j < queries.size(); ++j) check_selection(m_.plans_[first + j], queries[j]);
      } else {
        m_.backend_.parallel_for(last - first, [&](std::size_t j) { select(first + j); });
      }
    }

    void classify(std::size_t i) {
      StepPlan& p = m_.plans_[i];
      const Stream& st = *p.stream;
      for (std::uint32_t page : p.selected) {
        const PageEntry& e = st.pages[page];
        if (attends_in_place(e.home) && e.slot < 0) {
          ++p.hits;
          ++p.in_place;
        } else if (e.slot >= 0) {
          ++p.hits;
        } else {
          p.misses.push_back(page);
        }
        if (!attends_in_place(e.home)) p.through_cache.push_back(page);
      }
    }

    void fetch(std::size_t i) { fetch_range(i, i + 1); }

    /// Fetches the misses of streams [first, last) into staging slots, in one batch per tier,
    /// so their reads are in flight together (one round trip to the device, not one per stream).
    void fetch_range(std::size_t first, std::size_t last) {
      fetch_start(first, last);
      fetch_finish(first, last);
    }

    /// Starts reading the misses of streams [first, last) into staging slots (one batch per
    /// tier) and returns with the reads in flight where the tier reads asynchronously (SsdTier),
    /// so a pipeline can start the next range meanwhile. fetch_finish(first, last) waits.
    void fetch_start(std::size_t first, std::size_t last) {
      std::vector<tier::ReadRequest> reads;
      auto& in_flight = m_.plans_[first].in_flight;
      for (std::size_t tier_index = 1; tier_index < TierList::kCount; ++tier_index) {
        reads.clear();
        for (std::size_t i = first; i < last; ++i) {
          StepPlan& p = m_.plans_[i];
          for (std::uint32_t page : p.misses) {
            if (p.stream->pages[page].home != tier_index) continue;
            p.staged.push_back(m_.tiers_.fast().allocate());
            tier::PageKey key = p.base;
            key.page = page;
            if constexpr (kDeviceFast) {
              p.bounce.push_back(m_.bounce_.allocate());
              reads.push_back({key, m_.bounce_.data(p.bounce.back())});
            } else {
              reads.push_back({key, m_.tiers_.fast().slot_data(p.staged.back())});
            }
          }
        }
        if (reads.empty()) continue;
        in_flight.reserve(in_flight.size() + 1);  // recording the ticket must not fail
        const tier::ReadTicket t = m_.tiers_.visit(tier_index, [&](auto& tr) { return tr.submit(reads); });
        in_flight.emplace_back(static_cast<std::uint8_t>(tier_index), t);
      }
    }

    /// Waits for the reads fetch_start(first, last) started; throws the first error (after
    /// waiting for all of them: no read is left in flight).
    void fetch_finish(std::size_t first, std::size_t last) {
      if (finish_reads(m_.plans_[first])) std::rethrow_exception(std::exchange(read_error_, nullptr));
      if constexpr (kDeviceFast) upload_staged(first, last);
      // staged[] follows the tier loop's order; put it back in misses order.
      if (TierList::kCount > 2)
        for (std::size_t i = first; i < last; ++i)
          if (!m_.plans_[i].misses.empty()) sort_staged_by_page(m_.plans_[i]);
    }

    void compute(std::size_t first, std::size_t last) {
      if constexpr (kDeviceFast)
        compute_on_device(first, last);
      else
        m_.backend_.parallel_for(last - first, [&](std::size_t j) { compute_one(m_.plans_[first + j]); });
    }

    /// Attends the splits of streams [first, last) whose pages are all resident already (no
    /// miss among them), after classify and before or while their misses are read; compute()
    /// does the rest and merges. Optional for a pipeline: the bits are the same either way.
    void compute_ready(std::size_t first, std::size_t last) {
      if constexpr (kDeviceFast) return;  // the device attends the whole list in one launch
      m_.backend_.parallel_for(last - first, [&](std::size_t j) {
        StepPlan& p = m_.plans_[first + j];
        prepare_splits(p);
        const std::size_t n = p.attended.size();
        thread_local std::vector<attention::PageRef> refs;  // per worker, reused step after step
        for (std::size_t s = 0; s < p.split_done.size(); ++s) {
          const std::size_t a = s * attention::kSplitPages, b = std::min(n, a + attention::kSplitPages);
          bool resident = true;
          for (std::size_t i = a; i < b && resident; ++i) resident = !std::binary_search(p.misses.begin(), p.misses.end(), p.attended[i]);
          if (!resident) continue;
          refs.clear();
          for (std::size_t i = a; i < b; ++i) refs.push_back(page_ref(p, p.attended[i]));
          compute_split(p, s, refs);
        }
      });
    }

    /// Runs fn(i) for i in [0, n) on the backend's threads (for stages that are per stream).
    void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { m_.backend_.parallel_for(n, fn); }

    /// Where the pipeline records each stage's time.
    StageTimes& times() { return stats.time; }

    /// The fallible part of commit(), which needs no attention output: sealed pages go to their
    /// backing tiers, and the index gets their keys as float. A pipeline may run it while
    /// compute() runs (Elastic does); commit() runs it if nobody did. Undone by abort().
    void prepare_commit() {
      if (prepared_) return;
      prepared_ = true;
      seals_.clear();
      for (StepPlan& p : m_.plans_) {
        if (!p.seals) continue;
        tier::PageKey key = p.base;
        key.page = static_cast<std::uint32_t>(p.ranges.pages - 1);
        seals_.push_back({key, sealed_bytes(p)});
      }
      m_.store_sealed(seals_, written_, true);
      std::size_t at = 0;
      for (StepPlan& p : m_.plans_) {
        if (!p.seals) continue;
        p.seal_home = seals_[at++].home;
        if (p.seal_home > 0) stats.bytes_written[kLastTier] += m_.cfg_.page_bytes();
        if (p.seal_home > 0 && p.seal_home != kLastTier) stats.bytes_written[p.seal_home] += m_.cfg_.page_bytes();
      }
      // Still fallible: the index gets the sealed page's keys as float.
      for (StepPlan& p : m_.plans_)
        if (p.seals) {
          p.seal_keys.clear();
          m_.append_page_keys(sealed_bytes(p), p.seal_keys);
        }
    }

    void commit() {
      prepare_commit();
      // The point of no return: from here the step applies, and the pages written above stay.
      written_.clear();
      std::size_t i = 0;
      try {
        for (; i < m_.plans_.size(); ++i) apply(m_.plans_[i]);
      } catch (const std::exception& e) {
        for (std::size_t j = 0; j < m_.plans_.size(); ++j) {
          StepPlan& p = m_.plans_[j];
          for (Slot s : p.staged) m_.tiers_.fast().release(s);  // slots no stream took over
          p.staged.clear();
          release_bounce(p);
          if (p.new_tail >= 0) m_.tiers_.fast().release(std::exchange(p.new_tail, -1));
          if (j > i && p.seals) {  // pages written for streams never applied
            tier::PageKey key = p.base;
            key.page = static_cast<std::uint32_t>(p.ranges.pages - 1);
            m_.erase_backed(p.seal_home, key);
          }
        }
        std::string ids;
        for (std::size_t b = 0; b < batch_.size(); ++b) {
          m_.sequence(batch_[b]).broken = true;
          ids += fmt::format("{}{}", b ? ", " : "", batch_[b]);
        }
        fail("attend: a policy threw while committing layer {} ({}); sequences {} are now unusable: release them",
             layer_, e.what(), ids);
      }
    }

    /// Applies one stream's step. Policies' append() and update() run here, after the point of
    /// no return; they must not throw (if one does, attend() reports the batch unusable).
    void apply(StepPlan& p) {
      Stream& st = *p.stream;
      const int g = m_.cfg_.group(), d = m_.cfg_.shape.head_dim;
      if (p.new_tail >= 0) st.pages.push_back(PageEntry{std::exchange(p.new_tail, -1), 0});
      ++st.pages.tokens;
      if (p.seals) {
        const auto page = static_cast<std::uint32_t>(p.ranges.pages - 1);
        st.pages[page].home = p.seal_home;
        const index::PageKeys keys = m_.page_keys_view(page, 1, p.seal_keys);
        if (page == 0)
          m_.index_.build(st.index, keys);  // a stream decoded without prefill
        else
          m_.index_.append(st.index, keys);
      }
      // Misses enter the cache in their staging slots; the policy then evicts.
      for (std::size_t s = 0; s < p.misses.size(); ++s) st.pages[p.misses[s]].slot = p.staged[s];
      p.staged.clear();
      eviction::CacheUpdate u;
      u.pages = p.through_cache;
      u.scores = p.cache_scores;
      u.step = st.steps + 1;
      u.window = m_.window_of(layer_, p.head);
      u.capacity = m_.cache_capacity(u.window, p.ranges);
      evicted_.clear();
      m_.eviction_.update(st.cache, u, evicted_);
      for (std::uint32_t page : evicted_) {
        PageEntry& e = st.pages[page];
        if (e.slot >= 0) m_.tiers_.fast().release(e.slot);
        e.slot = -1;
      }
      m_.slide_local_window(st);
      ++st.steps;
      for (int j = 0; j < g; ++j)
        std::copy_n(p.out.data() + static_cast<std::size_t>(j) * d, d, out_.row(p.batch_index, p.head * g + j));
      stats.candidates += static_cast<std::uint64_t>(p.ranges.candidates());
      stats.selected += p.selected.size();
      stats.hits += p.hits;
      stats.in_place += p.in_place;
      stats.misses += p.misses.size();
      stats.evictions += evicted_.size();
      stats.attended_pages += p.refs.size();
      for (const auto& r : p.refs) stats.attended_tokens += static_cast<std::uint64_t>(r.tokens);
      for (std::uint32_t page : p.misses) stats.bytes_read[st.pages[page].home] += m_.cfg_.page_bytes();
    }

    /// Undo everything a failed step allocated or wrote; the sequences stay as they were.
    void abort() {
      for (StepPlan& p : m_.plans_) (void)finish_reads(p);  // no read may land in a slot after it is freed
      for (StepPlan& p : m_.plans_) {
        for (Slot s : p.staged) m_.tiers_.fast().release(s);
        p.staged.clear();
        release_bounce(p);
        if (p.new_tail >= 0) m_.tiers_.fast().release(std::exchange(p.new_tail, -1));
      }
      for (auto& [home, key] : written_) m_.tiers_.visit(home, [&](auto& t) { t.erase(key); });
      written_.clear();
    }

   private:
    /// Waits for every read in flight from p's fetch_start; returns whether one failed (the
    /// first error is kept in read_error_).
    bool finish_reads(StepPlan& p) {
      bool failed = false;
      for (const auto& [tier_index, ticket] : std::exchange(p.in_flight, {})) {
        try {
          m_.tiers_.visit(tier_index, [&](auto& tr) { tr.wait(ticket); });
        } catch (...) {
          if (!failed) read_error_ = std::current_exception();
          failed = true;
        }
      }
      return failed;
    }

    static void reset(StepPlan& p) {
      p.new_tail = -1;
      p.selected.clear();
      p.misses.clear();
      p.staged.clear();
      p.refs.clear();
      p.attended.clear();
      p.split_done.clear();
      p.through_cache.clear();
      p.cache_scores.clear();
      p.hits = p.in_place = 0;
      p.seal_home = 0;
      p.seals = false;
    }

    static void sort_staged_by_page(StepPlan& p) {
      // Re-derive the order the fetch loop used (by tier, then misses order) and map back.
      std::vector<std::pair<std::uint32_t, Slot>> pairs;
      std::size_t k = 0;
      for (std::size_t tier_index = 1; tier_index < TierList::kCount; ++tier_index)
        for (std::uint32_t page : p.misses)
          if (p.stream->pages[page].home == tier_index) pairs.emplace_back(page, p.staged[k++]);
      std::sort(pairs.begin(), pairs.end());
      for (std::size_t s = 0; s < pairs.size(); ++s) p.staged[s] = pairs[s].second;
    }

    /// Pointer to a page's bytes for this step: the tail slot, a resident or staged slot, or the
    /// page where it lives on an addressable tier.
    const std::byte* page_data(const StepPlan& p, std::uint32_t page) const {
      const Stream& st = *p.stream;
      if (page == p.ranges.pages - 1 && p.new_tail >= 0) return m_.tiers_.fast().slot_data(p.new_tail);
      const PageEntry& e = st.pages[page];
      if (e.slot >= 0) return m_.tiers_.fast().slot_data(e.slot);
      auto it = std::lower_bound(p.misses.begin(), p.misses.end(), page);
      if (it != p.misses.end() && *it == page)
        return m_.tiers_.fast().slot_data(p.staged[static_cast<std::size_t>(it - p.misses.begin())]);
      tier::PageKey key = p.base;
      key.page = page;
      const std::byte* addr = nullptr;
      m_.tiers_.visit(e.home, [&](auto& t) {
        using T = std::remove_cvref_t<decltype(t)>;
        if constexpr (tier::AddressableTier<T>) addr = t.address(key);
      });
      KVD_EXPECT(addr != nullptr, "page {} is not resident and its tier {} is not addressable", key, e.home);
      return addr;
    }

    attention::PageRef page_ref(const StepPlan& p, std::uint32_t page) const {
      const Config& c = m_.cfg_;
      const std::byte* bytes = page_data(p, page);
      const std::int64_t tokens_after = p.stream->pages.tokens + 1;
      const int tokens = page == p.ranges.pages - 1
                             ? static_cast<int>(tokens_after - static_cast<std::int64_t>(page) * c.page_tokens)
                             : c.page_tokens;
      return {bytes, bytes + c.block_bytes(), tokens};
    }

    /// The attended pages in list order (sink, selected, local) and room for every split's
    /// result, once per step.
    void prepare_splits(StepPlan& p) const {
      if (!p.split_done.empty() || p.ranges.pages == 0) return;
      const int g = m_.cfg_.group(), d = m_.cfg_.shape.head_dim;
      for (std::int64_t page = 0; page < p.ranges.sink_end; ++page) p.attended.push_back(static_cast<std::uint32_t>(page));
      p.attended.insert(p.attended.end(), p.selected.begin(), p.selected.end());
      for (std::int64_t page = p.ranges.local_begin; page < p.ranges.pages; ++page) p.attended.push_back(static_cast<std::uint32_t>(page));
      const std::size_t splits = attention::split_count(p.attended.size());
      p.split_out.resize(splits * static_cast<std::size_t>(g) * d);
      p.split_lse.resize(splits * static_cast<std::size_t>(g));
      p.page_lse.resize(p.attended.size() * static_cast<std::size_t>(g));
      p.split_done.assign(splits, 0);
    }

    /// Attends split s of p's pages (refs: its pages, in order).
    void compute_split(StepPlan& p, std::size_t s, std::span<const attention::PageRef> refs) const {
      const Config& c = m_.cfg_;
      const int g = c.group(), d = c.shape.head_dim;
      attention::DecodeArgs args;
      args.q = p.q.data();
      args.group = g;
      args.head_dim = d;
      args.scale = c.scale();
      args.pages = refs;
      args.out = p.split_out.data() + s * static_cast<std::size_t>(g) * d;
      args.lse = p.split_lse.data() + s * static_cast<std::size_t>(g);
      args.page_lse = p.page_lse.data() + s * attention::kSplitPages * static_cast<std::size_t>(g);
      dispatch_dtype(c.dtype, [&](auto tag) { attention::sparse_decode<typename decltype(tag)::type>(args); });
      p.split_done[s] = 1;
    }

    void compute_one(StepPlan& p) const {
      const Config& c = m_.cfg_;
      const int g = c.group(), d = c.shape.head_dim;
      prepare_splits(p);
      for (std::uint32_t page : p.attended) p.refs.push_back(page_ref(p, page));
      const std::size_t n = p.refs.size();
      for (std::size_t s = 0; s < p.split_done.size(); ++s)
        if (!p.split_done[s]) {
          const std::size_t a = s * attention::kSplitPages, b = std::min(n, a + attention::kSplitPages);
          compute_split(p, s, std::span<const attention::PageRef>(p.refs).subspan(a, b - a));
        }
      p.out.resize(static_cast<std::size_t>(g) * d);
      p.lse.resize(static_cast<std::size_t>(g));
      attention::merge_splits(g, d, p.split_done.size(), p.split_out.data(), p.split_lse.data(), p.out.data(), p.lse.data());
      score_cache_pages(p);
    }

    /// Eviction scores: the attention mass of each page that went through the cache.
    void score_cache_pages(StepPlan& p) const {
      const int g = m_.cfg_.group();
      const auto first_selected = static_cast<std::size_t>(p.ranges.sink_end);
      for (std::uint32_t page : p.through_cache) {
        const auto pos = static_cast<std::size_t>(
            std::lower_bound(p.selected.begin(), p.selected.end(), page) - p.selected.begin());
        const float* lse_p = p.page_lse.data() + (first_selected + pos) * g;
        float mass = 0.0f;
        for (int h = 0; h < g; ++h) mass += attention::page_mass(lse_p[h], p.lse[h]);
        p.cache_scores.push_back(mass);
      }
    }

    /// select()'s part before the index: writes the new token into its page (past the stream's
    /// token count, so invisible until commit) and returns the stream's query.
    index::IndexQuery prepare_select(StepPlan& p) {
      Stream& st = *p.stream;
      const Config& c = m_.cfg_;
      const int d = c.shape.head_dim, g = c.group();
      p.ranges = page_ranges(st.pages.tokens + 1, c.page_tokens, c.sink_tokens, c.local_tokens);
      const int row = static_cast<int>(st.pages.tokens % c.page_tokens);
      if (row == 0) p.new_tail = m_.tiers_.fast().allocate();
      const Slot tail = row == 0 ? p.new_tail : st.pages.back().slot;
      if constexpr (kDeviceFast) {
        st.tail_host.resize(c.page_bytes());
        m_.write_token(st.tail_host.data(), row, k_.row(p.batch_index, p.head), v_.row(p.batch_index, p.head));
        m_.tiers_.fast().upload(tail, 0, st.tail_host.data(), c.page_bytes());
      } else {
        m_.write_token(m_.tiers_.fast().slot_data(tail), row, k_.row(p.batch_index, p.head), v_.row(p.batch_index, p.head));
      }
      p.seals = row == c.page_tokens - 1;
      p.q.resize(static_cast<std::size_t>(g) * d);
      for (int j = 0; j < g; ++j)
        std::copy_n(q_.row(p.batch_index, p.head * g + j), d, p.q.data() + static_cast<std::size_t>(j) * d);
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

    /// An index's selection must be candidates, ascending.
    static void check_selection(const StepPlan& p, const index::IndexQuery& query) {
      for (std::size_t s = 0; s < p.selected.size(); ++s) {
        const std::uint32_t page = p.selected[s];
        KVD_EXPECT(page >= query.first_candidate && page < query.end_candidate && (s == 0 || page > p.selected[s - 1]),
                   "index '{}' selected page {} outside candidates [{}, {}) or out of order", Index::name(), page, query.first_candidate,
                   query.end_candidate);
      }
    }

    /// The device fast tier's path of compute(): the streams' page lists (slot addresses in
    /// device memory) go to the backend as one PagedDecode, and the results come back to the
    /// plans, as compute_one leaves them.
    void compute_on_device(std::size_t first, std::size_t last) {
      const Config& c = m_.cfg_;
      const std::size_t g = static_cast<std::size_t>(c.group()), d = static_cast<std::size_t>(c.shape.head_dim);
      std::vector<float> q, out, lse, page_lse;
      std::vector<std::uint32_t> offsets{0};
      std::vector<const std::byte*> pages;
      std::vector<std::int32_t> tokens;
      for (std::size_t i = first; i < last; ++i) {
        StepPlan& p = m_.plans_[i];
        prepare_splits(p);
        for (std::uint32_t page : p.attended) {
          p.refs.push_back(page_ref(p, page));
          pages.push_back(static_cast<const std::byte*>(p.refs.back().k));
          tokens.push_back(p.refs.back().tokens);
        }
        q.insert(q.end(), p.q.begin(), p.q.end());
        offsets.push_back(static_cast<std::uint32_t>(pages.size()));
      }
      out.resize((last - first) * g * d);
      lse.resize((last - first) * g);
      page_lse.resize(pages.size() * g);
      backend::PagedDecode pd;
      pd.dtype = c.dtype;
      pd.group = c.group();
      pd.head_dim = c.shape.head_dim;
      pd.page_tokens = c.page_tokens;
      pd.block_bytes = c.block_bytes();
      pd.scale = c.scale();
      pd.streams = last - first;
      pd.q = q.data();
      pd.offsets = offsets;
      pd.pages = pages;
      pd.tokens = tokens;
      pd.out = out.data();
      pd.lse = lse.data();
      pd.page_lse = page_lse.data();
      m_.backend_.attend(pd);
      for (std::size_t i = first; i < last; ++i) {
        StepPlan& p = m_.plans_[i];
        const std::size_t j = i - first;
        p.out.assign(out.begin() + static_cast<std::ptrdiff_t>(j * g * d), out.begin() + static_cast<std::ptrdiff_t>((j + 1) * g * d));
        p.lse.assign(lse.begin() + static_cast<std::ptrdiff_t>(j * g), lse.begin() + static_cast<std::ptrdiff_t>((j + 1) * g));
        std::copy_n(page_lse.begin() + static_cast<std::ptrdiff_t>(offsets[j] * g), p.attended.size() * g, p.page_lse.begin());
        std::fill(p.split_done.begin(), p.split_done.end(), std::uint8_t{1});
        score_cache_pages(p);
      }
    }

    /// Device fast tier: uploads the pages fetch_start read into host staging pages to their
    /// cache slots, in one batch, and frees the staging pages.
    void upload_staged(std::size_t first, std::size_t last) {
      std::vector<tier::SlotUpload> up;
      for (std::size_t i = first; i < last; ++i) {
        const StepPlan& p = m_.plans_[i];
        for (std::size_t k = 0; k < p.bounce.size(); ++k) up.push_back({p.staged[k], m_.bounce_.data(p.bounce[k])});
      }
      m_.tiers_.fast().upload_pages(up);
      for (std::size_t i = first; i < last; ++i) release_bounce(m_.plans_[i]);
    }

    void release_bounce(StepPlan& p) {
      for (Slot s : p.bounce) m_.bounce_.release(s);
      p.bounce.clear();
    }

    /// The bytes of the page p's step seals, in host memory.
    const std::byte* sealed_bytes(const StepPlan& p) const {
      if constexpr (kDeviceFast)
        return p.stream->tail_host.data();
      else
        return m_.tiers_.fast().slot_data(p.tail_slot());
    }

    KvManager& m_;
    int layer_;
    std::span<const SeqId> batch_;
    View<const float, 3> k_, v_, q_;
    View<float, 3> out_;
    std::vector<std::pair<std::uint8_t, tier::PageKey>> written_;
    std::vector<SealedPage> seals_;
    std::vector<std::uint32_t> evicted_;
    bool prepared_ = false;
    std::exception_ptr read_error_;
  };

  // ---- helpers -------------------------------------------------------------------------------

  void check_step_inputs(int layer, std::span<const SeqId> batch, View<const float, 3> q, View<const float, 3> k,
                         View<const float, 3> v, View<float, 3> out) {
    check_layer(layer);
    KVD_EXPECT(!batch.empty(), "attend: empty batch");
    const auto b = static_cast<std::int64_t>(batch.size());
    check_q_view(q, "attend: q", b);
    check_q_view(View<const float, 3>(out), "attend: out", b);
    check_kv_view(k, "attend: k", b);
    check_kv_view(v, "attend: v", b);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      usable_sequence(batch[i]);
      for (std::size_t j = 0; j < i; ++j)
        KVD_EXPECT(batch[i] != batch[j], "attend: sequence {} appears twice in the batch", batch[i]);
    }
  }

  /// A step's stages with commit turned off: for calibration runs that are then rolled back.
  template <class S>
  struct DryRun {
    S& s;
    std::size_t streams() const { return s.streams(); }
    void select(std::size_t i) { s.select(i); }
    void select_range(std::size_t a, std::size_t b) { s.select_range(a, b); }
    void classify(std::size_t i) { s.classify(i); }
    void fetch(std::size_t i) { s.fetch(i); }
    void fetch_range(std::size_t a, std::size_t b) { s.fetch_range(a, b); }
    void fetch_start(std::size_t a, std::size_t b) { s.fetch_start(a, b); }
    void fetch_finish(std::size_t a, std::size_t b) { s.fetch_finish(a, b); }
    // No prepare_commit: its writes are durable and real; a dry step must not make them.
    void compute(std::size_t a, std::size_t b) { s.compute(a, b); }
    void compute_ready(std::size_t a, std::size_t b) { s.compute_ready(a, b); }
    void commit() {}
    void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) { s.parallel_for(n, fn); }
    StageTimes& times() { return s.times(); }
  };

  Sequence& sequence(SeqId id) {
    return const_cast<Sequence&>(static_cast<const KvManager*>(this)->sequence(id));
  }
  const Sequence& sequence(SeqId id) const {
    auto it = sequences_.find(id);
    if (it != sequences_.end()) return it->second;
    if (id < next_id_) fail("sequence {} was released and cannot be used again", id);
    fail("unknown sequence {} (add_sequence returns the ids)", id);
  }
  Sequence& usable_sequence(SeqId id) {
    Sequence& s = sequence(id);
    KVD_EXPECT(!s.broken, "sequence {} is unusable after a failed commit: release it", id);
    return s;
  }
  Stream& stream(Sequence& s, int layer, int head) {
    return s.streams[static_cast<std::size_t>(layer) * cfg_.shape.kv_heads + head];
  }
  const Stream& stream(const Sequence& s, int layer, int head) const {
    KVD_EXPECT(head >= 0 && head < cfg_.shape.kv_heads, "KV head {} out of range [0, {})", head,
               cfg_.shape.kv_heads);
    return s.streams[static_cast<std::size_t>(layer) * cfg_.shape.kv_heads + head];
  }

  void check_layer(int layer) const {
    KVD_EXPECT(layer >= 0 && layer < cfg_.shape.layers, "layer {} out of range [0, {})", layer,
               cfg_.shape.layers);
  }
  void check_kv_view(const View<const float, 3>& v, const char* what, std::int64_t rows) const {
    KVD_EXPECT(v.data != nullptr || v.extent(0) == 0, "{}: null data", what);
    KVD_EXPECT(rows < 0 || v.extent(0) == rows, "{}: {} rows, expected {} (the batch size)", what,
               v.extent(0), rows);
    KVD_EXPECT(v.extent(1) == cfg_.shape.kv_heads, "{}: {} heads, expected kv_heads = {}", what,
               v.extent(1), cfg_.shape.kv_heads);
    KVD_EXPECT(v.extent(2) == cfg_.shape.head_dim, "{}: head_dim {} does not match the config's {}",
               what, v.extent(2), cfg_.shape.head_dim);
    KVD_EXPECT(v.strides[2] == 1, "{}: innermost stride is {}, expected 1", what, v.strides[2]);
  }
  void check_q_view(const View<const float, 3>& v, const char* what, std::int64_t rows) const {
    KVD_EXPECT(v.data != nullptr, "{}: null data", what);
    KVD_EXPECT(v.extent(0) == rows, "{}: {} rows, expected {} (the batch size)", what, v.extent(0), rows);
    KVD_EXPECT(v.extent(1) == cfg_.shape.q_heads, "{}: {} heads, expected q_heads = {}", what,
               v.extent(1), cfg_.shape.q_heads);
    KVD_EXPECT(v.extent(2) == cfg_.shape.head_dim, "{}: head_dim {} does not match the config's {}",
               what, v.extent(2), cfg_.shape.head_dim);
    KVD_EXPECT(v.strides[2] == 1, "{}: innermost stride is {}, expected 1", what, v.strides[2]);
  }

  /// Stores row `row` of a page: K at row*d in the K block, V in the V block, in the KV dtype.
  void write_token(std::byte* page, int row, const float* k, const float* v) const {
    const int d = cfg_.shape.head_dim;
    dispatch_dtype(cfg_.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* kb = reinterpret_cast<T*>(page) + static_cast<std::size_t>(row) * d;
      T* vb = reinterpret_cast<T*>(page + cfg_.block_bytes()) + static_cast<std::size_t>(row) * d;
      for (int j = 0; j < d; ++j) {
        kb[j] = from_float<T>(k[j]);
        vb[j] = from_float<T>(v[j]);
      }
    });
  }

  static constexpr std::size_t kLastTier = TierList::kCount - 1;

  /// The remote tier's digest for a prefix: the engine's digest mixed with this manager's page
  /// layout, so pages only meet managers that store them alike.
  PrefixDigest remote_digest(const PrefixDigest& prefix) const {
    const std::int64_t layout[] = {static_cast<std::int64_t>(prefix.low), static_cast<std::int64_t>(prefix.high), prefix.tokens,
                                   cfg_.shape.layers, cfg_.shape.q_heads, cfg_.shape.kv_heads, cfg_.shape.head_dim,
                                   cfg_.page_tokens, static_cast<std::int64_t>(cfg_.dtype)};
    return PrefixDigest::of_bytes(layout, sizeof layout, prefix.tokens);
  }

  /// Hands the sealed pages inside the sequence's shared prefix to the remote tier (best effort,
  /// in the background: it copies them and never throws for the server's trouble).
  void publish_prefix_pages(const Sequence& seq, std::span<const SealedPage> seals) {
    if constexpr (kRemote) {
      if (remote_ == nullptr || seq.shared_pages == 0) return;
      try {
        std::vector<tier::WriteRequest> pages;
        for (const SealedPage& p : seals)
          if (p.key.page < seq.shared_pages && p.key.page >= seq.loaded_pages) pages.push_back({p.key, p.bytes});
        remote_->publish(seq.shared_digest, pages);
      } catch (...) {  // out of memory: not sharing these pages is allowed; prefill goes on
      }
    }
  }

  /// The fast tier's memory is where fetched pages land: each new block of it is registered
  /// with every backing tier that reads into registered memory (SsdTier: io_uring fixed
  /// buffers, Decision 9). A tier that cannot register just reads as before.
  /// With a device fast tier, the memory reads land in is the host staging pool instead; the
  /// fast tier pins it (cudaHostRegister) so that uploads from it are asynchronous DMA.
  void register_fast_memory() {
    const auto register_with_backing = [this](std::byte* p, std::size_t bytes) {
      for (std::size_t i = 1; i < TierList::kCount; ++i)
        tiers_.visit(i, [&](auto& t) {
          if constexpr (requires { t.register_memory(p, bytes); }) (void)t.register_memory(p, bytes);
        });
    };
    if constexpr (kDeviceFast) {
      bounce_.open(cfg_.page_bytes(), 4096, 0, [this, register_with_backing](std::byte* p, std::size_t bytes) {
        register_with_backing(p, bytes);
        tiers_.fast().pin_host(p, bytes);  // last: it does not fail, so a pinned block is never freed by the pool
      });
    } else if constexpr (requires(Fast& f, tier::PagePool::BlockHook h) { f.add_block_hook(h); }) {
      tiers_.fast().add_block_hook(register_with_backing);
    }
  }

  /// Pages on tier `home` are attended where they are (Decision 7): host memory, with a host
  /// fast tier. A device backend attends only its own memory, so every page passes through it.
  static constexpr bool attends_in_place(std::size_t home) { return !kDeviceFast && TierList::addressable(home); }

  /// Host staging pages for one call (warm_up's reads with a device fast tier), freed with it.
  struct StagingPages {
    KvManager& m;
    std::vector<Slot> slots;
    explicit StagingPages(KvManager& mgr) : m(mgr) {}
    StagingPages(const StagingPages&) = delete;
    StagingPages& operator=(const StagingPages&) = delete;
    ~StagingPages() {
      for (Slot s : slots) m.bounce_.release(s);
    }
    std::byte* add() {
      slots.reserve(slots.size() + 1);
      slots.push_back(m.bounce_.allocate());
      return m.bounce_.data(slots.back());
    }
  };

  /// Writes one batch of pages to backing tier `i`, in one write_batch() where the tier has one
  /// (SsdTier syncs once per batch), recording each page in `written` as soon as it is stored so
  /// the caller can undo them on failure.
  void write_pages(std::size_t i, std::span<const tier::WriteRequest> reqs,
                   std::vector<std::pair<std::uint8_t, tier::PageKey>>& written) {
    if (reqs.empty()) return;
    const auto home = static_cast<std::uint8_t>(i);
    written.reserve(written.size() + reqs.size());  // recording them after the write must not fail
    tiers_.visit(i, [&](auto& t) {
      if constexpr (requires { t.write_batch(reqs); }) {
        t.write_batch(reqs);
        for (const tier::WriteRequest& r : reqs) written.emplace_back(home, r.key);
      } else {
        for (const tier::WriteRequest& r : reqs) {
          t.write(r.key, r.src);
          written.emplace_back(home, r.key);
        }
      }
    });
  }

  /// Writes sealed pages to the backing tiers and sets each page's home, the nearest tier that
  /// holds it (0 when there is no backing tier: the page stays in the fast tier). The last tier
  /// keeps every page. With `copy_to_middle` (pages sealed while decoding), a copy also goes to
  /// the first middle tier with room; prompt pages reach the middle tiers through placement
  /// (warm_up), by importance. Appends each page written to `written`.
  void store_sealed(std::span<SealedPage> pages, std::vector<std::pair<std::uint8_t, tier::PageKey>>& written,
                    bool copy_to_middle) {
    if constexpr (TierList::kCount == 1) {
      for (SealedPage& p : pages) p.home = 0;
    } else {
      if (pages.empty()) return;
      std::vector<tier::WriteRequest> reqs;
      for (const SealedPage& p : pages) reqs.push_back({p.key, p.bytes});
      const std::size_t room = tiers_.visit(kLastTier, [](auto& t) -> std::size_t { return t.free_pages(); });
      if (room < pages.size())
        fail("backing tier {} (tier {}, the last, which keeps every page) is full: cannot store page {}",
             tiers_.visit(kLastTier, [](auto& t) { return std::string(t.name()); }), kLastTier, pages[room].key);
      write_pages(kLastTier, reqs, written);
      for (SealedPage& p : pages) p.home = static_cast<std::uint8_t>(kLastTier);
      if (!copy_to_middle) return;
      std::size_t next = 0;
      for (std::size_t i = 1; i < kLastTier && next < pages.size(); ++i) {
        const std::size_t n = std::min(pages.size() - next, tiers_.visit(i, [](auto& t) -> std::size_t { return t.free_pages(); }));
        write_pages(i, std::span<const tier::WriteRequest>(reqs).subspan(next, n), written);
        for (std::size_t j = next; j < next + n; ++j) pages[j].home = static_cast<std::uint8_t>(i);
        next += n;
      }
    }
  }

  /// Semantic packing is possible: the index groups pages into clusters, and the last tier is
  /// a store read through fetches that takes batches.
  static constexpr bool kCanPack = [] {
    if constexpr (TierList::kCount == 1) {
      return false;
    } else {
      using Last = std::remove_cvref_t<decltype(std::declval<TierList&>().template get<kLastTier>())>;
      return !Last::kAddressable &&
             requires(const Index& ix, const typename Index::State& s, Last& t, std::span<const tier::WriteRequest> w) {
               { ix.cluster_of(s, std::uint32_t{0}) } -> std::convertible_to<std::uint32_t>;
               t.write_batch(w);
             };
    }
  }();

  /// Rewrites a stream's prompt pages (`pages`, ascending, with their bytes) on the last tier
  /// ordered by (cluster, page), in one batch, so that each cluster's pages take consecutive
  /// slots. Skips a stream whose clusters already follow page order. Returns the pages written.
  /// The bytes are the same, so a failure leaves every page readable as before.
  std::size_t pack_by_cluster(const Stream& st, const tier::PageKey& base, const std::vector<std::uint32_t>& pages,
                              const std::vector<std::byte>& bytes) {
    if constexpr (kCanPack) {
      std::vector<std::size_t> order(pages.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      const auto cluster = [&](std::size_t i) { return static_cast<std::uint32_t>(index_.cluster_of(st.index, pages[i])); };
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cluster(a) < cluster(b); });
      if (std::is_sorted(order.begin(), order.end())) return 0;
      // An overwrite takes fresh slots before it frees the old ones: pack only with that room,
      // since the layout is an optimisation and warm-up must not fail for want of it.
      if (tiers_.template get<kLastTier>().free_pages() < pages.size()) return 0;
      std::vector<tier::WriteRequest> reqs;
      reqs.reserve(order.size());
      for (std::size_t i : order) {
        tier::PageKey key = base;
        key.page = pages[i];
        reqs.push_back({key, bytes.data() + i * cfg_.page_bytes()});
      }
      tiers_.template get<kLastTier>().write_batch(reqs);
      return reqs.size();
    } else {
      (void)st, (void)base, (void)pages, (void)bytes;
      return 0;
    }
  }

  /// Placement below the cache: walks the ranking past the pages chosen for the cache and copies
  /// the next ones into the middle tiers, in tier order, each up to its per-stream share. The
  /// bytes come from the last tier's pages as warm-up read them (`last_pages`, ascending, and
  /// `last_bytes`). Records each copy in `placed` and `written`; homes change at commit.
  void place_in_middle_tiers(const Stream& st, const tier::PageKey& base, const tier::PageRanking& ranking,
                             const std::vector<std::pair<std::uint32_t, float>>& chosen, const std::array<std::size_t, kMaxTiers>& share,
                             const std::vector<std::uint32_t>& last_pages, const std::vector<std::byte>& last_bytes,
                             std::vector<std::pair<std::uint32_t, std::uint8_t>>& placed,
                             std::vector<std::pair<std::uint8_t, tier::PageKey>>& written) {
    std::vector<char> cached(st.pages.size(), 0);
    for (const auto& c : chosen) cached[c.first] = 1;
    std::size_t to = 1;
    std::size_t left = share[1];
    std::array<std::vector<tier::WriteRequest>, kMaxTiers> writes;
    for (std::uint32_t page : ranking.pages) {
      const PageEntry& e = st.pages[page];
      if (cached[page] || e.slot >= 0 || e.home != kLastTier) continue;
      while (left == 0 && ++to < kLastTier) left = share[to];
      if (to >= kLastTier) break;
      const auto at = std::lower_bound(last_pages.begin(), last_pages.end(), page);
      KVD_EXPECT(at != last_pages.end() && *at == page, "warm_up: page {} of the last tier was not read", page);
      tier::PageKey key = base;
      key.page = page;
      writes[to].push_back({key, last_bytes.data() + static_cast<std::size_t>(at - last_pages.begin()) * cfg_.page_bytes()});
      --left;
    }
    for (std::size_t i = 1; i < kLastTier; ++i) {
      write_pages(i, writes[i], written);
      for (const tier::WriteRequest& w : writes[i]) placed.emplace_back(w.key.page, static_cast<std::uint8_t>(i));
    }
  }

  /// Forgets a backed page on every tier that holds it: its home and the last tier.
  void erase_backed(std::uint8_t home, const tier::PageKey& key) {
    if (home == 0) return;
    tiers_.visit(home, [&](auto& t) { t.erase(key); });
    if (home != kLastTier) tiers_.visit(kLastTier, [&](auto& t) { t.erase(key); });
  }

  /// Appends the keys of a page (its bytes in host memory) to `keys`, as float, for the index.
  void append_page_keys(const std::byte* bytes, std::vector<float>& keys) const {
    const std::size_t rows = static_cast<std::size_t>(cfg_.page_tokens) * cfg_.shape.head_dim;
    const std::size_t at = keys.size();
    keys.resize(at + rows);
    dispatch_dtype(cfg_.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      attention::to_float_block(reinterpret_cast<const T*>(bytes), keys.data() + at, rows);
    });
  }

  /// The index's view of n consecutive pages' keys, starting at page `first`.
  index::PageKeys page_keys_view(std::uint32_t first, std::int64_t n, const std::vector<float>& keys) const {
    index::PageKeys pk;
    pk.data = keys.data();
    pk.first_page = first;
    pk.pages = n;
    pk.page_tokens = cfg_.page_tokens;
    pk.head_dim = cfg_.shape.head_dim;
    pk.dtype = cfg_.dtype;
    return pk;
  }

  /// Frees the fast slots of backed pages that left the local window for the next step and are
  /// not cached. Sink pages and pages with no backing tier keep their slots.
  void slide_local_window(Stream& st) {
    const PageRanges next = page_ranges(st.pages.tokens + 1, cfg_.page_tokens, cfg_.sink_tokens, cfg_.local_tokens);
    for (std::int64_t page = std::max(st.pages.released_below, next.sink_end); page < next.local_begin; ++page) {
      PageEntry& e = st.pages[static_cast<std::size_t>(page)];
      if (e.home == 0 || e.slot < 0 || eviction_.contains(st.cache, static_cast<std::uint32_t>(page))) continue;
      tiers_.fast().release(e.slot);
      e.slot = -1;
    }
    st.pages.released_below = std::max(st.pages.released_below, next.local_begin);
  }

  /// A page's bytes: its fast slot, its address on an addressable tier, or read into `scratch`
  /// (from its tier, or downloaded from a device fast tier).
  const std::byte* resident_page(const PageEntry& e, const tier::PageKey& key, std::byte* scratch) {
    if (e.slot >= 0) {
      if constexpr (kDeviceFast) {
        tiers_.fast().download(e.slot, scratch);
        return scratch;
      } else {
        return tiers_.fast().slot_data(e.slot);
      }
    }
    const std::byte* addr = nullptr;
    tiers_.visit(e.home, [&](auto& t) {
      using T = std::remove_cvref_t<decltype(t)>;
      if constexpr (tier::AddressableTier<T>) {
        addr = t.address(key);
      } else {
        const tier::ReadRequest read{key, scratch};
        t.wait(t.submit(std::span<const tier::ReadRequest>(&read, 1)));
        addr = scratch;
      }
    });
    KVD_EXPECT(addr != nullptr, "page {} has no bytes on tier {}", key, e.home);
    return addr;
  }

  /// Checks observation queries [observed][q_heads][head_dim] for a prefilled layer; returns the
  /// layer's prompt tokens.
  std::int64_t check_observation(const Sequence& seq, int layer, View<const float, 3> q_obs, const char* what) const {
    check_q_view(q_obs, fmt::format("{}: q_obs", what).c_str(), q_obs.extent(0));
    const std::int64_t tokens = stream(seq, layer, 0).pages.tokens;
    KVD_EXPECT(q_obs.extent(0) >= 1 && q_obs.extent(0) <= tokens, "{}: {} observation queries for a prompt of {} tokens", what,
               q_obs.extent(0), tokens);
    return tokens;
  }

  /// KV head h's group of query heads from q_obs, as [observed][group][head_dim] in `out`.
  void group_queries(View<const float, 3> q_obs, int h, std::vector<float>& out) const {
    const int g = cfg_.group(), d = cfg_.shape.head_dim;
    out.resize(static_cast<std::size_t>(q_obs.extent(0)) * g * d);
    for (std::int64_t i = 0; i < q_obs.extent(0); ++i)
      for (int j = 0; j < g; ++j) std::copy_n(q_obs.row(i, h * g + j), d, out.data() + (static_cast<std::size_t>(i) * g + j) * d);
  }

  /// The keys of a stream's first `tokens` tokens as float, [tokens][head_dim], in `keys`. Pages
  /// that left the fast tier are read back (into `scratch`, counted in key_bytes). With
  /// `last_pages`, the ids and bytes of the pages that live on the last tier are appended to it
  /// and to `last_bytes`.
  void read_stream_keys(const Stream& st, const tier::PageKey& base, std::int64_t tokens, std::vector<float>& keys,
                        std::byte* scratch, std::array<std::uint64_t, kMaxTiers>& key_bytes,
                        std::vector<std::uint32_t>* last_pages, std::vector<std::byte>* last_bytes) {
    const int d = cfg_.shape.head_dim, pt = cfg_.page_tokens;
    keys.assign(static_cast<std::size_t>(tokens) * d, 0.0f);
    for (std::int64_t page = 0; page * pt < tokens; ++page) {
      tier::PageKey key = base;
      key.page = static_cast<std::uint32_t>(page);
      const PageEntry& e = st.pages[static_cast<std::size_t>(page)];
      const std::byte* bytes = resident_page(e, key, scratch);
      if (e.slot < 0 && bytes == scratch) key_bytes[e.home] += cfg_.page_bytes();
      if (last_pages && e.home == kLastTier) {
        last_pages->push_back(key.page);
        last_bytes->insert(last_bytes->end(), bytes, bytes + cfg_.page_bytes());
      }
      const auto rows = static_cast<std::size_t>(std::min<std::int64_t>(pt, tokens - page * pt));
      dispatch_dtype(cfg_.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        attention::to_float_block(reinterpret_cast<const T*>(bytes), keys.data() + static_cast<std::size_t>(page) * pt * d, rows * d);
      });
    }
  }

  /// One step of grow_windows(): see there. Runs after the step applied, so it allocates nothing.
  void grow_window(int layer, std::span<const SeqId> batch, const StageTimes& t) {
    int& seen = growth_steps_[static_cast<std::size_t>(layer)];
    if (seen >= growth_->steps) return;
    ++seen;
    if (!plan_ || t.classify_ms + t.fetch_ms <= t.select_ms) return;  // no plan: cleared by hand
    const int kvh = cfg_.shape.kv_heads;
    const auto budget_of = [&](const Stream& st) {
      return cache_capacity(1, page_ranges(st.pages.tokens + 1, cfg_.page_tokens, cfg_.sink_tokens, cfg_.local_tokens));
    };
    // Room already promised: caches that have not yet filled to their W (they fill over the
    // next W steps, so free pages overstate what is left).
    std::size_t promised = 0;
    for (const auto& [id, seq] : sequences_)
      for (std::size_t i = 0; i < seq.streams.size(); ++i) {
        const Stream& st = seq.streams[i];
        const std::size_t cap = budget_of(st) * static_cast<std::size_t>(plan_->windows[i]);
        promised += cap - std::min(cap, eviction_.size(st.cache));
      }
    std::size_t needed = 0, staging = 0;
    bool can_grow = false;
    for (int h = 0; h < kvh; ++h) {
      if (plan_->window(layer, h) >= growth_->max_window) continue;
      can_grow = true;
      for (const auto& [id, seq] : sequences_) needed += budget_of(seq.streams[static_cast<std::size_t>(layer) * kvh + h]);
    }
    if (!can_grow) return;
    for (SeqId id : batch)
      for (int h = 0; h < kvh; ++h) staging += budget_of(stream(sequence(id), layer, h));
    const std::size_t free = tiers_.fast().free_pages();
    if (free < promised || free - promised < needed || free - promised - needed < staging) return;
    for (int h = 0; h < kvh; ++h) {
      int& w = plan_->windows[static_cast<std::size_t>(layer) * kvh + h];
      if (w < growth_->max_window) ++w;  // a head planned above max_window keeps its W
    }
    ++growth_grown_[static_cast<std::size_t>(layer)];
  }

  /// Index states built by `index` over each head's first `sealed` pages' keys (keys[head]).
  std::vector<typename Index::State> build_indexes(const Index& index, std::uint32_t sealed, const std::vector<std::vector<float>>& keys) const {
    std::vector<typename Index::State> fresh(keys.size());
    if (sealed > 0)
      for (std::size_t h = 0; h < keys.size(); ++h) index.build(fresh[h], page_keys_view(0, sealed, keys[h]));
    return fresh;
  }
  /// Gives one layer's streams the states build_indexes() made, and counts the key reads.
  void install_indexes(Sequence& seq, int layer, std::vector<typename Index::State>& fresh,
                       const std::array<std::uint64_t, kMaxTiers>& key_bytes) noexcept {
    for (std::size_t h = 0; h < fresh.size(); ++h) stream(seq, layer, static_cast<int>(h)).index = std::move(fresh[h]);
    for (std::size_t i = 0; i < kMaxTiers; ++i) total_.bytes_read[i] += key_bytes[i];
  }

  /// W x the budget of a step with these ranges.
  std::size_t cache_capacity(int window, const PageRanges& r) const {
    return static_cast<std::size_t>(std::max(0, window)) * static_cast<std::size_t>(cfg_.budget.pages_for(r.candidates()));
  }

  Config cfg_;
  std::optional<eviction::WindowPlan> plan_;
  std::optional<WindowGrowth> growth_;
  std::vector<int> growth_steps_, growth_grown_;  ///< per layer: steps seen, times grown
  Index index_;
  Eviction eviction_;
  /// Device fast tier: pinned host pages that misses are read into before their upload. Declared
  /// before tiers_ so that it outlives them (the fast tier unpins it when it closes).
  tier::PagePool bounce_;
  TierList tiers_;
  Pipeline pipeline_;
  Backend backend_;
  [[no_unique_address]] std::conditional_t<kRemote, Remote*, tier::NoRemote> remote_{};
  std::unordered_map<SeqId, Sequence> sequences_;
  SeqId next_id_ = 1;
  std::vector<StepPlan> plans_;
  Stats last_, total_;
};

}  // namespace kvdrive
