// Tiers<Fast, Backing...>: the storage hierarchy of a KvManager. The first tier is the fast tier
// (a slot pool that holds sink, local, tail and cached pages); the rest are backing stores in
// order of preference, each with its own capacity. The last tier keeps every sealed page; the
// middle tiers hold copies of the pages most likely to be needed: placement
// (KvManager::warm_up) copies each layer's next-best prompt pages into them, and pages sealed
// while decoding are copied to the first one with room. A page is read from the nearest tier
// that holds it. With no backing tier, pages stay in the fast tier for their whole life.
#pragma once

#include <cstddef>
#include <tuple>
#include <utility>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/stats.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive {

template <tier::FastTier Fast, tier::StorageTier... Backing>
class Tiers {
 public:
  static constexpr std::size_t kCount = 1 + sizeof...(Backing);
  template <std::size_t I>
  using Type = std::tuple_element_t<I, std::tuple<Fast, Backing...>>;
  static_assert(kCount <= kMaxTiers, "Tiers: too many tiers (see kMaxTiers)");
  static_assert(!(tier::RemoteTier<Fast> || ... || tier::RemoteTier<Backing>),
                "Tiers: a remote tier (tier::RedisTier) is not a decode tier: it must never hold the only copy of a page, nor "
                "stop decoding when its server fails; give it to KvManager::share_prefixes (docs/remote.md)");

  Tiers() = default;
  explicit Tiers(Fast fast, Backing... backing) : tiers_(std::move(fast), std::move(backing)...) {}

  template <std::size_t I>
  auto& get() {
    return std::get<I>(tiers_);
  }
  template <std::size_t I>
  const auto& get() const {
    return std::get<I>(tiers_);
  }
  Fast& fast() { return std::get<0>(tiers_); }

  /// Calls f(tier) for the tier at run-time index i.
  template <class F>
  decltype(auto) visit(std::size_t i, F&& f) {
    return visit_impl(i, f, std::make_index_sequence<kCount>{});
  }

  /// Is the tier at index i addressable (attended in place)?
  static constexpr bool addressable(std::size_t i) {
    constexpr bool flags[] = {Fast::kAddressable, Backing::kAddressable...};
    return flags[i];
  }

  void open(const tier::TierGeometry& g) {
    std::apply([&](auto&... t) { (t.open(g), ...); }, tiers_);
  }
  /// Opens the fast tier with one geometry and the backing tiers with another (pages stored
  /// coded, Config::cold_codec, are smaller there).
  void open(const tier::TierGeometry& fast, const tier::TierGeometry& backing) {
    std::apply(
        [&](auto& f, auto&... t) {
          f.open(fast);
          (t.open(backing), ...);
        },
        tiers_);
  }

 private:
  template <class F, std::size_t... I>
  decltype(auto) visit_impl(std::size_t i, F& f, std::index_sequence<I...>) {
    using R = decltype(f(std::get<0>(tiers_)));
    if constexpr (std::is_void_v<R>) {
      ((i == I ? (f(std::get<I>(tiers_)), true) : false) || ...);
    } else {
      R r{};
      ((i == I ? (r = f(std::get<I>(tiers_)), true) : false) || ...);
      return r;
    }
  }

  std::tuple<Fast, Backing...> tiers_;
};

}  // namespace kvdrive
