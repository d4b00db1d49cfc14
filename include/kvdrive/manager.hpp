// KvManager: the KV cache of many sequences across the tiers, with sparse decode attention.
// An engine calls it once per layer per decode step in place of its attention:
//
//   auto id = kv.add_sequence(prompt_tokens);      // optional: the prompt's ids, or a prefix digest (Decision 10)
//   kv.prefill(id, layer, K, V);                   // per layer: the prompt's keys and values
//   kv.attend(layer, batch, q, k, v, out);         // per layer per step: append + attend
//   kv.release(id);
//
// With a remote tier (Remote = tier::RedisTier across engines, tier::PrefixStore on local disk
// across runs; share_prefixes()), sequences share the pages of a common prompt prefix: prefill
// publishes the prefix's pages, and load_prefix() lets a later sequence, in this engine or
// another, read them instead of computing them (docs/remote.md).
//
// This class is a facade: each member checks its inputs and hands the work to one unit of
// manager/ over the shared state (manager/core.hpp): prefill.hpp, warm_up.hpp, step.hpp (one
// decode step, top to bottom), tuning.hpp, prefix_share.hpp; every byte moves through
// page_store.hpp, and what a call allocated or wrote before its point of no return is undone
// through page_edit.hpp (Decision 8: a call that fails changes nothing). Not thread-safe: one
// caller at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvdrive/backend/concept.hpp"
#include "kvdrive/backend/cpu.hpp"
#include "kvdrive/core/config.hpp"
#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/stats.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/eviction/concept.hpp"
#include "kvdrive/eviction/window_plan.hpp"
#include "kvdrive/index/cluster_size.hpp"
#include "kvdrive/index/concept.hpp"
#include "kvdrive/manager/checks.hpp"
#include "kvdrive/manager/core.hpp"
#include "kvdrive/manager/page_store.hpp"
#include "kvdrive/manager/prefill.hpp"
#include "kvdrive/manager/prefix_share.hpp"
#include "kvdrive/manager/step.hpp"
#include "kvdrive/manager/tuning.hpp"
#include "kvdrive/manager/warm_up.hpp"
#include "kvdrive/pipeline/concept.hpp"
#include "kvdrive/pipeline/serial.hpp"
#include "kvdrive/tier/host.hpp"
#include "kvdrive/tier/placement.hpp"
#include "kvdrive/tier/remote.hpp"
#include "kvdrive/tier/tiers.hpp"

namespace kvdrive {

template <index::IndexPolicy Index, eviction::EvictionPolicy Eviction, class TierList = Tiers<tier::HostTier>,
          pipeline::PipelinePolicy Pipeline = pipeline::Serial, class Backend = backend::Cpu, class Remote = tier::NoRemote>
class KvManager {
  using Core = manager::Core<Index, Eviction, TierList, Pipeline, Backend, Remote>;
  static constexpr bool kDeviceFast = Core::kDeviceFast;
  static constexpr bool kRemote = Core::kRemote;
  static_assert(backend::Backend<Backend>, "KvManager: the backend needs parallel_for(n, fn)");
  static_assert(std::is_nothrow_move_constructible_v<typename Index::State> && std::is_nothrow_move_constructible_v<typename Eviction::State>,
                "KvManager: the index's and the eviction policy's State must move without throwing (they live in vectors "
                "that grow); use std::vector rather than std::deque, or give the State a noexcept move constructor");
  static_assert(kDeviceFast == backend::DeviceBackend<Backend>,
                "KvManager: a fast tier in device memory (cuda::DeviceTier) needs a backend that attends it "
                "(backend::Cuda), and such a backend needs a device fast tier");
  static_assert(!kRemote || tier::RemoteTier<Remote>,
                "KvManager: the Remote parameter must be a tier::RemoteTier (tier::RedisTier) or tier::NoRemote");

 public:
  using PrefixLoad = manager::PrefixLoad;
  using TuneReport = manager::TuneReport;
  using WindowGrowth = manager::WindowGrowth;

  explicit KvManager(Config config, Index index = {}, Eviction eviction = {}, TierList tiers = {}, Pipeline pipeline = {}, Backend backend = {})
      : core_(std::move(config), std::move(index), std::move(eviction), std::move(tiers), std::move(pipeline), std::move(backend)) {
    Config& cfg = core_.cfg;
    cfg.validate();
    index::check_for_head_dim(core_.index, cfg.shape.head_dim);
    if constexpr (requires { core_.backend.validate(cfg); }) core_.backend.validate(cfg);  // e.g. the CUDA kernels' limits
    if constexpr (requires {
                    core_.tiers.fast().device();
                    core_.backend.device();
                  })
      KVD_EXPECT(core_.tiers.fast().device() == core_.backend.device(), "KvManager: the fast tier is on device {} but the backend on device {}",
                 core_.tiers.fast().device(), core_.backend.device());
    if constexpr (requires {
                    core_.tiers.fast().device();
                    core_.index.device;
                  })
      KVD_EXPECT(core_.tiers.fast().device() == core_.index.device, "KvManager: the fast tier is on device {} but the index selects on device {}",
                 core_.tiers.fast().device(), core_.index.device);
    store_.register_fast_memory();
    core_.tiers.open(tier::TierGeometry{store_.page_bytes()}, tier::TierGeometry{store_.stored_bytes()});
  }

  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  ~KvManager() {
    for (SeqId id : core_.sequences.ids()) release(id);
  }

