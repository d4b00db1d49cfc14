// kvd-longbench's configurations and how one runs: every configuration starts from the same
// prefill (a llama::PrefillSnapshot of the dense prompt's K/V) and decodes through its own
// KvManager, so configurations differ only in how decoding attends.
//
//   dense                         every token (index::Dense)
//   INDEX@B                       sparse over DRAM, INDEX at budget B (a fraction of the pages)
//   tiered:hierarchical@B         the same index and budget over a fast DRAM cache + SSD store,
//                                 with lookahead eviction and warm-up placement; by Decision 2
//                                 it must give sparse's tokens exactly
//   hierarchical{K=V;...}@B       Hierarchical with some parameters changed (kHierarchicalKeys),
//                                 to compare variants on the tasks
//   INDEX{carry_share=0}@B        any index with the focus carry changed (kAnyIndexKeys: carry_share,
//                                 carry_mass; Config::carry), e.g. off
//   INDEX{codec_bits=4}@B         any index with cold pages coded (codec_bits 8 or 4: INT8 or
//                                 INT4, Config::cold_codec; 0: none)
//   INDEX{rescore_pool=4}@B       hierarchical, quest or mean-key wrapped by token-level
//                                 rescoring (index::TokenRescore: a first look proposes 4 x B, 4-bit
//                                 key copies keep B; rescore_share=0.5 proposes at least half
//                                 the candidates (the default; 0: pool x B alone);
//                                 rescore_inner=1 takes the pool from the index's own selection
//                                 rather than the key copies' first look (the default, 0);
//                                 rescore_coarse=1 takes it as Hierarchical's best whole clusters;
//                                 rescore_max=1 ranks by the best token,
//                                 rescore_sum=1 sums the heads' estimated masses);
//                                 tiered:hierarchical{rescore_pool=4}@B too
//   INDEX{pin_share=0.25}@B       any index with observation pins (Config::pins: the pages the
//                                 prompt's last 32 queries attended most stay selected)
//   hierarchical{outlier_share=0.125}@B  Hierarchical (or rescored Hierarchical) with ShadowKV's
//                                 outlier pages always selected, within the budget (index::OutlierPages)
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "decoder/decoder.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "app/run.hpp"

namespace kvdrive::longbench {

inline constexpr std::array<std::string_view, 7> kSparseIndices = {"hierarchical", "quest",         "mean-key",   "centroid",
                                                                   "simhash",      "product-quant", "oracle-mass"};

/// Hierarchical's parameters a configuration may set: name, then where it goes.
inline constexpr std::array<std::string_view, 7> kHierarchicalKeys = {"expand",      "min_scored",    "score_all_below",  "pair_radii",
                                                                      "pair_weight", "radius_weight", "pages_per_cluster"};

/// The manager's parameters any index's configuration may set: the focus carry's (Config::carry)
/// and the cold codec's width (Config::cold_codec); and token-level rescoring (index::TokenRescore).
inline constexpr std::array<std::string_view, 11> kAnyIndexKeys = {"carry_share",   "carry_mass",    "codec_bits",     "rescore_pool",
                                                                   "rescore_share", "rescore_inner", "rescore_coarse", "rescore_max",
                                                                   "rescore_sum",   "outlier_share", "pin_share"};

/// The indices that token-level rescoring wraps here (each one more KvManager to compile).
inline constexpr std::array<std::string_view, 3> kRescoredIndices = {"hierarchical", "quest", "mean-key"};

struct ConfigSpec {
  std::string index = "dense";
  double budget = 1.0;
  bool tiered = false;
  std::vector<std::pair<std::string, double>> params;  ///< hierarchical{K=V;...}: parameters changed from the defaults

  std::string name() const {
    if (index == "dense") return "dense";
    std::string p;
    for (const auto& [k, v] : params) p += fmt::format("{}{}={:g}", p.empty() ? "" : ";", k, v);
    return fmt::format("{}{}{}@{:g}", tiered ? "tiered:" : "", index, p.empty() ? "" : "{" + p + "}", budget);
  }
  bool operator==(const ConfigSpec&) const = default;

