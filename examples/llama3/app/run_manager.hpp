// The KvManager a kvd-llama run builds from its options: its configuration, its index (with the
// parameters that depend on the model), and in tiered mode the tiers' sizes (TierPlan), the
// tiers themselves and the decoder's warm-up and tuning.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "model/model.hpp"
#include "app/run_options.hpp"
#include "app/summary.hpp"  // kGrowWindowTo, kGrowSteps

namespace kvdrive::llama {

/// The rescoring pool the run uses (AttentionOptions::rescore_pool with its default resolved): 0 for none.
inline double rescore_pool_of(const AttentionOptions& o) {
  if (o.rescore_pool >= 0) return o.rescore_pool;
  return o.index == "hierarchical" && o.mode != "dense" ? index::TokenRescoreParams{}.pool : 0.0;
}

/// The KvManager's configuration for the run's attention options (the pins check --warm-up).
inline Config manager_config(const RunOptions& o, const LlamaConfig& c) {
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.page_tokens = o.attention.page_tokens;
  cfg.sink_tokens = o.attention.sink_tokens;
  cfg.local_tokens = o.attention.local_tokens;
  cfg.dtype = o.attention.dtype == "f32" ? DType::f32 : o.attention.dtype == "bf16" ? DType::bf16 : DType::f16;
  cfg.budget = Budget::fraction(o.attention.budget);
  cfg.carry = o.attention.carry;
  cfg.carry.validate();
  cfg.pins = o.attention.pins;
  KVD_EXPECT(!o.attention.pins.enabled() || o.tiers.warm_up > 0,
             "observation pins rank pages by the prompt's last --warm-up queries: --warm-up must be > 0");
  cfg.pins.validate();
  cfg.cold_codec = {codec::parse_codec(o.attention.cold_codec)};
  return cfg;
}

/// The run's index, with the parameters that depend on the model set from it: Hierarchical's
/// pair radii are taken over the channel pairs the model's RoPE rotates together (adjacent
/// channels in GGUF and llama2.c files, the two halves of the head in Hugging Face checkpoints).
/// A wrapper (TokenRescore, OutlierPages) wraps its inner index made so; TokenRescore takes the
/// pool given (> 0) or its default.
/// Other indices are default-constructed.
template <class Index>
Index index_for(const LlamaConfig& c, double rescore_pool = 0) {
  if constexpr (requires { typename Index::InnerIndex; }) {
    typename Index::Params p;
    if constexpr (requires { p.pool; })
      if (rescore_pool > 0) p.pool = rescore_pool;
    if constexpr (requires { p.rotary = index::RotaryPairs::adjacent; })
      p.rotary = c.rope_layout == RopeLayout::half ? index::RotaryPairs::halves : index::RotaryPairs::adjacent;
    return Index(index_for<typename Index::InnerIndex>(c, rescore_pool), p);
  } else if constexpr (requires(typename Index::Params p) { p.rotary = index::RotaryPairs::adjacent; }) {
    typename Index::Params p;
    p.rotary = c.rope_layout == RopeLayout::half ? index::RotaryPairs::halves : index::RotaryPairs::adjacent;
    return Index(p);
  } else {
    return Index{};
  }
}

/// Tiered mode: fast-tier DRAM for sink, local, staging and the lookahead cache, then an
/// optional DRAM tier, then the SSD store. Sized for the run's longest context.
struct TierPlan {
  std::size_t fast_pages = 0, host_pages = 0;
  std::size_t host_alignment = 4096;  ///< the host tier's slot alignment: 64 for coded pages (packed tighter)
  int window = 3;
};

/// Bytes of the host tier's slot for one page: a coded page (--cold-codec) rounded to 64 bytes,
/// else the page in the KV dtype.
inline std::size_t host_slot_bytes(const Config& cfg) {
  if (!cfg.cold_codec.coded()) return cfg.page_bytes();
  return (cfg.stored_page_bytes() + 63) / 64 * 64;
}

/// The fast tier's least pages for `sequences` sequences of `context` tokens: per stream sink,
/// local and tail, and a step's misses staged; plus one layer's prefill chunk. A lookahead cache
/// of window W needs W x budget() more pages per stream.
struct FastTierNeed {
  std::size_t pages = 0;    ///< without a cache
  std::size_t streams = 0;  ///< (layer, KV head, sequence) streams
  std::size_t budget = 0;   ///< pages a stream selects per step
};

inline FastTierNeed fast_tier_need(int prefill_chunk, const Config& cfg, std::int64_t context, std::size_t sequences = 1) {
  FastTierNeed n;
  n.streams = static_cast<std::size_t>(cfg.shape.layers) * cfg.shape.kv_heads * sequences;
  const PageRanges r = page_ranges(context + 1, cfg.page_tokens, cfg.sink_tokens, cfg.local_tokens);
  n.budget = static_cast<std::size_t>(cfg.budget.pages_for(r.candidates()));
  n.pages = n.streams * (static_cast<std::size_t>(eviction::resident_pages(cfg, context)) + n.budget) +
            static_cast<std::size_t>(cfg.shape.kv_heads) * static_cast<std::size_t>((prefill_chunk + cfg.page_tokens - 1) / cfg.page_tokens + 1);
  return n;
}

inline TierPlan plan_tiers(const RunOptions& o, const Config& cfg, std::int64_t context, std::size_t sequences = 1) {
  const FastTierNeed n = fast_tier_need(o.attention.prefill_chunk, cfg, context, sequences);
  const std::size_t need = n.pages, streams = n.streams, budget = n.budget;
  TierPlan p;
  p.fast_pages = static_cast<std::size_t>(o.tiers.fast_bytes) / cfg.page_bytes();
  KVD_EXPECT(p.fast_pages >= need,
             "--fast-bytes {}: the fast tier needs at least {} bytes ({} pages of {} bytes: sink, local and staging for {} streams "
             "at {} tokens, and a prefill chunk)",
             o.tiers.fast_bytes, need * cfg.page_bytes(), need, cfg.page_bytes(), streams, context);
  p.window = budget ? static_cast<int>(std::min<std::size_t>(8, (p.fast_pages - need) / (streams * budget))) : 8;
  p.host_pages = static_cast<std::size_t>(o.tiers.host_bytes) / host_slot_bytes(cfg);
  if (cfg.cold_codec.coded()) p.host_alignment = 64;  // the host tier only memcpys: no direct I/O into it
  return p;
}

template <class TierList>
TierList make_tiers(const TierOptions& o, const TierPlan& p) {
  if constexpr (TierList::kCount == 1) {
    return TierList{};
  } else {
    tier::SsdTier::Params sp;
    sp.path = o.ssd_path;
    sp.mode = tier::SsdOpen::recreate;  // a fresh store per run, under its lock, never over a file that is not a store
    sp.pack_pages = o.ssd_pack;
    using Fast = typename TierList::template Type<0>;  // HostTier, or cuda::DeviceTier
    Fast fast(typename Fast::Params{p.fast_pages});
    if constexpr (TierList::kCount == 2) return TierList(std::move(fast), tier::SsdTier(sp));
    else return TierList(std::move(fast), tier::HostTier(tier::HostTier::Params{p.host_pages, p.host_alignment}), tier::SsdTier(sp));
  }
}

/// Tiered runs: placement after prefill from --warm-up queries; with --tune on the cache windows
/// and the micro-batch, tuned (what is selected stays sparse's); with --tune-clusters on the
/// index's cluster size too (which changes what is selected).
template <class Index, class Pipeline, class Manager, class Dec>
void set_up_tiered(const TierOptions& o, const TierPlan& plan, Manager& kv, Dec& decoder) {
  decoder.warm_up_after_prefill(o.warm_up);
  if (o.tune_clusters) {
    KVD_EXPECT(o.warm_up > 0, "--tune-clusters chooses from the --warm-up queries: give --warm-up > 0");
    if constexpr (index::HasClusterSize<Index>) decoder.tune_clusters();
    else fail("--tune-clusters: the {} index has no cluster size to tune (hierarchical without rescoring has: --rescore-pool 0)", Index::name());
  }
  if (o.tune != "on") return;
  kv.grow_windows({std::max(plan.window, kGrowWindowTo), kGrowSteps});
  if constexpr (!std::is_same_v<Pipeline, pipeline::Serial>) decoder.tune_pipeline();
}

}  // namespace kvdrive::llama