  // ---- sequences -----------------------------------------------------------------------------

  /// Starts a sequence; `digest` identifies its prompt prefix for content-addressed tiers, which
  /// then share its pages only with sequences whose prefix has the same digest.
  SeqId add_sequence(std::optional<PrefixDigest> digest = std::nullopt) {
    auto [id, s] = start_sequence(digest);
    if (kRemote) manager::mark_shared(core_.cfg, s, digest);
    return id;
  }
  /// Starts a sequence whose prompt begins with `prefix_tokens` (token ids): content-addressed
  /// tiers share its whole pages with any prompt that begins with the same pages, whatever
  /// follows (a long document with a new question reads the document's pages back).
  SeqId add_sequence(std::span<const std::int32_t> prefix_tokens) {
    auto [id, s] = start_sequence(PrefixDigest::of_tokens(prefix_tokens));
    if (kRemote) manager::mark_shared(core_.cfg, s, prefix_tokens);
    return id;
  }

  /// Frees every page of the sequence in every tier. The id may not be used again.
  void release(SeqId id) {
    auto& s = core_.sequences.find(id);
    for (std::size_t i = 0; i < s.streams.size(); ++i) {
      const tier::PageKey base{id, static_cast<std::uint32_t>(i / core_.cfg.shape.kv_heads), static_cast<std::uint32_t>(i % core_.cfg.shape.kv_heads),
                               0};
      const PageTable& pages = s.streams[i].pages;
      for (std::size_t p = 0; p < pages.size(); ++p) {
        if (pages[p].slot >= 0) core_.tiers.fast().release(pages[p].slot);
        store_.erase_backed(pages[p].home, tier::PageKey{base.sequence, base.layer, base.head, static_cast<std::uint32_t>(p)});
      }
    }
    core_.sequences.erase(id);  // its shared pages stay on the remote tier, for other engines
    sync_erases();
  }

  std::optional<PrefixDigest> prefix_digest(SeqId id) const { return core_.sequences.find(id).digest; }
  /// The content keys of the sequence's shared pages on a remote tier (empty if it shares none):
  /// entry p names page p of every layer and head (manager/prefix_share.hpp).
  std::span<const PrefixDigest> shared_chain(SeqId id) const { return core_.sequences.find(id).shared_chain; }

  /// Tokens stored for one layer of a sequence (prefill plus decoded).
  std::int64_t length(SeqId id, int layer) const {
    core_.check_layer(layer);
    return core_.stream(core_.sequences.find(id), layer, 0).pages.tokens;
  }

  // ---- sharing prefixes through a remote tier ------------------------------------------------

  /// Shares prompt prefixes through `remote` (kept by the caller; it must outlive the manager):
  /// from now on, a sequence added with its prompt's token ids (or a PrefixDigest) publishes its
  /// whole pages as prefill seals them, and load_prefix() reads them. The keys chain the tokens
  /// from this manager's layout (shape, page size, dtype), so managers that lay pages out
  /// differently never share. The remote tier is never the only copy of a page:
  /// every page is also on this manager's own tiers.
  void share_prefixes(Remote& remote) requires kRemote {
    if constexpr (requires { remote.params().model; })
      KVD_EXPECT(remote.params().model.low != 0 || remote.params().model.high != 0,
                 "share_prefixes: the remote tier has no model digest (Params::model): pages of different models would meet");
    remote.open(tier::TierGeometry{store_.page_bytes(), static_cast<std::uint32_t>(core_.cfg.shape.layers),
                                   static_cast<std::uint32_t>(core_.cfg.shape.kv_heads)});
    core_.remote = &remote;
  }

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
  PrefixLoad load_prefix(SeqId id, std::int64_t max_tokens, std::int64_t chunk, OnLayer&& on_layer) requires kRemote {
    const auto prefill_chunk = [&](int l, View<const float, 3> k, View<const float, 3> v) { prefill(id, l, k, v); };
    return manager::PrefixLoader<Core>(core_, store_).run(id, max_tokens, chunk, prefill_chunk, on_layer);
  }
  PrefixLoad load_prefix(SeqId id, std::int64_t max_tokens, std::int64_t chunk) requires kRemote {
    return load_prefix(id, max_tokens, chunk, [](int, View<const float, 3>, View<const float, 3>) {});
  }