  /// Sets the observation pins' share (Config::pins; and checks it).
  void apply(ObservationPins& pins) const {
    if (const auto v = value_of("pin_share")) pins.share = static_cast<float>(*v);
    pins.validate();
  }

  /// The value the configuration gives parameter `key` (the last one given), if any.
  std::optional<double> value_of(std::string_view key) const {
    std::optional<double> out;
    for (const auto& [k, v] : params)
      if (k == key) out = v;
    return out;
  }

  /// Sets the focus carry's parameters on a configuration (and checks them).
  void apply(FocusCarry& carry) const {
    for (const auto& [k, v] : params) {
      if (k == "carry_share") carry.share = static_cast<float>(v);
      else if (k == "carry_mass") carry.mass = static_cast<float>(v);
    }
    carry.validate();
  }

  /// The cold codec a configuration names (codec_bits), none by default.
  codec::Codec cold_codec() const {
    codec::Codec c = codec::Codec::none;
    for (const auto& [k, v] : params)
      if (k == "codec_bits") {
        KVD_EXPECT(v == 0 || v == 4 || v == 8, "configuration '{}': codec_bits is {:g}, expected 8, 4 or 0", name(), v);
        c = v == 8 ? codec::Codec::int8 : v == 4 ? codec::Codec::int4 : codec::Codec::none;
      }
    return c;
  }

  /// Whether the configuration wraps its index in token-level rescoring (rescore_pool > 0).
  bool rescored() const { return value_of("rescore_pool").value_or(0.0) > 0; }

  /// Whether the configuration always selects outlier pages (outlier_share > 0).
  bool outliers() const { return value_of("outlier_share").value_or(0.0) > 0; }

  /// Sets the outlier pages' share of the budget (and checks it).
  void apply(index::OutlierPagesParams& o) const {
    if (const auto v = value_of("outlier_share")) o.share = *v;
    o.validate();
  }

  /// Sets the parameters of an index and of every index it wraps.
  template <class Index>
  void apply_all(Index& ix) const {
    if constexpr (std::is_same_v<Index, index::Hierarchical>) apply(ix.params);
    if constexpr (requires { typename Index::InnerIndex; }) {
      apply(ix.params);
      apply_all(ix.inner);
    }
  }

  /// Sets token-level rescoring's parameters (and checks them).
  void apply(index::TokenRescoreParams& r) const {
    if (const auto v = value_of("rescore_pool")) r.pool = *v;
    if (const auto v = value_of("rescore_share")) r.pool_share = *v;
    if (const auto v = value_of("rescore_inner")) r.inner_pool = *v != 0;
    if (const auto v = value_of("rescore_coarse")) r.inner_pool = r.coarse_pool = *v != 0;
    if (const auto v = value_of("rescore_max")) r.max_token = *v != 0;
    if (const auto v = value_of("rescore_sum")) r.sum_mass = *v != 0;
    r.validate();
  }