  // ---- prefill and warm-up -------------------------------------------------------------------

  /// Appends prompt tokens of one layer: k and v are [tokens][kv_heads][head_dim] floats, stored
  /// in the KV dtype. May be called in chunks, before the layer's first attend().
  void prefill(SeqId id, int layer, View<const float, 3> k, View<const float, 3> v) {
    manager::Prefill<Core>(core_, store_).run(id, layer, k, v, [this](const auto& seq, std::span<const manager::SealedPage> seals) {
      manager::publish_prefix_pages(core_, seq, seals);
    });
  }

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
    return manager::WarmUp<Core>(core_, store_).run(id, layer, q_obs, placement);
  }

  // ---- decode --------------------------------------------------------------------------------

  /// One decode step of one layer for a batch of sequences. q and out are
  /// [batch][q_heads][head_dim]; k and v, the new token's, are [batch][kv_heads][head_dim].
  /// The new token is appended and attended. On error nothing changes (Decision 8).
  void attend(int layer, std::span<const SeqId> batch, View<const float, 3> q, View<const float, 3> k, View<const float, 3> v, View<float, 3> out) {
    const manager::StepInputs in = check_step(layer, batch, q, k, v, out);
    manager::Step<Core> step(core_, store_, plans_, in);
    try {
      core_.pipeline.run(step);
    } catch (...) {
      step.abort();
      throw;
    }
    core_.last = step.stats;
    core_.total += step.stats;
    if (core_.growth) manager::grow_window(core_, layer, batch, step.stats.time);
  }

  // ---- tuning --------------------------------------------------------------------------------