  /// Sets the parameters on a Hierarchical index (and checks them).
  void apply(index::HierarchicalParams& h) const {
    for (const auto& [k, v] : params) {
      if (k == "expand") h.expand = v;
      else if (k == "min_scored") h.min_scored = v;
      else if (k == "score_all_below") h.score_all_below = static_cast<std::int64_t>(v);
      else if (k == "pair_radii") h.pair_radii = static_cast<int>(v);
      else if (k == "pair_weight") h.pair_weight = static_cast<float>(v);
      else if (k == "radius_weight") h.radius_weight = static_cast<float>(v);
      else if (k == "pages_per_cluster") h.pages_per_cluster = static_cast<int>(v);
    }
    h.validate();
  }
};

/// `text` as a whole number or decimal, or an Error naming `what` in configuration `whole`.
inline double number_in_config(std::string_view whole, std::string_view text, std::string_view what) {
  try {
    std::size_t used = 0;
    const double v = std::stod(std::string(text), &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("configuration '{}': {} is not a number", whole, what));
}

/// "K=V;K=V" of a hierarchical{...} configuration.
inline std::vector<std::pair<std::string, double>> parse_params(std::string_view whole, std::string_view s) {
  std::vector<std::pair<std::string, double>> out;
  while (!s.empty()) {
    const auto end = s.find(';');
    const std::string_view kv = s.substr(0, end);
    const auto eq = kv.find('=');
    KVD_EXPECT(eq != std::string_view::npos, "configuration '{}': '{}' is not KEY=VALUE", whole, kv);
    const std::string key(kv.substr(0, eq));
    KVD_EXPECT(std::find(kHierarchicalKeys.begin(), kHierarchicalKeys.end(), key) != kHierarchicalKeys.end() ||
                   std::find(kAnyIndexKeys.begin(), kAnyIndexKeys.end(), key) != kAnyIndexKeys.end(),
               "configuration '{}': unknown parameter '{}' ({}, {})", whole, key, fmt::join(kHierarchicalKeys, ", "), fmt::join(kAnyIndexKeys, ", "));
    out.emplace_back(key, number_in_config(whole, kv.substr(eq + 1), "the value of " + key));
    if (end == std::string_view::npos) break;
    s.remove_prefix(end + 1);
  }
  return out;
}

/// "dense", "INDEX@BUDGET", "tiered:hierarchical@BUDGET", or hierarchical{K=V;...} in place of
/// hierarchical.
inline ConfigSpec parse_config(std::string_view s) {
  ConfigSpec c;
  if (s == "dense") return c;
  const std::string_view whole = s;
  if (s.starts_with("tiered:")) c.tiered = true, s.remove_prefix(7);
  const auto at = s.find('@');
  KVD_EXPECT(at != std::string_view::npos, "configuration '{}': expected dense, INDEX@BUDGET or tiered:hierarchical@BUDGET", s);
  c.index = std::string(s.substr(0, at));
  if (const auto brace = c.index.find('{'); brace != std::string::npos) {
    KVD_EXPECT(c.index.back() == '}', "configuration '{}': parameters go in braces, as hierarchical{{min_scored=1}}@0.0625", whole);
    c.params = parse_params(whole, std::string_view(c.index).substr(brace + 1, c.index.size() - brace - 2));
    c.index.resize(brace);
    for (const auto& [k, v] : c.params)
      KVD_EXPECT(c.index == "hierarchical" || std::find(kAnyIndexKeys.begin(), kAnyIndexKeys.end(), k) != kAnyIndexKeys.end(),
                 "configuration '{}': only hierarchical takes '{}' (any index takes {})", whole, k, fmt::join(kAnyIndexKeys, ", "));
    FocusCarry carry;
    ObservationPins pins;
    c.apply(pins);
    c.apply(carry);  // refuse values the manager or the index would refuse, before any sample runs
    (void)c.cold_codec();
    if (c.index == "hierarchical") {
      index::HierarchicalParams check;
      c.apply(check);
    }
    if (c.rescored()) {
      index::TokenRescoreParams check;
      c.apply(check);
      KVD_EXPECT(std::find(kRescoredIndices.begin(), kRescoredIndices.end(), c.index) != kRescoredIndices.end(),
                 "configuration '{}': rescore_pool wraps {} here", whole, fmt::join(kRescoredIndices, ", "));
    }
    if (c.outliers()) {
      index::OutlierPagesParams check;
      c.apply(check);
      KVD_EXPECT(c.index == "hierarchical", "configuration '{}': outlier_share wraps hierarchical here", whole);
    }
  }
  KVD_EXPECT(std::find(kSparseIndices.begin(), kSparseIndices.end(), c.index) != kSparseIndices.end(),
             "configuration '{}': unknown index '{}' (hierarchical, quest, mean-key, centroid, simhash, product-quant, oracle-mass)", s, c.index);
  c.budget = number_in_config(s, s.substr(at + 1), "the budget");
  KVD_EXPECT(c.budget > 0 && c.budget <= 1, "configuration '{}': budget outside (0, 1]", s);
  KVD_EXPECT(!c.tiered || c.index == "hierarchical", "configuration '{}': tiered runs the hierarchical index", s);
  KVD_EXPECT(!c.tiered || !c.outliers(), "configuration '{}': tiered runs without outlier_share here", s);
  return c;
}

/// dense; every sparse index at each budget; tiered Hierarchical at each budget.
inline std::vector<ConfigSpec> default_configs(const std::vector<double>& budgets) {
  std::vector<ConfigSpec> out{ConfigSpec{}};
  for (double b : budgets) {
    for (auto ix : kSparseIndices) out.push_back({std::string(ix), b, false, {}});
    out.push_back({"hierarchical", b, true, {}});
  }
  return out;
}

/// What the configurations share: the model, the threads, the KV layout and where SSD stores go.
struct ReplayContext {
  const llama::Model* model = nullptr;
  ThreadPool* pool = nullptr;
  llama::RunOptions layout;  ///< attention (dtype, page/sink/local tokens, prefill chunk), model.threads, tiers (ssd_path, warm_up)
};

/// What one configuration decoded: the tokens, the logits after each step, the decode time.
struct Replay {
  std::vector<int> ids;                    ///< greedy: the generated tokens; forced: the forced ones
  std::vector<std::vector<float>> logits;  ///< after each decode step (the snapshot's logits not included)
  double decode_ms = 0;
  std::int64_t steps = 0;
  double selected_per_stream = 0;  ///< pages the index (with carry and pins) selected per stream and step: the budget used
};

/// How a replay decodes: greedily up to `max_new` tokens (stopping at a stop token), or through
/// `forced` tokens (teacher forcing).
struct ReplayPlan {
  int max_new = 0;
  std::span<const int> stops;
  std::span<const int> forced;
  bool keep_logits = true;
};

namespace detail {

inline int argmax(const std::vector<float>& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

template <class Dec>
Replay decode(Dec& dec, const std::vector<float>& first, const ReplayPlan& p) {
  Replay r;
  const auto t0 = std::chrono::steady_clock::now();
  if (!p.forced.empty()) {
    for (int t : p.forced) {
      r.ids.push_back(t);
      const auto& l = dec.step(t);
      if (p.keep_logits) r.logits.push_back(l);
      ++r.steps;
    }
  } else {
    const std::vector<float>* l = &first;
    for (int s = 0; s < p.max_new; ++s) {
      const int next = argmax(*l);
      if (std::find(p.stops.begin(), p.stops.end(), next) != p.stops.end()) break;
      r.ids.push_back(next);
      if (s + 1 == p.max_new) break;
      l = &dec.step(next);
      if (p.keep_logits) r.logits.push_back(*l);
      ++r.steps;
    }
  }
  r.decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

template <class Index, class TierList>
Replay replay(const ReplayContext& cx, const ConfigSpec& c, const llama::PrefillSnapshot& snap, const ReplayPlan& p) {
  llama::RunOptions o = cx.layout;
  o.attention.budget = c.budget;
  c.apply(o.attention.carry);
  c.apply(o.attention.pins);
  o.attention.cold_codec = std::string(codec::codec_name(c.cold_codec()));
  const Config cfg = llama::manager_config(o, cx.model->config);
  const std::int64_t context = snap.tokens + std::max<std::int64_t>(p.max_new, static_cast<std::int64_t>(p.forced.size()));
  llama::TierPlan plan;
  if constexpr (TierList::kCount > 1) {
    // A cache of window 3 beside sink, local and staging: most selected pages come from it, the
    // rest from the SSD.
    const llama::FastTierNeed need = llama::fast_tier_need(o.attention.prefill_chunk, cfg, context);
    o.tiers.fast_bytes = static_cast<std::int64_t>((need.pages + 3 * need.streams * need.budget) * cfg.page_bytes());
    plan = llama::plan_tiers(o, cfg, context);
  }
  using Manager = KvManager<Index, eviction::Lookahead, TierList>;
  Index ix = llama::index_for<Index>(cx.model->config);
  c.apply_all(ix);
  Replay r = [&] {  // the manager (and its store) closes at the end of this, so the store can go after it
    Manager kv(cfg, std::move(ix), eviction::Lookahead{plan.window}, llama::make_tiers<TierList>(o.tiers, plan), {}, backend::Cpu(*cx.pool));
    llama::Decoder<Manager> dec(*cx.model, kv, *cx.pool, snap.chunk);
    // Tiered: placement; either mode: the observation pins' ranking (KvManager::warm_up).
    if (TierList::kCount > 1 || cfg.pins.enabled())
      dec.warm_up_after_prefill(static_cast<int>(std::min<std::int64_t>(o.tiers.warm_up, snap.observed)));
    const std::vector<float>& first = dec.prefill_from(snap);
    Replay out = decode(dec, first, p);
    const Stats& t = kv.total_stats();
    out.selected_per_stream = t.streams ? static_cast<double>(t.selected) / static_cast<double>(t.streams) : 0.0;
    return out;
  }();
  if constexpr (TierList::kCount > 1) tier::SsdTier::remove_files(o.tiers.ssd_path);
  return r;
}

}  // namespace detail

/// Runs configuration `c` from `snap` as `p` says.
inline Replay replay(const ReplayContext& cx, const ConfigSpec& c, const llama::PrefillSnapshot& snap, const ReplayPlan& p) {
  using Dram = Tiers<tier::HostTier>;
  using Ssd = Tiers<tier::HostTier, tier::SsdTier>;
  using Rescored = index::TokenRescore<index::Hierarchical>;
  if (c.outliers()) {
    if (c.rescored()) return detail::replay<index::OutlierPages<Rescored>, Dram>(cx, c, snap, p);
    return detail::replay<index::OutlierPages<index::Hierarchical>, Dram>(cx, c, snap, p);
  }
  if (c.tiered && c.rescored()) return detail::replay<Rescored, Ssd>(cx, c, snap, p);
  if (c.tiered) return detail::replay<index::Hierarchical, Ssd>(cx, c, snap, p);
  if (c.rescored()) {
    if (c.index == "quest") return detail::replay<index::TokenRescore<index::Quest>, Dram>(cx, c, snap, p);
    if (c.index == "mean-key") return detail::replay<index::TokenRescore<index::MeanKey>, Dram>(cx, c, snap, p);
    return detail::replay<Rescored, Dram>(cx, c, snap, p);
  }
  if (c.index == "dense") return detail::replay<index::Dense, Dram>(cx, c, snap, p);
  if (c.index == "hierarchical") return detail::replay<index::Hierarchical, Dram>(cx, c, snap, p);
  if (c.index == "quest") return detail::replay<index::Quest, Dram>(cx, c, snap, p);
  if (c.index == "mean-key") return detail::replay<index::MeanKey, Dram>(cx, c, snap, p);
  if (c.index == "centroid") return detail::replay<index::Centroid, Dram>(cx, c, snap, p);
  if (c.index == "simhash") return detail::replay<index::SimHash, Dram>(cx, c, snap, p);
  if (c.index == "product-quant") return detail::replay<index::ProductQuant, Dram>(cx, c, snap, p);
  KVD_EXPECT(c.index == "oracle-mass", "configuration {}: unknown index", c.name());
  return detail::replay<index::OracleMass, Dram>(cx, c, snap, p);
}

/// Whether two replays' logits are the same bits at every step.
inline bool same_bits(const Replay& a, const Replay& b) {
  if (a.ids != b.ids || a.logits.size() != b.logits.size()) return false;
  for (std::size_t i = 0; i < a.logits.size(); ++i)
    if (a.logits[i].size() != b.logits[i].size() || std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

/// The first `tokens` tokens of a snapshot: the same K/V a prefill of those tokens gives (a
/// token's K/V depend only on the tokens before it), without warm-up queries; `logits` stand for
/// the prefill's last logits (only a greedy replay reads them).
inline llama::PrefillSnapshot truncate(const llama::PrefillSnapshot& s, std::int64_t tokens, std::vector<float> logits) {
  KVD_EXPECT(tokens > 0 && tokens <= s.tokens, "truncate: {} tokens of a {}-token snapshot", tokens, s.tokens);
  llama::PrefillSnapshot t;
  t.dtype = s.dtype;
  t.tokens = tokens;
  t.chunk = s.chunk;
  t.k.resize(s.k.size());
  t.v.resize(s.v.size());
  for (std::size_t l = 0; l < s.k.size(); ++l) {
    const std::size_t row = s.k[l].size() / static_cast<std::size_t>(s.tokens);
    t.k[l].assign(s.k[l].begin(), s.k[l].begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(tokens)));
    t.v[l].assign(s.v[l].begin(), s.v[l].begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(tokens)));
  }
  t.logits = std::move(logits);
  return t;
}

}  // namespace kvdrive::longbench