  /// Calibrates the pipeline on one step of this batch without applying it: for pipelines with
  /// micro-batches (Elastic), each size in {streams, /2, /4, /8, 1} runs `repeats` dry steps
  /// (select, classify, fetch and compute, then rolled back: nothing changes), the sizes taking
  /// turns round by round so that drift in the machine's speed hits them alike, and the size
  /// with the fastest median is set; a split must beat the whole batch by 10%. Call it after
  /// warm-up, with a representative batch. Arguments as attend().
  TuneReport tune(int layer, std::span<const SeqId> batch, View<const float, 3> q, View<const float, 3> k, View<const float, 3> v, View<float, 3> out,
                  int repeats = 9) {
    KVD_EXPECT(repeats >= 1, "tune: repeats {} must be >= 1", repeats);
    return manager::tune_micro_batch(core_, store_, plans_, check_step(layer, batch, q, k, v, out), repeats);
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
  index::ClusterSizeChoice tune_clusters(SeqId id, int layer, View<const float, 3> q_obs, std::span<const int> sizes = kClusterSizes,
                                         double tolerance = 0.01) requires index::HasClusterSize<Index> {
    return manager::tune_clusters(core_, store_, id, layer, q_obs, sizes, tolerance);
  }

  /// Rebuilds the index of one prefilled layer of a sequence with the index policy's current
  /// parameters (after tune_clusters() on another layer, or a change by hand), from the prompt's
  /// keys (read back from the tiers where they left the fast tier). Before the layer decodes.
  /// On error nothing changes.
  void reindex(SeqId id, int layer) { manager::reindex(core_, store_, id, layer); }

  // ---- cache windows -------------------------------------------------------------------------

  /// Gives each (layer, KV head) its own window W (eviction/window_plan.hpp; the knapsack
  /// allocation in eviction/knapsack.hpp makes one). A stream's cache keeps W x budget pages.
  /// Applies from the next update on; refused for policies whose window is fixed (None, LastStep).
  void set_window_plan(eviction::WindowPlan plan) {
    KVD_EXPECT(!eviction::kHasFixedWindow<Eviction>, "set_window_plan: eviction policy '{}' has a fixed window", Eviction::name());
    plan.validate(core_.cfg.shape);
    core_.plan = std::move(plan);
  }
  /// Back to the policy's own W for every stream.
  void clear_window_plan() { core_.plan.reset(); }

  /// Cache-size tuning during the first decode steps (KVDrive grows the cache during warm-up
  /// until the CPU side of the pipeline matches selection). For `steps` decode steps of each
  /// layer, after every step whose classify + fetch time exceeds its select time (the reads are
  /// the long pole; a larger cache turns misses into hits), the layer's W grows by one for every
  /// KV head, up to `max_window`, if the fast tier has room for one more step's budget of every
  /// stream of the layer, on top of what the caches not yet full to their W will take and a
  /// step's worth of staging. Once the reads fit under selection a
  /// larger cache buys no step time, so W stops there. (Classification here is a page-table
  /// lookup per selected page, so unlike the paper's it does not itself grow with the cache.)
  void grow_windows(WindowGrowth g) {
    KVD_EXPECT(!eviction::kHasFixedWindow<Eviction>, "grow_windows: eviction policy '{}' has a fixed window", Eviction::name());
    KVD_EXPECT(g.max_window >= 0 && g.max_window <= 1024 && g.steps >= 0, "grow_windows: max_window {} must be in 0..1024 and steps {} >= 0",
               g.max_window, g.steps);
    if (!core_.plan) core_.plan = eviction::WindowPlan::uniform(core_.cfg.shape, std::max(0, core_.eviction.default_window()));
    core_.growth_steps.assign(static_cast<std::size_t>(core_.cfg.shape.layers), 0);
    core_.growth_grown.assign(static_cast<std::size_t>(core_.cfg.shape.layers), 0);
    core_.growth = g;
  }
  /// Times W grew, per layer, since grow_windows().
  const std::vector<int>& window_grown() const { return core_.growth_grown; }
  const std::optional<eviction::WindowPlan>& window_plan() const { return core_.plan; }

  /// The window W of a stream: the plan's, else the policy's.
  int window_of(int layer, int head) const {
    core_.check_layer(layer);
    return core_.window_of(layer, head);
  }

  // ---- inspection ----------------------------------------------------------------------------

  const Config& config() const { return core_.cfg; }
  TierList& tiers() { return core_.tiers; }
  const TierList& tiers() const { return core_.tiers; }
  const Index& index_policy() const { return core_.index; }
  const Eviction& eviction_policy() const { return core_.eviction; }
  const Pipeline& pipeline_policy() const { return core_.pipeline; }
  Pipeline& pipeline_policy() { return core_.pipeline; }
  /// Statistics of the last successful attend() and of all of them.
  const Stats& last_stats() const { return core_.last; }
  const Stats& total_stats() const { return core_.total; }
  std::size_t sequences() const { return core_.sequences.size(); }

  /// Host staging pages in use: with a device fast tier, pages read from the backing tiers wait
  /// there for their upload. 0 between calls.
  std::size_t staging_pages() const { return core_.bounce.used(); }

  /// Bytes held by the index over all streams.
  std::size_t index_bytes() const {
    std::size_t total = 0;
    for (const auto& [id, s] : core_.sequences)
      for (const auto& st : s.streams) total += core_.index.bytes(st.index);
    return total;
  }

  /// Pages of one stream currently held in the fast tier's cache (eviction-managed).
  std::size_t cached_pages(SeqId id, int layer, int head) const {
    core_.check_layer(layer);
    return core_.eviction.size(core_.stream(core_.sequences.find(id), layer, head).cache);
  }

  /// The index state of one stream, for inspection (e.g. Hierarchical::cluster_of).
  const typename Index::State& index_state(SeqId id, int layer, int head) const {
    core_.check_layer(layer);
    KVD_EXPECT(head >= 0 && head < core_.cfg.shape.kv_heads, "head {} outside 0..{}", head, core_.cfg.shape.kv_heads - 1);
    return core_.stream(core_.sequences.find(id), layer, head).index;
  }

 private:
  /// A new sequence with its digest and a stream per (layer, KV head).
  auto start_sequence(const std::optional<PrefixDigest>& digest) {
    auto added = core_.sequences.add();
    added.second.digest = digest;
    added.second.streams.resize(static_cast<std::size_t>(core_.cfg.shape.layers) * core_.cfg.shape.kv_heads);
    return added;
  }

  /// attend()'s and tune()'s inputs, checked.
  manager::StepInputs check_step(int layer, std::span<const SeqId> batch, View<const float, 3> q, View<const float, 3> k, View<const float, 3> v,
                                 View<float, 3> out) {
    core_.check_layer(layer);
    manager::check_step_inputs(core_.cfg, batch, q, k, v, out, [this](SeqId id) { core_.sequences.usable(id); });
    return manager::StepInputs{layer, batch, q, k, v, out};
  }

  /// Makes released pages' erases durable where a tier defers them (SsdTier), so their room is
  /// usable; a failed sync leaves them pending, and the store stays correct.
  void sync_erases() noexcept {
    for (std::size_t i = 1; i < TierList::kCount; ++i)
      core_.tiers.visit(i, [](auto& t) {
        if constexpr (requires { t.sync(); }) {
          try {
            t.sync();
          } catch (...) {
          }
        }
      });
  }

  Core core_;
  manager::PageStore<Core> store_{core_};
  std::vector<manager::PlanOf<Core>> plans_;  ///< reused step after step
};

}  // namespace kvdrive
